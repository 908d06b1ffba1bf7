// POST /v1/responses bodies (OpenAI's Responses API): validated and turned into the chat completions body
// the request runs as (the same chat template, the same engine job), plus the fields the response object
// repeats. Every OpenAI field kvfleet does not serve is a 400 naming it, never ignored. No I/O here.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <optional>
#include <string>

namespace kvfleet::server {

// What this replica can do beyond text: a request that needs more is refused with a 400 naming its field.
struct ResponsesCapabilities {
  bool tool_calls = false;          // function tools with tool_choice auto / required / named (a tool-call parser)
  bool structured_outputs = false;  // text.format json_object / json_schema (constrained decoding)
};

struct ResponsesRequest {
  std::string model;
  boost::json::array input;  // the input items (a string input: one user message item)
  std::optional<std::string> instructions;
  std::optional<std::string> previous_response_id;
  bool store = true;
  bool stream = false;
  bool truncate = false;  // truncation "auto": drop the oldest turns until the prompt fits
  // The /v1/chat/completions body this request runs as, without `messages` (the handler adds them: the
  // instructions, a previous response's conversation, then the input).
  boost::json::object chat;
  // The request's fields as the response object repeats them (OpenAI's defaults where not given).
  boost::json::object echo;
};

ResponsesRequest parse_responses_request(const boost::json::value& body, const ResponsesCapabilities& can);

// A chat parameter name in an error of the chat path, as the Responses request names it
// ("max_tokens" -> "max_output_tokens", "messages[3].content" -> "input", ...).
std::string responses_param(const std::string& chat_param);

}  // namespace kvfleet::server
