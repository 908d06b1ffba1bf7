// parse_speculative_config (kvfleet/speculative.h): vLLM's keys and defaults, with errors naming the key.
#include <boost/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>
#include <algorithm>

#include "kvfleet/speculative.h"

namespace kvfleet {
namespace {

namespace json = boost::json;

[[noreturn]] void bad(const std::string& key, const std::string& why) {
  throw std::invalid_argument("speculative_config: " + key + " " + why);
}

std::int32_t integer(const json::value& v, const std::string& key) {
  if (!v.is_int64() && !v.is_uint64()) bad(key, "must be an integer");
  const std::int64_t n = v.is_int64() ? v.as_int64() : static_cast<std::int64_t>(std::min<std::uint64_t>(v.as_uint64(), 1u << 30));
  if (n < -(1 << 30) || n > (1 << 30)) bad(key, "is out of range");
  return static_cast<std::int32_t>(n);
}

double number(const json::value& v, const std::string& key) {
  if (v.is_double()) return v.as_double();
  if (v.is_int64()) return static_cast<double>(v.as_int64());
  if (v.is_uint64()) return static_cast<double>(v.as_uint64());
  bad(key, "must be a number");
}

}  // namespace

void validate(const SpeculativeConfig& c) {
  if (c.method != "ngram" && c.method != "suffix" && c.method != "draft_model") {
    if (c.method == "eagle" || c.method == "eagle3" || c.method == "medusa" || c.method == "mtp")
      bad("method", "\"" + c.method + "\" is not implemented by kvfleet (supported: \"ngram\", \"suffix\", \"draft_model\")");
    bad("method", "must be \"ngram\", \"suffix\" or \"draft_model\"");
  }
  if (c.method == "draft_model" && c.draft_model.empty()) bad("model", "is required for method \"draft_model\"");
  if (c.method != "draft_model" && !c.draft_model.empty()) bad("model", "applies to method \"draft_model\" only");
  if (c.suffix_max_tree_depth < 1 || c.suffix_max_tree_depth > 64)
    bad("suffix_decoding_max_tree_depth", "must be between 1 and 64");
  if (c.suffix_max_cached_requests < 0) bad("suffix_decoding_max_cached_requests", "must be at least 0");
  if (!(c.suffix_max_spec_factor > 0.0) || c.suffix_max_spec_factor > 1e6)
    bad("suffix_decoding_max_spec_factor", "must be greater than 0 and at most 1e6");
  if (!(c.suffix_min_token_prob >= 0.0 && c.suffix_min_token_prob <= 1.0))
    bad("suffix_decoding_min_token_prob", "must be between 0 and 1");
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > SpeculativeConfig::kMaxSpeculativeTokens)
    bad("num_speculative_tokens", "must be between 1 and " + std::to_string(SpeculativeConfig::kMaxSpeculativeTokens));
  if (c.prompt_lookup_min < 1) bad("prompt_lookup_min", "must be at least 1");
  if (c.prompt_lookup_max < 1) bad("prompt_lookup_max", "must be at least 1");
  if (c.prompt_lookup_min > c.prompt_lookup_max) bad("prompt_lookup_min", "must not exceed prompt_lookup_max");
  if (c.disable_by_batch_size < 1) bad("disable_by_batch_size", "must be at least 1");
}

SpeculativeConfig parse_speculative_config(const std::string& text) {
  json::value doc;
  try {
    doc = json::parse(text);
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("speculative_config: not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) throw std::invalid_argument("speculative_config: must be a JSON object");
  SpeculativeConfig c;
  bool has_k = false;
  std::optional<std::int32_t> lookup_max, lookup_min;
  std::vector<std::string> suffix_keys;
  for (const auto& [k, v] : doc.as_object()) {
    const std::string key(k);
    if (key == "method") {
      if (!v.is_string()) bad(key, "must be a string");
      c.method = std::string(v.as_string());
      if (c.method == "[ngram]") c.method = "ngram";  // vLLM's older spelling
    } else if (key == "model") {
      if (!v.is_string() || v.as_string().empty()) bad(key, "must be a non-empty string (the draft model's directory)");
      c.draft_model = std::string(v.as_string());
    } else if (key == "num_speculative_tokens") {
      c.num_speculative_tokens = integer(v, key);
      has_k = true;
    } else if (key == "prompt_lookup_max") {
      lookup_max = integer(v, key);
    } else if (key == "prompt_lookup_min") {
      lookup_min = integer(v, key);
    } else if (key == "disable_by_batch_size") {
      c.disable_by_batch_size = integer(v, key);
    } else if (key == "suffix_decoding_max_tree_depth") {
      c.suffix_max_tree_depth = integer(v, key);
      suffix_keys.push_back(key);
    } else if (key == "suffix_decoding_max_cached_requests") {
      c.suffix_max_cached_requests = integer(v, key);
      suffix_keys.push_back(key);
    } else if (key == "suffix_decoding_max_spec_factor") {
      c.suffix_max_spec_factor = number(v, key);
      suffix_keys.push_back(key);
    } else if (key == "suffix_decoding_min_token_prob") {
      c.suffix_min_token_prob = number(v, key);
      suffix_keys.push_back(key);
    } else {
      bad(key, "is not a key kvfleet implements (method, model, num_speculative_tokens, prompt_lookup_max, "
               "prompt_lookup_min, disable_by_batch_size, suffix_decoding_max_tree_depth, "
               "suffix_decoding_max_cached_requests, suffix_decoding_max_spec_factor, suffix_decoding_min_token_prob)");
    }
  }
  if (c.method.empty()) bad("method", "is required");
  // A key of the other method would be silently ignored: refused instead.
  if (c.method != "ngram" && (lookup_max || lookup_min))
    bad(lookup_max ? "prompt_lookup_max" : "prompt_lookup_min", "applies to method \"ngram\" only");
  if (c.method != "suffix" && !suffix_keys.empty()) bad(suffix_keys.front(), "applies to method \"suffix\" only");
  if (c.method == "suffix" && !has_k)
    c.num_speculative_tokens = std::min(c.suffix_max_tree_depth, SpeculativeConfig::kMaxSpeculativeTokens);
  else if (!has_k)
    bad("num_speculative_tokens", "is required");
  // vLLM's defaults: one bound given sets the other; neither gives 5 and 5.
  c.prompt_lookup_max = lookup_max.value_or(lookup_min.value_or(5));
  c.prompt_lookup_min = lookup_min.value_or(lookup_max.value_or(5));
  validate(c);
  return c;
}

}  // namespace kvfleet
