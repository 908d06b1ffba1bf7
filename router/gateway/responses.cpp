// The Responses API through the router: POST /v1/responses routes by prefix like chat (its instructions
// and input rendered through the chat template as the replica renders them), except that a follow-up
// naming previous_response_id goes to the replica that stored that response; GET and DELETE
// /v1/responses/{id} go there too (response_owners.h says how the router knows which).
#include <boost/json.hpp>

#include "kvfleet/chat_tokens.h"
#include "kvfleet/http/json_error.h"
#include "kvfleet/responses_input.h"
#include "router/gateway/gateway.h"
#include "router/gateway/responses_routing.h"

namespace kvfleet::router {
namespace json = boost::json;

namespace {

constexpr std::string_view kByIdPrefix = "/v1/responses/";

}  // namespace

std::string responses_error_event(std::int64_t sequence, std::string_view code, std::string_view message) {
  json::object error{{"type", "server_error"}, {"code", code}, {"message", message}, {"param", nullptr}};
  json::object e{{"type", "error"}, {"sequence_number", sequence}, {"code", code}, {"message", message},
                 {"param", nullptr}, {"error", std::move(error)}};
  return "event: error\ndata: " + json::serialize(e) + "\n\n";
}

std::int64_t last_sequence_number(std::string_view piece, std::int64_t previous) {
  constexpr std::string_view key = "\"sequence_number\":";
  const std::size_t at = piece.rfind(key);
  if (at == std::string_view::npos) return previous;
  std::int64_t n = 0;
  bool digits = false;
  for (std::size_t i = at + key.size(); i < piece.size() && piece[i] >= '0' && piece[i] <= '9'; ++i) {
    n = n * 10 + (piece[i] - '0');
    digits = true;
  }
  return digits ? n : previous;
}

// The stored response a request continues from: its previous_response_id, else the response of its
// first item_reference (an output item's id names its response: "msg_" + the response id's random
// part + "_" + the output index).
std::optional<std::string> continued_response(const json::object& body) {
  if (const json::value* prev = body.if_contains("previous_response_id"); prev && prev->is_string())
    return std::string(prev->as_string());
  const json::value* input = body.if_contains("input");
  if (!input || !input->is_array()) return std::nullopt;
  for (const auto& item : input->as_array()) {
    const json::object* o = item.if_object();
    const json::value* type = o ? o->if_contains("type") : nullptr;
    const json::value* id = o ? o->if_contains("id") : nullptr;
    if (!type || !type->is_string() || type->as_string() != "item_reference" || !id || !id->is_string()) continue;
    const std::string_view s = id->as_string();
    const std::size_t begin = s.find('_'), end = s.rfind('_');
    if (begin != std::string_view::npos && end > begin + 1) return "resp_" + std::string(s.substr(begin + 1, end - begin - 1));
  }
  return std::nullopt;
}

// The replica's rendering of a request without a previous response: instructions as a system message,
// the input items as chat messages, function tools in chat's shape. Anything it cannot render (a
// previous_response_id, an item_reference, a malformed field) routes without a prefix match: the
// replica answers.
std::vector<TokenId> Gateway::responses_prompt(const json::object& body) const {
  if (!chat_template_) return {};
  if (const json::value* prev = body.if_contains("previous_response_id"); prev && !prev->is_null()) return {};
  const json::value* input = body.if_contains("input");
  if (!input) return {};
  json::array messages;
  if (const json::value* i = body.if_contains("instructions"); i && i->is_string())
    messages.push_back(json::object{{"role", "system"}, {"content", i->as_string()}});
  append_responses_messages(responses_input_items(*input), "input", nullptr, messages);
  ChatTemplateOptions opts;
  if (const json::value* tools = body.if_contains("tools"); tools && tools->is_array() && !tools->as_array().empty()) {
    json::array chat_tools;
    for (const auto& t : tools->as_array())
      if (t.is_object()) chat_tools.push_back(responses_chat_tool(t.as_object(), "tools"));
    opts.tools = std::move(chat_tools);
  }
  return tokenize_chat(*chat_template_, tokenizer_, messages, opts, config_.special_tokens_in_content);
}

std::shared_ptr<ReplicaLink> Gateway::link_of(const std::string& url) const {
  std::lock_guard lock(mutex_);
  for (const auto& l : links_)
    if (l->url == url && !l->removed) return l;
  return nullptr;
}

// The replica that holds response `id`: the one that named it, else the first that answers 200 to
// GET /v1/responses/{id} (asked one after the other; a router restarted or another router's answer).
awaitable<std::shared_ptr<ReplicaLink>> Gateway::find_response_owner(const std::string& id) {
  if (auto url = response_owners_.find(id))
    if (auto link = link_of(*url)) co_return link;
  std::vector<std::shared_ptr<ReplicaLink>> links;
  {
    std::lock_guard lock(mutex_);
    for (const auto& l : links_)
      if (l->healthy && !l->removed) links.push_back(l);
  }
  const auto executor = co_await boost::asio::this_coro::executor;
  for (const auto& link : links) {
    http::HttpClientConfig cc;
    cc.connect_timeout = config_.connect_timeout;
    cc.io_timeout = config_.health_timeout;
    http::HttpClient client(executor, cc);
    http::Request req;
    req.method = "GET";
    req.target = std::string(kByIdPrefix) + id;
    add_replica_auth(req);
    int status = 0;
    try {
      const std::string host = link->address.host;
      co_await client.connect(host, link->address.port);
      status = (co_await client.request(req)).status;
    } catch (const std::exception&) {
      continue;
    }
    if (status == 200) {
      response_owners_.remember(id, link->url);
      co_return link;
    }
  }
  co_return nullptr;
}

// The slots of every replica but `owner`: routing with them excluded can only choose the owner.
std::vector<ReplicaId> Gateway::all_but(const ReplicaLink& owner) const {
  std::vector<ReplicaId> slots;
  std::lock_guard lock(mutex_);
  for (const auto& l : links_)
    if (l.get() != &owner) slots.push_back(l->slot);
  return slots;
}

awaitable<void> Gateway::response_by_id(const http::Request& req, http::ResponseWriter& w) {
  if (!authorized(req)) {
    co_await w.send(http::json_error(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                     "authentication_error", "", "invalid_api_key"));
    co_return;
  }
  const std::string id(req.path().substr(kByIdPrefix.size()));
  std::shared_ptr<ReplicaLink> owner;  // (no co_await inside ?: : GCC 12)
  if (id.find('/') == std::string::npos) owner = co_await find_response_owner(id);
  if (!owner) {
    co_await w.send(http::json_error(404, "Response with id '" + id + "' not found.", "invalid_request_error"));
    co_return;
  }
  if (req.method == "DELETE") response_owners_.forget(id);
  TryResult result;
  co_await forward(*owner, req, w, /*last_try=*/true, result);
}

}  // namespace kvfleet::router
