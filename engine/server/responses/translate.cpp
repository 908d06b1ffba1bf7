#include "engine/server/responses/translate.h"

#include <boost/json.hpp>
#include <cstdio>
#include <random>

namespace kvfleet::server {
namespace json = boost::json;

std::string responses_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%016llx%016llx", prefix, static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

std::string output_item_id(const char* prefix, const std::string& response_id, std::size_t output_index) {
  const std::size_t cut = response_id.find('_');
  return prefix + response_id.substr(cut == std::string::npos ? 0 : cut + 1) + "_" + std::to_string(output_index);
}

namespace {

json::value usage_from_chat(const json::value* usage) {
  if (!usage || !usage->is_object()) return nullptr;
  const json::object& u = usage->as_object();
  const auto number = [](const json::value* v) { return v && v->is_int64() ? v->as_int64() : std::int64_t{0}; };
  std::int64_t cached = 0;
  if (const json::value* d = u.if_contains("prompt_tokens_details"); d && d->is_object())
    cached = number(d->as_object().if_contains("cached_tokens"));
  const std::int64_t in = number(u.if_contains("prompt_tokens")), out = number(u.if_contains("completion_tokens"));
  return json::object{{"input_tokens", in},
                      {"input_tokens_details", json::object{{"cached_tokens", cached}}},
                      {"output_tokens", out},
                      {"output_tokens_details", json::object{{"reasoning_tokens", 0}}},
                      {"total_tokens", in + out}};
}

// The chat finish reason as the response's status and incomplete_details.
const char* status_of(std::string_view finish_reason) {
  if (finish_reason == "length") return "incomplete";
  if (finish_reason == "abort") return "cancelled";
  return "completed";
}

json::value incomplete_of(std::string_view finish_reason) {
  if (finish_reason == "length") return json::object{{"reason", "max_output_tokens"}};
  return nullptr;
}

json::object output_text(std::string text) {
  return {{"type", "output_text"}, {"text", std::move(text)}, {"annotations", json::array{}}, {"logprobs", json::array{}}};
}

json::object message_item(const std::string& id, const char* status, json::array content) {
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}

// The reasoning (the chat answer's reasoning_content) as both the item's content (reasoning_text, as
// vLLM gives it) and its summary (summary_text, what the AI SDK reads): the same text in each.
json::object reasoning_item(const std::string& id, const char* status, const std::string* text) {
  json::array summary, content;
  if (text) {
    summary.push_back(json::object{{"type", "summary_text"}, {"text", *text}});
    content.push_back(json::object{{"type", "reasoning_text"}, {"text", *text}});
  }
  return {{"id", id}, {"type", "reasoning"}, {"status", status}, {"summary", std::move(summary)},
          {"content", std::move(content)}, {"encrypted_content", nullptr}};
}

json::object call_item(const std::string& id, const char* status, const std::string& call_id, const std::string& name,
                       const std::string& arguments) {
  return {{"id", id}, {"type", "function_call"}, {"status", status},
          {"call_id", call_id}, {"name", name}, {"arguments", arguments}};
}

std::string string_at(const json::object& o, const char* key) {
  const json::value* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

}  // namespace

json::object response_object(const ResponseShell& shell, const char* status, json::array output, json::value usage,
                             json::value incomplete_details, json::value error) {
  json::object r{{"id", shell.id}, {"object", "response"}, {"created_at", shell.created_at}, {"status", status},
                 {"error", std::move(error)}, {"incomplete_details", std::move(incomplete_details)},
                 {"model", shell.model}, {"output", std::move(output)}, {"usage", std::move(usage)}};
  for (const auto& [key, value] : shell.echo) r[key] = value;
  return r;
}

json::object response_from_chat(const ResponseShell& shell, const json::object& completion) {
  const json::object& choice = completion.at("choices").as_array().at(0).as_object();
  const json::object& message = choice.at("message").as_object();
  const std::string finish = string_at(choice, "finish_reason");
  const char* item_status = finish == "length" ? "incomplete" : "completed";
  json::array output;
  const json::value* calls = message.if_contains("tool_calls");
  const bool has_calls = calls && calls->is_array() && !calls->as_array().empty();
  const std::string text = string_at(message, "content");
  if (const std::string reasoning = string_at(message, "reasoning_content"); !reasoning.empty())
    output.push_back(reasoning_item(output_item_id("rs_", shell.id, 0), item_status, &reasoning));
  if (!text.empty() || (!has_calls && output.empty()))
    output.push_back(message_item(output_item_id("msg_", shell.id, output.size()), item_status,
                                  json::array{output_text(text)}));
  for (std::size_t i = 0; has_calls && i < calls->as_array().size(); ++i) {
    const json::object& call = calls->as_array()[i].as_object();
    const json::object& fn = call.at("function").as_object();
    output.push_back(call_item(output_item_id("fc_", shell.id, output.size()), item_status, string_at(call, "id"),
                               string_at(fn, "name"), string_at(fn, "arguments")));
  }
  return response_object(shell, status_of(finish), std::move(output), usage_from_chat(completion.if_contains("usage")),
                         incomplete_of(finish));
}

std::string ResponsesEventStream::event(const char* type, json::object fields) {
  json::object e{{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [key, value] : fields) e[key] = std::move(value);
  return std::string("event: ") + type + "\ndata: " + json::serialize(e) + "\n\n";
}

std::string ResponsesEventStream::begin() {
  const json::object r = response_object(shell_, "in_progress", {}, nullptr);
  std::string out = event("response.created", {{"response", r}});  // (statements: events are numbered in order)
  out += event("response.in_progress", {{"response", r}});
  return out;
}

std::string ResponsesEventStream::open_reasoning() {
  reasoning_index_ = output_.size();
  reasoning_id_ = output_item_id("rs_", shell_.id, *reasoning_index_);
  const auto index = *reasoning_index_;
  std::string out = event("response.output_item.added",
                          {{"output_index", index}, {"item", reasoning_item(reasoning_id_, "in_progress", nullptr)}});
  out += event("response.reasoning_summary_part.added",
               {{"item_id", reasoning_id_}, {"output_index", index}, {"summary_index", 0},
                {"part", json::object{{"type", "summary_text"}, {"text", ""}}}});
  out += event("response.content_part.added", {{"item_id", reasoning_id_}, {"output_index", index}, {"content_index", 0},
                                               {"part", json::object{{"type", "reasoning_text"}, {"text", ""}}}});
  return out;
}

std::string ResponsesEventStream::on_reasoning(const std::string& piece) {
  std::string out;
  if (!reasoning_index_) {
    out += close_message();
    out += close_calls();
    out += open_reasoning();
  }
  const auto index = *reasoning_index_;
  reasoning_ += piece;
  out += event("response.reasoning_summary_text.delta",
               {{"item_id", reasoning_id_}, {"output_index", index}, {"summary_index", 0}, {"delta", piece}});
  out += event("response.reasoning_text.delta",
               {{"item_id", reasoning_id_}, {"output_index", index}, {"content_index", 0}, {"delta", piece}});
  return out;
}

std::string ResponsesEventStream::close_reasoning() {
  if (!reasoning_index_) return {};
  const auto index = *reasoning_index_;
  const char* status = finish_reason_ == "length" ? "incomplete" : "completed";
  json::object item = reasoning_item(reasoning_id_, status, &reasoning_);
  std::string out = event("response.reasoning_text.done",
                          {{"item_id", reasoning_id_}, {"output_index", index}, {"content_index", 0}, {"text", reasoning_}});
  out += event("response.content_part.done", {{"item_id", reasoning_id_}, {"output_index", index}, {"content_index", 0},
                                              {"part", json::object{{"type", "reasoning_text"}, {"text", reasoning_}}}});
  out += event("response.reasoning_summary_text.done",
               {{"item_id", reasoning_id_}, {"output_index", index}, {"summary_index", 0}, {"text", reasoning_}});
  out += event("response.reasoning_summary_part.done",
               {{"item_id", reasoning_id_}, {"output_index", index}, {"summary_index", 0},
                {"part", json::object{{"type", "summary_text"}, {"text", reasoning_}}}});
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  reasoning_index_.reset();
  reasoning_.clear();
  return out;
}

std::string ResponsesEventStream::open_message() {
  std::string out = close_reasoning();
  message_index_ = output_.size();
  message_id_ = output_item_id("msg_", shell_.id, *message_index_);
  const auto index = *message_index_;
  out += event("response.output_item.added",
               {{"output_index", index}, {"item", message_item(message_id_, "in_progress", {})}});
  out += event("response.content_part.added", {{"item_id", message_id_}, {"output_index", index},
                                               {"content_index", 0}, {"part", output_text("")}});
  return out;
}

std::string ResponsesEventStream::close_message() {
  if (!message_index_) return {};
  const auto index = *message_index_;
  const char* status = finish_reason_ == "length" ? "incomplete" : "completed";
  json::object item = message_item(message_id_, status, json::array{output_text(text_)});
  std::string out = event("response.output_text.done", {{"item_id", message_id_}, {"output_index", index},
                                                        {"content_index", 0}, {"text", text_}, {"logprobs", json::array{}}});
  out += event("response.content_part.done", {{"item_id", message_id_}, {"output_index", index}, {"content_index", 0},
                                              {"part", output_text(text_)}});
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  message_index_.reset();
  return out;
}

// A chat tool-call delta ({index, id, function: {name, arguments}}): the first for an index opens a
// function_call item, later ones add to its arguments.
std::string ResponsesEventStream::on_tool_call(const json::object& delta) {
  std::string out = close_reasoning();
  out += close_message();
  const json::value* index_v = delta.if_contains("index");
  const std::size_t index = index_v && index_v->is_int64() ? static_cast<std::size_t>(index_v->as_int64()) : calls_.size();
  const json::value* fn_v = delta.if_contains("function");
  const json::object fn = fn_v && fn_v->is_object() ? fn_v->as_object() : json::object{};
  if (index >= calls_.size()) {
    calls_.resize(index + 1);
    Call& c = calls_[index];
    c.output_index = output_.size() + index;
    c.item_id = output_item_id("fc_", shell_.id, c.output_index);
    c.call_id = string_at(delta, "id");
    c.name = string_at(fn, "name");
    out += event("response.output_item.added",
                 {{"output_index", c.output_index}, {"item", call_item(c.item_id, "in_progress", c.call_id, c.name, "")}});
  }
  Call& c = calls_[index];
  const std::string piece = string_at(fn, "arguments");
  if (!piece.empty()) {
    c.arguments += piece;
    out += event("response.function_call_arguments.delta",
                 {{"item_id", c.item_id}, {"output_index", c.output_index}, {"delta", piece}});
  }
  return out;
}

std::string ResponsesEventStream::close_calls() {
  std::string out;
  const char* status = finish_reason_ == "length" ? "incomplete" : "completed";
  for (const Call& c : calls_) {
    json::object item = call_item(c.item_id, status, c.call_id, c.name, c.arguments);
    out += event("response.function_call_arguments.done",
                 {{"item_id", c.item_id}, {"output_index", c.output_index}, {"name", c.name}, {"arguments", c.arguments}});
    out += event("response.output_item.done", {{"output_index", c.output_index}, {"item", item}});
    output_.push_back(std::move(item));
  }
  calls_.clear();
  return out;
}

std::string ResponsesEventStream::on_chunk(const json::object& chunk) {
  if (ended_) return {};
  if (const json::value* error = chunk.if_contains("error"); error && error->is_object()) return on_error(error->as_object());
  if (const json::value* usage = chunk.if_contains("usage"); usage && usage->is_object()) usage_ = usage_from_chat(usage);
  const json::value* choices = chunk.if_contains("choices");
  if (!choices || !choices->is_array() || choices->as_array().empty()) return {};
  const json::object& choice = choices->as_array()[0].as_object();
  std::string out;
  if (const json::value* d = choice.if_contains("delta"); d && d->is_object()) {
    const json::object& delta = d->as_object();
    if (const std::string thought = string_at(delta, "reasoning_content"); !thought.empty()) out += on_reasoning(thought);
    const std::string piece = string_at(delta, "content");
    if (!piece.empty()) {
      if (!message_index_) {
        out += close_calls();
        out += open_message();
      }
      text_ += piece;
      out += event("response.output_text.delta", {{"item_id", message_id_}, {"output_index", *message_index_},
                                                  {"content_index", 0}, {"delta", piece}, {"logprobs", json::array{}}});
    }
    if (const json::value* calls = delta.if_contains("tool_calls"); calls && calls->is_array())
      for (const auto& call : calls->as_array())
        if (call.is_object()) out += on_tool_call(call.as_object());
  }
  if (const std::string reason = string_at(choice, "finish_reason"); !reason.empty()) finish_reason_ = reason;
  return out;
}

std::string ResponsesEventStream::on_error(const json::object& error) {
  ended_ = failed_ = true;
  const std::string message = string_at(error, "message");
  std::string code = string_at(error, "code");
  if (code.empty()) code = "server_error";
  // OpenAI's error event carries code/message/param at its top level; the AI SDK reads them under
  // "error": both are there.
  std::string out = event("error", {{"code", code}, {"message", message}, {"param", nullptr},
                                    {"error", json::object{{"type", "server_error"}, {"code", code},
                                                           {"message", message}, {"param", nullptr}}}});
  final_ = response_object(shell_, "failed", output_, usage_, nullptr, json::object{{"code", code}, {"message", message}});
  out += event("response.failed", {{"response", final_}});
  return out;
}

std::string ResponsesEventStream::finish() {
  if (ended_) return {};
  ended_ = true;
  std::string out = close_reasoning();
  out += close_message();
  out += close_calls();
  if (output_.empty()) {  // no text and no call: one empty message
    out += open_message();
    out += close_message();
  }
  const char* status = status_of(finish_reason_);
  final_ = response_object(shell_, status, output_, usage_, incomplete_of(finish_reason_));
  const char* type = std::string_view(status) == "incomplete" ? "response.incomplete" : "response.completed";
  out += event(type, {{"response", final_}});
  return out;
}

}  // namespace kvfleet::server
