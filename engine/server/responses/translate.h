// A /v1/responses request runs as a chat completion (the chat template, the same engine job); these turn
// the chat path's answer into the Responses API's: the response object, and the typed stream events
// (response.created, response.in_progress, response.output_item.added, response.content_part.added,
// response.output_text.delta..., response.output_text.done, response.content_part.done,
// response.output_item.done, response.completed | response.incomplete, or error + response.failed),
// each with its sequence_number. Tool calls in the chat answer become function_call items (with
// response.function_call_arguments.delta/.done events). The reasoning (reasoning_content, with a reasoning
// parser) becomes a reasoning item first, its text both as content (reasoning_text) and as summary
// (summary_text): streamed as response.output_item.added, response.reasoning_summary_part.added,
// response.content_part.added, then per piece response.reasoning_summary_text.delta and
// response.reasoning_text.delta, then response.reasoning_text.done, response.content_part.done,
// response.reasoning_summary_text.done, response.reasoning_summary_part.done, response.output_item.done.
// Pure: no I/O, no clock.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvfleet::server {

// What every response object carries besides its output.
struct ResponseShell {
  std::string id;  // "resp_..."
  std::int64_t created_at = 0;
  std::string model;
  boost::json::object echo;  // the request's fields (ResponsesRequest::echo)
};

// A random id with this prefix ("resp_"): 128 random bits in hex.
std::string responses_id(const char* prefix);
// The id of a response's output item: "rs_" / "msg_" / "fc_", the response id's random part, "_", its output
// index. An item id names its response, so that a router sends an item_reference where it is stored.
std::string output_item_id(const char* prefix, const std::string& response_id, std::size_t output_index);

// The response object. `usage` and `incomplete_details` null when absent.
boost::json::object response_object(const ResponseShell& shell, const char* status, boost::json::array output,
                                     boost::json::value usage, boost::json::value incomplete_details = nullptr,
                                     boost::json::value error = nullptr);

// A whole chat.completion answer as the response object.
boost::json::object response_from_chat(const ResponseShell& shell, const boost::json::object& completion);

// The chat path's SSE stream (chat.completion.chunk objects, the usage chunk, an error object) turned
// into Responses events, one call per chat event. Writes `event: TYPE` and `data: JSON` lines.
class ResponsesEventStream {
 public:
  explicit ResponsesEventStream(ResponseShell shell) : shell_(std::move(shell)) {}

  std::string begin();                                   // response.created, response.in_progress
  std::string on_chunk(const boost::json::object& chunk);  // one chat event's JSON
  // The end of the chat stream ([DONE]): closes what is open, then response.completed / .incomplete,
  // or, after an error, nothing more.
  std::string finish();
  // The response as it ended (after finish()); failed() when the stream carried an error.
  const boost::json::object& final_response() const { return final_; }
  bool failed() const { return failed_; }

 private:
  struct Call {
    std::size_t output_index = 0;
    std::string item_id, call_id, name, arguments;
  };
  std::string event(const char* type, boost::json::object fields);
  std::string open_reasoning();
  std::string on_reasoning(const std::string& piece);
  std::string close_reasoning();
  std::string open_message();
  std::string close_message();
  std::string on_tool_call(const boost::json::object& delta);
  std::string close_calls();
  std::string on_error(const boost::json::object& error);

  ResponseShell shell_;
  std::int64_t sequence_ = 0;
  boost::json::array output_;  // the finished items, in output order
  std::optional<std::size_t> reasoning_index_;  // the open reasoning item's output index
  std::string reasoning_id_, reasoning_;
  std::optional<std::size_t> message_index_;  // the open message item's output index
  std::string message_id_, text_;
  std::vector<Call> calls_;  // function calls still receiving arguments, by the chat delta's index
  std::string finish_reason_;
  boost::json::value usage_;
  boost::json::object final_;
  bool failed_ = false;
  bool ended_ = false;
};

}  // namespace kvfleet::server
