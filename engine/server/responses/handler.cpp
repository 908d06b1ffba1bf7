// POST /v1/responses, GET and DELETE /v1/responses/{id}. A response runs as a chat completion through
// the chat handler (the chat template, the same engine job, admission, KV transfer and aborts): the
// request is translated into a chat body (api/responses.cpp), and a ResponseWriter in front of the
// client's turns the chat answer into the Responses API's (responses/translate.h) and stores it.
#include <boost/json.hpp>
#include <chrono>

#include "engine/server/api/request.h"
#include "engine/server/api/responses.h"
#include "engine/server/replica.h"
#include "engine/server/responses/store.h"
#include "engine/server/responses/translate.h"
#include "kvfleet/http/json_error.h"
#include "kvfleet/responses_input.h"

namespace kvfleet::server {
namespace json = boost::json;
using boost::asio::awaitable;

namespace {

constexpr std::string_view kByIdPrefix = "/v1/responses/";

// The client's writer as the chat handler sees it: the chat answer (one JSON body, or its SSE stream)
// goes out as the Responses API's, and the finished response goes into the store.
class ResponsesWriter final : public http::ResponseWriter {
 public:
  ResponsesWriter(http::ResponseWriter& client, ResponseShell shell, ResponseStore* store, json::array conversation)
      : client_(client), shell_(shell), events_(std::move(shell)), store_(store), conversation_(std::move(conversation)) {}

  awaitable<bool> send(http::Response r) override {
    if (r.status != 200) co_return co_await client_.send(std::move(r));
    json::error_code ec;
    const json::value chat = json::parse(r.body, ec);
    if (ec || !chat.is_object()) throw std::runtime_error("the chat answer is not a JSON object");
    json::object response = response_from_chat(shell_, chat.as_object());
    keep(response);
    http::Response out = http::json_response(200, response);
    if (const std::string* rank = r.headers.find("x-kvfleet-dp-rank")) out.headers.set("x-kvfleet-dp-rank", *rank);
    name_response(out.headers);
    const bool sent = co_await client_.send(std::move(out));
    co_return sent;
  }

  awaitable<bool> begin_stream(int status, http::Headers headers) override {
    name_response(headers);
    // (Arguments built before each co_await: GCC 12 mishandles temporaries inside co_await expressions.)
    const bool began = co_await client_.begin_stream(status, std::move(headers));
    if (!began) co_return false;
    const std::string opening = events_.begin();
    const bool sent = co_await client_.write(opening);
    co_return sent;
  }

  // One write of the chat stream: one or more `data: ...` events.
  awaitable<bool> write(std::string_view piece) override {
    std::string out;
    for (std::size_t at = 0; at < piece.size();) {
      std::size_t end = piece.find("\n\n", at);
      if (end == std::string_view::npos) end = piece.size();
      std::string_view line = piece.substr(at, end - at);
      at = end + 2;
      if (line.rfind("data: ", 0) != 0) continue;
      line.remove_prefix(6);
      if (line == "[DONE]") {
        out += events_.finish();
        keep(events_.final_response());
        continue;
      }
      json::error_code ec;
      const json::value chunk = json::parse(line, ec);
      if (!ec && chunk.is_object()) out += events_.on_chunk(chunk.as_object());
    }
    if (out.empty()) co_return true;
    const bool sent = co_await client_.write(out);
    co_return sent;
  }

  awaitable<bool> finish() override {
    const bool done = co_await client_.finish();
    co_return done;
  }
  bool client_gone() const override { return client_.client_gone(); }
  void on_disconnect(std::function<void()> callback) override { client_.on_disconnect(std::move(callback)); }
  bool started() const override { return client_.started(); }

 private:
  // A stored response's id, by which a router sends a follow-up to the replica that stored it.
  void name_response(http::Headers& headers) const {
    if (store_) headers.set("x-kvfleet-response-id", shell_.id);
  }

  void keep(const json::object& response) {
    if (!store_) return;
    StoredResponse entry{response, conversation_};
    if (const json::value* output = response.if_contains("output"); output && output->is_array())
      for (const auto& item : output->as_array()) entry.conversation.push_back(item);
    store_->put(shell_.id, std::move(entry));
  }

  http::ResponseWriter& client_;
  const ResponseShell shell_;
  ResponsesEventStream events_;
  ResponseStore* store_;      // null: store false
  json::array conversation_;  // the input items (a previous response's conversation first)
};

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ApiError response_not_found(std::string_view id) {
  return ApiError(404, "Response with id '" + std::string(id) + "' not found.", "invalid_request_error");
}

}  // namespace

// The input items with every item_reference replaced by the stored item it names.
json::array Replica::resolve_references(const json::array& items) {
  json::array out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const json::object* item = items[i].if_object();
    const json::value* type = item ? item->if_contains("type") : nullptr;
    if (!type || !type->is_string() || type->as_string() != "item_reference") {
      out.push_back(items[i]);
      continue;
    }
    const std::string at = "input[" + std::to_string(i) + "].id";
    const json::value* id = item->if_contains("id");
    if (!id || !id->is_string()) throw bad_request("'" + at + "' must be a string", at);
    std::optional<json::object> target = responses_store_->find_item(id->as_string());
    if (!target) throw bad_request("no stored item with id '" + std::string(id->as_string()) + "' (item_reference)", at);
    out.push_back(std::move(*target));
  }
  return out;
}

