#include "engine/server/api/unimplemented_fields.h"

#include <boost/json.hpp>
#include <string_view>

#include "engine/server/api/request.h"

namespace kvfleet::server {
namespace json = boost::json;

namespace {

struct Unimplemented {
  std::string_view field;
  std::string_view why;
  // A value that asks for nothing beyond what kvfleet does (a default): accepted.
  bool (*harmless)(const json::value&) = nullptr;
};

bool is_false(const json::value& v) { return v.is_bool() && !v.as_bool(); }
bool text_only(const json::value& v) {
  return v.is_array() && v.as_array().size() == 1 && v.as_array()[0].is_string() && v.as_array()[0].as_string() == "text";
}
bool default_tier(const json::value& v) {
  return v.is_string() && (v.as_string() == "auto" || v.as_string() == "default");
}
bool is_string(const json::value& v) { return v.is_string(); }

// The chat/completions request schema's fields (OpenAI API reference) that kvfleet does not serve.
// `store` follows vLLM, which keeps nothing: asking to store is refused, `store: false` and `metadata`
// (labels for stored completions) are accepted.
constexpr Unimplemented chat_fields[] = {
    {"audio", "audio output is not supported"},
    {"modalities", "only the 'text' modality is supported", text_only},
    {"prediction", "predicted outputs are not supported"},
    {"web_search_options", "web search is not supported"},
    {"service_tier", "service tiers are not supported", default_tier},
    {"store", "stored completions are not supported", is_false},
    {"reasoning_effort", "reasoning effort is not supported"},
    {"verbosity", "verbosity is not supported"},
    {"prompt_cache_key", "prompt cache keys are not supported (use cache_salt for a tenant's cache)"},
    {"safety_identifier", "", is_string},
};

constexpr Unimplemented completion_fields[] = {
    {"suffix", "text after the completion (suffix) is not supported"},
};

}  // namespace

void refuse_unimplemented_fields(const json::object& body, Endpoint endpoint) {
  auto check = [&](const auto& list) {
    for (const Unimplemented& u : list) {
      const json::value* v = body.if_contains(u.field);
      if (!v || v->is_null() || (u.harmless && u.harmless(*v))) continue;
      const std::string field(u.field);
      if (u.why.empty()) throw bad_request("'" + field + "' must be a string", field);
      throw bad_request("'" + field + "': " + std::string(u.why), field);
    }
  };
  if (endpoint == Endpoint::chat) check(chat_fields);
  else check(completion_fields);
}

}  // namespace kvfleet::server
