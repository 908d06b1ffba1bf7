// OpenAI request fields that kvfleet does not implement: each a 400 naming it, never silently ignored.
// Fields not in the list and not parsed elsewhere are accepted, as vLLM and SGLang accept their extras.
#pragma once

#include <boost/json/object.hpp>

namespace kvfleet::server {

enum class Endpoint { chat, completions };

// Throws ApiError 400 naming the first unimplemented field `body` uses.
void refuse_unimplemented_fields(const boost::json::object& body, Endpoint endpoint);

}  // namespace kvfleet::server
