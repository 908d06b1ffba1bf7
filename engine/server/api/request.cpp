#include "engine/server/api/request.h"

#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <utility>

#include "engine/server/api/fields.h"
#include "engine/server/api/unimplemented_fields.h"

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

std::vector<TokenId> token_list(const json::array& a, const std::string& param) {
  std::vector<TokenId> ids;
  ids.reserve(a.size());
  for (const auto& v : a) {
    if (!v.is_int64() || v.as_int64() < 0 || v.as_int64() > INT32_MAX)
      throw bad_request("'" + param + "' token ids must be non-negative integers", param);
    ids.push_back(static_cast<TokenId>(v.as_int64()));
  }
  return ids;
}

void parse_stop(const Fields& f, GenerateParams& p) {
  if (const json::value* stop = f.find("stop")) {
    if (stop->is_string()) {
      p.stop.emplace_back(stop->as_string());
    } else if (stop->is_array()) {
      if (stop->as_array().size() > RequestLimits::max_stop_strings)
        throw bad_request("'stop' may hold at most " + std::to_string(RequestLimits::max_stop_strings) + " strings", "stop");
      for (const auto& s : stop->as_array()) {
        if (!s.is_string()) throw bad_request("'stop' must be a string or a list of strings", "stop");
        p.stop.emplace_back(s.as_string());
      }
    } else {
      throw bad_request("'stop' must be a string or a list of strings", "stop");
    }
    for (const auto& s : p.stop) {
      if (s.empty()) throw bad_request("'stop' strings must not be empty", "stop");
      if (s.size() > RequestLimits::max_stop_bytes)
        throw bad_request("'stop' strings may be at most " + std::to_string(RequestLimits::max_stop_bytes) + " bytes", "stop");
    }
  }
  if (const json::array* ids = f.array("stop_token_ids")) {
    if (ids->size() > RequestLimits::max_stop_token_ids)
      throw bad_request("'stop_token_ids' may hold at most " + std::to_string(RequestLimits::max_stop_token_ids) + " ids",
                        "stop_token_ids");
    p.stop_token_ids = token_list(*ids, "stop_token_ids");
  }
}

void parse_logit_bias(const Fields& f, GenerateParams& p) {
  const json::object* bias = f.object("logit_bias");
  if (!bias) return;
  if (bias->size() > RequestLimits::max_logit_bias)
    throw bad_request("'logit_bias' may hold at most " + std::to_string(RequestLimits::max_logit_bias) + " entries",
                      "logit_bias");
  for (const auto& [key, value] : *bias) {
    std::int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX)
      throw bad_request("'logit_bias' keys must be token ids, got '" + std::string(key) + "'", "logit_bias");
    if (!value.is_number() || !(value.to_number<double>() >= -100.0 && value.to_number<double>() <= 100.0))
      throw bad_request("'logit_bias' values must be numbers between -100 and 100", "logit_bias");
    p.logit_bias.emplace_back(static_cast<TokenId>(id), static_cast<float>(value.to_number<double>()));
  }
}

void parse_stream(const Fields& f, GenerateParams& p) {
  p.stream = f.boolean("stream").value_or(false);
  if (const json::object* so = f.object("stream_options")) {
    if (!p.stream) throw bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    const Fields options(*so, "stream_options.");
    p.include_usage = options.boolean("include_usage").value_or(false);
    options.boolean("continuous_usage_stats");  // accepted (vLLM), not sent
  }
}

// kvfleet_resume: {"output_token_ids": [...], "id": "...", "created": N}, for one streamed choice.
void parse_resume(const Fields& f, GenerateParams& p) {
  const json::object* resume = f.object("kvfleet_resume");
  if (!resume) return;
  const Fields r(*resume, "kvfleet_resume.");
  const json::array* ids = r.array("output_token_ids");
  if (!ids) throw bad_request("'kvfleet_resume.output_token_ids' is required", "kvfleet_resume.output_token_ids");
  GenerateParams::Resume out;
  out.output_token_ids = token_list(*ids, "kvfleet_resume.output_token_ids");
  out.id = r.string("id");
  if (out.id && (out.id->empty() || out.id->size() > 128))
    throw bad_request("'kvfleet_resume.id' must be 1 to 128 characters", "kvfleet_resume.id");
  out.created = r.integer("created", 0, INT64_MAX);
  for (const auto& [key, value] : *resume)
    if (key != "output_token_ids" && key != "id" && key != "created")
      throw bad_request("'kvfleet_resume." + std::string(key) + "' is not a known field", "kvfleet_resume." + std::string(key));
  if (!p.stream) throw bad_request("'kvfleet_resume' needs 'stream': true", "kvfleet_resume");
  if (p.n != 1) throw bad_request("'kvfleet_resume' needs 'n': 1", "kvfleet_resume");
  if (p.max_tokens && std::cmp_greater_equal(out.output_token_ids.size(), *p.max_tokens))
    throw bad_request("'kvfleet_resume.output_token_ids' holds max_tokens tokens or more", "kvfleet_resume.output_token_ids");
  p.resume = std::move(out);
}

}  // namespace

