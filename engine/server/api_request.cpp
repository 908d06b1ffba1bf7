#include "engine/server/api_request.h"

#include <boost/json.hpp>
#include <cmath>

namespace kvfleet::server {
namespace json = boost::json;

ApiError bad_request(std::string message, std::string param) {
  return ApiError(400, std::move(message), "invalid_request_error", std::move(param));
}

json::value parse_json_body(std::string_view body) {
  json::error_code ec;
  json::value v = json::parse(body, ec);
  if (ec) throw bad_request("the request body is not valid JSON: " + ec.message());
  if (!v.is_object()) throw bad_request("the request body must be a JSON object");
  return v;
}

namespace {

// Typed access to an optional field, with errors that name it.
class Fields {
 public:
  explicit Fields(const json::object& o) : o_(o) {}

  const json::value* find(const char* key) const {
    const json::value* v = o_.if_contains(key);
    return v && !v->is_null() ? v : nullptr;
  }
  std::optional<double> number(const char* key, double lo, double hi) const {
    const json::value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw bad_request("'" + std::string(key) + "' must be a number", key);
    const double d = v->to_number<double>();
    if (!(d >= lo && d <= hi) || !std::isfinite(d))
      throw bad_request("'" + std::string(key) + "' must be between " + fmt(lo) + " and " + fmt(hi) + ", got " + fmt(d), key);
    return d;
  }
  std::optional<std::int64_t> integer(const char* key, std::int64_t lo, std::int64_t hi) const {
    const json::value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_int64() && !v->is_uint64()) throw bad_request("'" + std::string(key) + "' must be an integer", key);
    if (v->is_uint64() && v->as_uint64() > static_cast<std::uint64_t>(hi))
      throw bad_request("'" + std::string(key) + "' must be at most " + std::to_string(hi), key);
    const std::int64_t i = v->is_int64() ? v->as_int64() : static_cast<std::int64_t>(v->as_uint64());
    if (i < lo || i > hi)
      throw bad_request("'" + std::string(key) + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                            ", got " + std::to_string(i), key);
    return i;
  }
  std::optional<bool> boolean(const char* key) const {
    const json::value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_bool()) throw bad_request("'" + std::string(key) + "' must be true or false", key);
    return v->as_bool();
  }
  std::optional<std::string> string(const char* key) const {
    const json::value* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw bad_request("'" + std::string(key) + "' must be a string", key);
    return std::string(v->as_string());
  }

 private:
  static std::string fmt(double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", d);
    return buf;
  }
  const json::object& o_;
};

std::vector<TokenId> token_list(const json::array& a, const char* param) {
  std::vector<TokenId> ids;
  for (const auto& v : a) {
    if (!v.is_int64() || v.as_int64() < 0 || v.as_int64() > INT32_MAX)
      throw bad_request("'" + std::string(param) + "' token ids must be non-negative integers", param);
    ids.push_back(static_cast<TokenId>(v.as_int64()));
  }
  return ids;
}