// truncation "auto": the oldest turns go (never the instructions) until the prompt leaves room for one
// output token, or max_output_tokens when given; a turn starts at a user message.
void Replica::truncate_to_fit(json::array& messages, const json::object& chat) const {
  const json::value* max = chat.if_contains("max_tokens");
  const std::int64_t room = engine_->max_model_len() - (max ? max->as_int64() : 1);
  ChatRequest probe;
  if (const json::value* tools = chat.if_contains("tools")) probe.tools = *tools;
  const auto role = [&](std::size_t i) { return std::string_view(messages[i].as_object().at("role").as_string()); };
  const std::size_t first = !messages.empty() && role(0) == "system" ? 1 : 0;
  for (;;) {
    probe.messages = messages;
    if (static_cast<std::int64_t>(chat_prompt(probe).size()) <= room || messages.size() <= first + 1) return;
    messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(first));
    while (messages.size() > first + 1 && role(first) != "user")
      messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(first));
  }
}

awaitable<void> Replica::responses(const http::Request& req, http::ResponseWriter& w) {
  trace::Span span = start_request_span(req, "chat");  // the chat job's phases go under it
  const SpanEnd end_span_guard{*this, span};
  // Function tools: tool_choice auto needs the flags, required and named the grammar engine (the chat path
  // says which is missing).
  const bool calls = (config_.enable_auto_tool_choice && tool_parser_) || grammar_compiler_;
  ResponsesRequest r = parse_responses_request(
      parse_json_body(req.body), {.tool_calls = calls, .structured_outputs = static_cast<bool>(grammar_compiler_)});
  check_model(r.model);
  json::array conversation;  // the items this response continues from, then its own input
  json::array messages;
  if (r.instructions) messages.push_back(json::object{{"role", "system"}, {"content", *r.instructions}});
  if (r.previous_response_id) {
    const auto previous = responses_store_->get(*r.previous_response_id);
    if (!previous)
      throw ApiError(400, "Previous response with id '" + *r.previous_response_id + "' not found.",
                     "invalid_request_error", "previous_response_id", "previous_response_not_found");
    conversation = previous->conversation;
    append_responses_messages(conversation, "previous_response_id", nullptr, messages);  // validated when stored
  }
  json::array input = resolve_references(r.input);
  try {
    append_responses_messages(input, "input", nullptr, messages);
  } catch (const ContentPartError& e) {
    throw bad_request(e.what(), e.param);
  }
  for (auto& item : input) conversation.push_back(std::move(item));
  if (r.truncate) {
    try {
      truncate_to_fit(messages, r.chat);
    } catch (const TemplateError& e) {
      throw ApiError(400, e.what(), "invalid_request_error", "input");
    }
  }
  r.chat["messages"] = std::move(messages);
  http::Request chat_request;
  chat_request.method = req.method;
  chat_request.target = "/v1/chat/completions";
  chat_request.headers = req.headers;
  chat_request.body = json::serialize(r.chat);
  ResponseShell shell{responses_id("resp_"), unix_now(), name_, std::move(r.echo)};
  const std::string id = shell.id;
  ResponsesWriter out(w, std::move(shell), r.store ? responses_store_.get() : nullptr, std::move(conversation));
  std::optional<ApiError> error;  // the chat path's error, under the Responses request's field names
  try {
    co_await run_chat(chat_request, out, span);
    span.set("gen_ai.response.id", id);  // the response's id, not the chat completion's it ran as
  } catch (const ApiError& e) {
    if (w.started()) throw;
    error.emplace(e.status, e.what(), e.type, responses_param(e.param), e.code);
  } catch (const TemplateError& e) {
    if (w.started()) throw;
    error.emplace(400, e.what(), "invalid_request_error", "input");
  }
  if (error) throw *error;
}

awaitable<void> Replica::response_by_id(const http::Request& req, http::ResponseWriter& w) {
  const std::string_view id = req.path().substr(kByIdPrefix.size());
  if (id.find('/') != std::string_view::npos)
    throw ApiError(404, "no route for " + std::string(req.path()), "not_found_error");
  if (req.method == "DELETE") {
    if (!responses_store_->erase(id)) throw response_not_found(id);
    http::Response r = http::json_response(200, json::object{{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
    co_await w.send(std::move(r));
    co_return;
  }
  for (const char* key : {"stream", "starting_after"})
    if (req.query_param(key)) throw bad_request("'" + std::string(key) + "' is not supported: responses are not resumable", key);
  const auto stored = responses_store_->get(id);
  if (!stored) throw response_not_found(id);
  http::Response r = http::json_response(200, stored->response);
  co_await w.send(std::move(r));
}

void Replica::add_responses_routes(http::HttpRouter& r) {
  r.post("/v1/responses", guarded(&Replica::responses));
  r.add_prefix("GET", std::string(kByIdPrefix), guarded(&Replica::response_by_id));
  r.add_prefix("DELETE", std::string(kByIdPrefix), guarded(&Replica::response_by_id));
}

}  // namespace kvfleet::server
