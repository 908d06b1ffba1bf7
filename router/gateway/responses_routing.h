// The Responses API's parts of the router's proxy (router/gateway/responses.cpp): which stored response a
// request continues, and what the router itself writes into a Responses stream when the replica's
// stream breaks: an `error` event numbered after the last event relayed, as the replica would have sent
// it (OpenAI's top-level code/message and the AI SDK's nested "error" object).
#pragma once

#include <boost/json/object.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvfleet::router {

std::string responses_error_event(std::int64_t sequence, std::string_view code, std::string_view message);
// The id of the stored response a POST /v1/responses body continues from (previous_response_id, or
// the response an item_reference's item belongs to), if any.
std::optional<std::string> continued_response(const boost::json::object& body);
// The last `"sequence_number":N` in `piece`, else `previous`.
std::int64_t last_sequence_number(std::string_view piece, std::int64_t previous);

}  // namespace kvfleet::router