GenerateParams parse_params(const Fields& f, bool chat) {
  GenerateParams p;
  const char* max_key = chat && f.find("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto v = f.integer(max_key, 1, INT32_MAX)) p.max_tokens = static_cast<std::int32_t>(*v);
  if (auto v = f.number("temperature", 0.0, 2.0)) p.sampling.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0.0, 1.0)) {
    if (*v == 0.0) throw bad_request("'top_p' must be greater than 0", "top_p");
    p.sampling.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k", -1, INT32_MAX)) p.sampling.top_k = static_cast<std::int32_t>(*v);
  if (auto v = f.number("min_p", 0.0, 1.0)) p.sampling.min_p = static_cast<float>(*v);
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) {
    p.sampling.seed = static_cast<std::uint64_t>(*v);
    p.seeded = true;
  }
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) p.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0)) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty", 0.01, 100.0)) p.repetition_penalty = static_cast<float>(*v);
  if (auto v = f.integer("n", 1, 16)) p.n = static_cast<std::int32_t>(*v);
  if (const json::value* stop = f.find("stop")) {
    if (stop->is_string()) {
      p.stop.emplace_back(stop->as_string());
    } else if (stop->is_array()) {
      for (const auto& s : stop->as_array()) {
        if (!s.is_string()) throw bad_request("'stop' must be a string or a list of strings", "stop");
        p.stop.emplace_back(s.as_string());
      }
    } else {
      throw bad_request("'stop' must be a string or a list of strings", "stop");
    }
    for (const auto& s : p.stop)
      if (s.empty()) throw bad_request("'stop' strings must not be empty", "stop");
  }
  if (const json::value* ids = f.find("stop_token_ids")) {
    if (!ids->is_array()) throw bad_request("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    p.stop_token_ids = token_list(ids->as_array(), "stop_token_ids");
  }
  if (chat) {
    if (f.boolean("logprobs").value_or(false))
      p.logprobs = static_cast<std::int32_t>(f.integer("top_logprobs", 0, 20).value_or(0));
    else if (f.find("top_logprobs"))
      throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  } else if (auto v = f.integer("logprobs", 0, 20)) {
    p.logprobs = static_cast<std::int32_t>(*v);
  }
  p.ignore_eos = f.boolean("ignore_eos").value_or(false);
  p.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  p.stream = f.boolean("stream").value_or(false);
  if (const json::value* so = f.find("stream_options")) {
    if (!so->is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    if (!p.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    p.include_usage = Fields(so->as_object()).boolean("include_usage").value_or(false);
  }
  return p;
}

}  // namespace

CompletionRequest parse_completion_request(const json::value& body) {
  const Fields f(body.as_object());
  CompletionRequest r;
  r.model = f.string("model").value_or("");
  const json::value* prompt = f.find("prompt");
  if (!prompt) throw bad_request("'prompt' is required", "prompt");
  auto bad_prompt = [] {
    return bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists",
                       "prompt");
  };
  if (prompt->is_string()) {
    r.prompts.push_back({std::string(prompt->as_string()), {}});
  } else if (prompt->is_array()) {
    const json::array& a = prompt->as_array();
    if (a.empty()) throw bad_request("'prompt' must not be empty", "prompt");
    if (a.front().is_int64()) {
      r.prompts.push_back({std::nullopt, token_list(a, "prompt")});
    } else {
      for (const auto& item : a) {
        if (item.is_string()) r.prompts.push_back({std::string(item.as_string()), {}});
        else if (item.is_array()) r.prompts.push_back({std::nullopt, token_list(item.as_array(), "prompt")});
        else throw bad_prompt();
      }
    }
  } else {
    throw bad_prompt();
  }
  for (const auto& p : r.prompts)
    if (!p.text && p.ids.empty()) throw bad_request("'prompt' must not be empty", "prompt");
  r.echo = f.boolean("echo").value_or(false);
  r.params = parse_params(f, false);
  return r;
}

ChatRequest parse_chat_request(const json::value& body) {
  const Fields f(body.as_object());
  ChatRequest r;
  r.model = f.string("model").value_or("");
  const json::value* messages = f.find("messages");
  if (!messages || !messages->is_array() || messages->as_array().empty())
    throw bad_request("'messages' must be a non-empty list of messages", "messages");
  for (const auto& m : messages->as_array()) {
    if (!m.is_object() || !m.as_object().contains("role") || !m.at("role").is_string())
      throw bad_request("each message needs a 'role' string", "messages");
    json::object msg = m.as_object();
    // Content given as parts ([{"type": "text", "text": ...}]) is joined into one string for the template.
    if (const json::value* c = msg.if_contains("content"); c && c->is_array()) {
      std::string text;
      for (const auto& part : c->as_array()) {
        if (!part.is_object() || part.as_object().if_contains("type") == nullptr || part.at("type") != "text")
          throw bad_request("only text content parts are supported", "messages");
        const json::value* part_text = part.as_object().if_contains("text");
        if (!part_text || !part_text->is_string())
          throw bad_request("each text content part needs a 'text' string", "messages");
        text += std::string(part_text->as_string());
      }
      msg["content"] = text;
    } else if (c && !c->is_string() && !c->is_null()) {
      throw bad_request("message 'content' must be a string or a list of text parts", "messages");
    }
    r.messages.push_back(std::move(msg));
  }
  if (const json::value* tools = f.find("tools")) r.tools = *tools;
  r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  r.params = parse_params(f, true);
  return r;
}

}  // namespace kvfleet::server
