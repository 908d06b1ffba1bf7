// OpenAI-compatible request bodies (docs/architecture.md, Contract 4): parsed and validated into plain structs, with
// an OpenAI-style error (status, message, type, param, code) for anything wrong. No I/O here.
#pragma once

#include <boost/json/value.hpp>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/server/api/structured_output.h"
#include "kvfleet/block_hash.h"
#include "kvfleet/sampler.h"

namespace kvfleet::server {

// Thrown by the parsers and handlers; the server turns it into {"error": {...}} with this status.
struct ApiError : std::runtime_error {
  ApiError(int status_, std::string message, std::string type_, std::string param_ = {}, std::string code_ = {})
      : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), param(std::move(param_)),
        code(std::move(code_)) {}
  int status;
  std::string type, param, code;
};

ApiError bad_request(std::string message, std::string param = {});

// Caps on what one request may ask for; beyond them a 400 names the field. The per-token cost of stop
// strings does not grow with their number (StopMatcher), but each is held back from a stream until it
// is resolved, and all of them live on the engine thread: keep both bounded.
struct RequestLimits {
  static constexpr std::int32_t max_n = 16;              // choices per prompt
  static constexpr std::size_t max_prompts = 128;        // prompts in one completions request
  static constexpr std::size_t max_stop_strings = 64;
  static constexpr std::size_t max_stop_bytes = 1024;    // per stop string
  static constexpr std::size_t max_stop_token_ids = 256;
  static constexpr std::size_t max_logit_bias = 300;     // entries (OpenAI's limit)
  static constexpr std::size_t max_cache_salt_bytes = 256;
  static constexpr std::int32_t max_logprobs = 20;
};

struct ChatMessage {
  std::string role;
  std::string content;
  boost::json::value raw;  // the message as sent (tool calls etc. reach the chat template)
};

struct GenerateParams {
  std::optional<std::int32_t> max_tokens;  // unset: up to the context length (chat) / 16 (completions)
  SamplingParams sampling;
  bool seeded = false;  // a seed was given
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  std::vector<std::string> stop;
  std::vector<TokenId> stop_token_ids;
  std::int32_t n = 1;
  std::optional<std::int32_t> logprobs;  // completions: top-N alternatives; chat: top_logprobs when logprobs
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;
  std::vector<std::pair<TokenId, float>> logit_bias;  // ids not checked against the vocabulary yet
  std::string cache_salt;                             // prefix-cache namespace of a tenant (Contract 1)
  // vLLM's `priority`: lower is scheduled first; anything but 0 needs --scheduling-policy priority.
  std::int32_t priority = 0;
  // The data-parallel rank to run on (an expert-parallel replica): the body's `data_parallel_rank`
  // (SGLang) or the `X-data-parallel-rank` header (vLLM; apply_dp_rank_header). Range checked by the replica.
  std::optional<std::int32_t> dp_rank;
  // kvfleet's resumption extension (docs/architecture.md, Contract 4): a stream moved here from another
  // replica after `output_token_ids` were streamed from it. The client already has the stream's first
  // chunk (role, echo): the continuation carries neither, and keeps the stream's id and created.
  struct Resume {
    std::vector<TokenId> output_token_ids;
    std::optional<std::string> id;
    std::optional<std::int64_t> created;
  };
  std::optional<Resume> resume;        // the body's `kvfleet_resume`
  bool stream_token_ids = false;       // the X-Kvfleet-Token-Ids header: chunks carry `kvfleet_token_ids`
  // response_format / structured_outputs / guided_*: the one constraint on the output, if any.
  std::optional<StructuredOutput> structured;
};

struct CompletionRequest {
  std::string model;
  // A prompt given as text keeps the text (so it can be tokenized with the right options); as ids, the ids.
  struct Prompt {
    std::optional<std::string> text;
    std::vector<TokenId> ids;
  };
  std::vector<Prompt> prompts;
  bool echo = false;
  GenerateParams params;
};

// tool_choice: "none", "auto", "required", or "function" with the function's name (named).
struct ToolChoice {
  std::string mode;
  std::string function;
};

struct ChatRequest {
  std::string model;
  boost::json::array messages;  // validated: a known role, and content a string (parts joined) or null
  boost::json::value tools;     // validated tools, or the legacy `functions` as tools; null when none
  std::optional<ToolChoice> tool_choice;  // tool_choice, or the legacy function_call; unset when not given
  bool parallel_tool_calls = true;
  bool add_generation_prompt = true;
  GenerateParams params;
};

// /tokenize: a prompt, or chat messages rendered with the chat template.
struct TokenizeRequest {
  std::optional<std::string> prompt;
  std::optional<ChatRequest> chat;
  bool add_special_tokens = true;
};

// Each throws ApiError (400 naming the field) for anything malformed. `body` must be an object
// (parse_json_body checks it).
CompletionRequest parse_completion_request(const boost::json::value& body);
ChatRequest parse_chat_request(const boost::json::value& body);
TokenizeRequest parse_tokenize_request(const boost::json::value& body);
std::vector<TokenId> parse_detokenize_request(const boost::json::value& body);
// The sampling and output fields shared by both endpoints (api/request.cpp; used by api/chat.cpp).
GenerateParams parse_generate_params(const boost::json::object& body, bool chat);
// The `X-data-parallel-rank` header's value (nullptr: none) into p.dp_rank; it wins over the body's
// field (a router names the rank it chose for the cache it follows). 400 unless a non-negative integer.
void apply_dp_rank_header(const std::string* header, GenerateParams& p);
// The `X-Kvfleet-Token-Ids` header (nullptr: none): "true" makes a stream's chunks carry their token ids.
// 400 unless "true" or "false".
void apply_token_ids_header(const std::string* header, GenerateParams& p);
// Parses JSON text, or throws ApiError 400 naming the problem.
boost::json::value parse_json_body(std::string_view body);

}  // namespace kvfleet::server