void apply_token_ids_header(const std::string* header, GenerateParams& p) {
  if (!header) return;
  if (*header != "true" && *header != "false")
    throw bad_request("the X-Kvfleet-Token-Ids header must be true or false", "X-Kvfleet-Token-Ids");
  p.stream_token_ids = *header == "true";
}

GenerateParams parse_generate_params(const json::object& body, bool chat) {
  const Fields f(body);
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
  if (auto v = f.integer("n", 1, RequestLimits::max_n)) p.n = static_cast<std::int32_t>(*v);
  if (auto v = f.integer("best_of", 1, RequestLimits::max_n); v && *v != p.n)
    throw bad_request("'best_of' other than 'n' is not supported", "best_of");
  parse_stop(f, p);
  if (chat) {
    if (f.boolean("logprobs").value_or(false))
      p.logprobs = static_cast<std::int32_t>(f.integer("top_logprobs", 0, RequestLimits::max_logprobs).value_or(0));
    else if (f.find("top_logprobs"))
      throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  } else if (auto v = f.integer("logprobs", 0, RequestLimits::max_logprobs)) {
    p.logprobs = static_cast<std::int32_t>(*v);
  }
  p.ignore_eos = f.boolean("ignore_eos").value_or(false);
  p.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  parse_stream(f, p);
  parse_logit_bias(f, p);
  f.string("user");  // accepted, unused; but it must be a string
  if (auto salt = f.string("cache_salt")) {
    if (salt->empty() || salt->size() > RequestLimits::max_cache_salt_bytes)
      throw bad_request("'cache_salt' must be a non-empty string of at most " +
                            std::to_string(RequestLimits::max_cache_salt_bytes) + " bytes", "cache_salt");
    p.cache_salt = std::move(*salt);
  }
  if (auto v = f.integer("priority", INT32_MIN, INT32_MAX)) p.priority = static_cast<std::int32_t>(*v);
  if (auto v = f.integer("data_parallel_rank", 0, INT32_MAX)) p.dp_rank = static_cast<std::int32_t>(*v);
  parse_resume(f, p);
  p.structured = parse_structured_output(body);
  return p;
}

void apply_dp_rank_header(const std::string* header, GenerateParams& p) {
  if (!header) return;
  std::int32_t rank = -1;
  const auto [end, ec] = std::from_chars(header->data(), header->data() + header->size(), rank);
  if (ec != std::errc() || end != header->data() + header->size() || rank < 0)
    throw bad_request("the X-data-parallel-rank header must be a non-negative integer, got '" + header->substr(0, 32) + "'",
                      "X-data-parallel-rank");
  p.dp_rank = rank;
}

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
    if (a.front().is_number()) {
      r.prompts.push_back({std::nullopt, token_list(a, "prompt")});
    } else {
      if (a.size() > RequestLimits::max_prompts)
        throw bad_request("'prompt' may hold at most " + std::to_string(RequestLimits::max_prompts) + " prompts", "prompt");
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
  refuse_unimplemented_fields(body.as_object(), Endpoint::completions);
  r.params = parse_generate_params(body.as_object(), false);
  if (r.params.resume && r.prompts.size() != 1) throw bad_request("'kvfleet_resume' needs one prompt", "kvfleet_resume");
  return r;
}

TokenizeRequest parse_tokenize_request(const json::value& body) {
  const Fields f(body.as_object());
  TokenizeRequest r;
  r.add_special_tokens = f.boolean("add_special_tokens").value_or(true);
  if (f.find("prompt")) {
    r.prompt = f.string("prompt");
  } else if (f.find("messages")) {
    r.chat = parse_chat_request(body);
  } else {
    throw bad_request("give 'prompt' (a string) or 'messages'", "prompt");
  }
  return r;
}

std::vector<TokenId> parse_detokenize_request(const json::value& body) {
  const Fields f(body.as_object());
  const json::array* tokens = f.array("tokens");
  if (!tokens) throw bad_request("'tokens' must be a list of token ids", "tokens");
  return token_list(*tokens, "tokens");
}

}  // namespace kvfleet::server
