// The bad-input suite: a real kvfleet-replica on loopback and every way to send it a bad request that we
// could think of. Each must get a 4xx with an OpenAI error object (naming the field where there is one)
// within 10 s; afterwards the replica is healthy, serves a good request, and its memory has not grown.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "support/sanitizers.h"
#include "replica_fixture.h"
#include "router_integration/router_fixture.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

struct Case {
  std::string method;
  std::string target;
  std::string body;
  int status;
  std::string param;  // "" = do not check; "-" = must be null/empty
  std::string content_type = "application/json";
};

std::string repeat(const std::string& s, std::size_t n, const std::string& sep = ",") {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += (i ? sep : "") + s;
  return out;
}

const std::string kChatBase = R"("messages":[{"role":"user","content":"hi"}],"max_tokens":2)";

// Completions with one bad field added to a good request.
Case comp(const std::string& field, int status = 400, std::string param = "") {
  return {"POST", "/v1/completions", R"({"prompt":"hi","max_tokens":2,)" + field + "}", status, std::move(param)};
}
Case chat(const std::string& fields, int status = 400, std::string param = "") {
  return {"POST", "/v1/chat/completions", "{" + kChatBase + "," + fields + "}", status, std::move(param)};
}
Case chat_messages(const std::string& messages, std::string param = "") {
  return {"POST", "/v1/chat/completions", R"({"max_tokens":2,"messages":)" + messages + "}", 400, std::move(param)};
}
// /v1/responses with `fields` (a good request's input unless they give their own).
Case resp(const std::string& fields, int status = 400, std::string param = "") {
  const bool own_input = fields.find(R"("input")") != std::string::npos;
  return {"POST", "/v1/responses", "{" + (own_input ? fields : R"("input":"hi","max_output_tokens":2,)" + fields) + "}",
          status, std::move(param)};
}
Case raw(std::string method, std::string target, std::string body, int status, std::string param = "") {
  return {std::move(method), std::move(target), std::move(body), status, std::move(param)};
}

std::vector<Case> cases() {
  const std::string long_prompt = repeat("a b", 200, " ");  // > 256 tokens: past --max-model-len
  const std::string batch_prompt = repeat("x y", 70, " ");  // 140 tokens: past the 128-token step budget
  std::vector<Case> c = {
      // Bodies that are not a JSON object.
      raw("POST", "/v1/completions", "{not json", 400, "-"),
      raw("POST", "/v1/completions", "", 400, "-"),
      raw("POST", "/v1/completions", "[1,2]", 400, "-"),
      raw("POST", "/v1/completions", "null", 400, "-"),
      raw("POST", "/v1/completions", "\"a string\"", 400, "-"),
      raw("POST", "/v1/completions", "42", 400, "-"),
      raw("POST", "/v1/completions", R"({"prompt":"hi")", 400, "-"),
      raw("POST", "/v1/completions", R"({"prompt":"hi"}garbage)", 400, "-"),
      raw("POST", "/v1/completions", "\xef\xbb\xbf{\"prompt\":\"hi\"}", 400, "-"),
      raw("POST", "/v1/completions", "{\"prompt\":\"\xff\xfe\"}", 400, "-"),
      raw("POST", "/v1/completions", R"({"prompt":"\ud800"})", 400, "-"),
      raw("POST", "/v1/completions", repeat("[", 200, "") + repeat("]", 200, ""), 400, "-"),
      raw("POST", "/v1/completions", "{\"prompt\":" + repeat("[", 100, "") + "1" + repeat("]", 100, "") + "}", 400, ""),
      raw("POST", "/v1/completions", "prompt=hi&max_tokens=2", 400, "-"),
      raw("POST", "/v1/chat/completions", "{not json", 400, "-"),
      raw("POST", "/tokenize", "[]", 400, "-"),
      raw("POST", "/detokenize", "{", 400, "-"),
      // prompt
      raw("POST", "/v1/completions", R"({"max_tokens":3})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":null})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":5})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":true})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":{"text":"hi"}})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[[]]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[1.5]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[-1]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[true]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[1,"a"]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":["a",1]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[[1],[-1]]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[null]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[999999999]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[4294967296]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[18446744073709551615]})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":""})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":")" + long_prompt + R"("})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":")" + batch_prompt + R"(","max_tokens":2})", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[)" + repeat("\"p\"", 129) + "]}", 400, "prompt"),
      raw("POST", "/v1/completions", R"({"prompt":[)" + repeat("[1,2]", 3) + R"(],"n":5})", 400, "n"),
      // model
      comp(R"("model":5)", 400, "model"),
      comp(R"("model":"other")", 404, "model"),
      comp(R"("model":["tiny-qwen"])", 400, "model"),
      // max_tokens
      comp(R"("max_tokens":"3")", 400, "max_tokens"),
      comp(R"("max_tokens":0)", 400, "max_tokens"),
      comp(R"("max_tokens":-1)", 400, "max_tokens"),
      comp(R"("max_tokens":1.5)", 400, "max_tokens"),
      comp(R"("max_tokens":true)", 400, "max_tokens"),
      comp(R"("max_tokens":[])", 400, "max_tokens"),
      comp(R"("max_tokens":1e30)", 400, "max_tokens"),
      comp(R"("max_tokens":99999999999)", 400, "max_tokens"),
      comp(R"("max_tokens":500)", 400, "max_tokens"),
      // sampling values
      comp(R"("temperature":"hot")", 400, "temperature"),
      comp(R"("temperature":-0.1)", 400, "temperature"),
      comp(R"("temperature":2.5)", 400, "temperature"),
      comp(R"("temperature":1e400)", 400, ""),
      comp(R"("temperature":{})", 400, "temperature"),
      comp(R"("top_p":0)", 400, "top_p"),
      comp(R"("top_p":1.5)", 400, "top_p"),
      comp(R"("top_p":-1)", 400, "top_p"),
      comp(R"("top_p":"x")", 400, "top_p"),
      comp(R"("top_k":-2)", 400, "top_k"),
      comp(R"("top_k":1.5)", 400, "top_k"),
      comp(R"("top_k":"x")", 400, "top_k"),
      comp(R"("top_k":99999999999)", 400, "top_k"),
      comp(R"("min_p":-0.1)", 400, "min_p"),
      comp(R"("min_p":1.1)", 400, "min_p"),
      comp(R"("seed":"x")", 400, "seed"),
      comp(R"("seed":1.5)", 400, "seed"),
      comp(R"("seed":18446744073709551615)", 400, "seed"),
      comp(R"("presence_penalty":3)", 400, "presence_penalty"),
      comp(R"("presence_penalty":"x")", 400, "presence_penalty"),
      comp(R"("frequency_penalty":-2.5)", 400, "frequency_penalty"),
      comp(R"("repetition_penalty":0)", 400, "repetition_penalty"),
      comp(R"("repetition_penalty":-1)", 400, "repetition_penalty"),
      comp(R"("repetition_penalty":1000)", 400, "repetition_penalty"),
      // n, best_of, fan-out
      comp(R"("n":0)", 400, "n"),
      comp(R"("n":17)", 400, "n"),
      comp(R"("n":-1)", 400, "n"),
      comp(R"("n":"2")", 400, "n"),
      comp(R"("n":1.5)", 400, "n"),
      comp(R"("n":13)", 400, "n"),
      comp(R"("best_of":3)", 400, "best_of"),
      comp(R"("best_of":"x")", 400, "best_of"),
      // stop
      comp(R"("stop":5)", 400, "stop"),
      comp(R"("stop":[1])", 400, "stop"),
      comp(R"("stop":[""])", 400, "stop"),
      comp(R"("stop":"")", 400, "stop"),
      comp(R"("stop":{"a":1})", 400, "stop"),
      comp(R"("stop":[)" + repeat("\"s\"", 65) + "]", 400, "stop"),
      comp(R"("stop":")" + std::string(1025, 's') + "\"", 400, "stop"),
      comp(R"("stop":[null])", 400, "stop"),
      comp(R"("stop_token_ids":"x")", 400, "stop_token_ids"),
      comp(R"("stop_token_ids":[-1])", 400, "stop_token_ids"),
      comp(R"("stop_token_ids":["a"])", 400, "stop_token_ids"),
      comp(R"("stop_token_ids":[1.5])", 400, "stop_token_ids"),
      comp(R"("stop_token_ids":[999999])", 400, "stop_token_ids"),
      comp(R"("stop_token_ids":[)" + repeat("1", 257) + "]", 400, "stop_token_ids"),
      // logprobs
      comp(R"("logprobs":21)", 400, "logprobs"),
      comp(R"("logprobs":-1)", 400, "logprobs"),
      comp(R"("logprobs":"x")", 400, "logprobs"),
      comp(R"("logprobs":true)", 400, "logprobs"),
      // flags
      comp(R"("echo":"yes")", 400, "echo"),
      comp(R"("ignore_eos":1)", 400, "ignore_eos"),
      comp(R"("skip_special_tokens":"no")", 400, "skip_special_tokens"),
      comp(R"("stream":"yes")", 400, "stream"),
      comp(R"("stream":1)", 400, "stream"),
      comp(R"("stream_options":{"include_usage":true})", 400, "stream_options"),
      comp(R"("stream":true,"stream_options":"x")", 400, "stream_options"),
      comp(R"("stream":true,"stream_options":{"include_usage":"yes"})", 400, "stream_options.include_usage"),
      comp(R"("suffix":"x")", 400, "suffix"),
      comp(R"("user":5)", 400, "user"),
      // logit_bias
      comp(R"("logit_bias":[])", 400, "logit_bias"),
      comp(R"("logit_bias":"x")", 400, "logit_bias"),
      comp(R"("logit_bias":{"abc":1})", 400, "logit_bias"),
      comp(R"("logit_bias":{"5x":1})", 400, "logit_bias"),
      comp(R"("logit_bias":{"":1})", 400, "logit_bias"),
      comp(R"("logit_bias":{"5":"x"})", 400, "logit_bias"),
      comp(R"("logit_bias":{"5":101})", 400, "logit_bias"),
      comp(R"("logit_bias":{"-1":1})", 400, "logit_bias"),
      comp(R"("logit_bias":{"999999":1})", 400, "logit_bias"),
      // cache_salt, response_format
      comp(R"("cache_salt":"")", 400, "cache_salt"),
      comp(R"("cache_salt":5)", 400, "cache_salt"),
      comp(R"("cache_salt":")" + std::string(257, 'k') + "\"", 400, "cache_salt"),
      comp(R"("response_format":"x")", 400, "response_format"),
      comp(R"("response_format":{})", 400, "response_format.type"),
      // structured outputs: malformed, two at once, what the grammar engine refuses (named down to the keyword)
      comp(R"("guided_json":"{x")", 400, "guided_json"),
      comp(R"("structured_outputs":{"regex":"a","choice":["a"]})", 400, "structured_outputs.choice"),
      comp(R"("guided_regex":"a","guided_choice":["a"])", 400, "guided_choice"),
      comp(R"("structured_outputs":{"structural_tag":"x"})", 400, "structured_outputs.structural_tag"),
      comp(R"("guided_json":{"type":"number","multipleOf":3})", 400, "guided_json.multipleOf"),
      comp(R"("guided_regex":"(a")", 400, "guided_regex"),
      chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"integer","multipleOf":2}}}}})", 400,
           "response_format.json_schema.schema.properties.a.multipleOf"),
      // chat: messages
      chat_messages("null", "messages"),
      chat_messages("\"hi\"", "messages"),
      chat_messages("[]", "messages"),
      chat_messages("{}", "messages"),
      chat_messages("[1]", "messages[0]"),
      chat_messages("[{}]", "messages[0].role"),
      chat_messages(R"([{"role":5,"content":"x"}])", "messages[0].role"),
      chat_messages(R"([{"role":"wizard","content":"x"}])", "messages[0].role"),
      chat_messages(R"([{"role":"user"}])", "messages[0].content"),
      chat_messages(R"([{"role":"user","content":5}])", "messages[0].content"),
      chat_messages(R"([{"role":"user","content":{"text":"x"}}])", "messages[0].content"),
      chat_messages(R"([{"role":"user","content":[{"type":"text"}]}])", "messages[0].content[0].text"),
      chat_messages(R"([{"role":"user","content":[{"type":"text","text":5}]}])", "messages[0].content[0].text"),
      chat_messages(R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])",
                    "messages[0].content[0].type"),
      chat_messages(R"([{"role":"user","content":[{"type":"input_audio"}]}])", "messages[0].content[0].type"),
      chat_messages(R"([{"role":"user","content":[{"type":"bogus"}]}])", "messages[0].content[0].type"),
      chat_messages(R"([{"role":"user","content":[{"text":"x"}]}])", "messages[0].content[0].type"),
      chat_messages(R"([{"role":"user","content":[{"type":5}]}])", "messages[0].content[0].type"),
      chat_messages(R"([{"role":"user","content":["x"]}])", "messages[0].content[0]"),
      chat_messages(R"([{"role":"user","content":[null]}])", "messages[0].content[0]"),
      chat_messages(R"([{"role":"user","content":"x","name":5}])", "messages[0].name"),
      chat_messages(R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":"x"}])", "messages[1].tool_calls"),
      chat_messages(R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[5]}])", "messages[1].tool_calls[0]"),
      chat_messages(R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"function":"x"}]}])",
                    "messages[1].tool_calls[0].function"),
      chat_messages(R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"function":{}}]}])",
                    "messages[1].tool_calls[0].function.name"),
      chat_messages(R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"function":{"name":5}}]}])",
                    "messages[1].tool_calls[0].function.name"),
      chat_messages(R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":5}}]}])",
                    "messages[1].tool_calls[0].function.arguments"),
      chat_messages(R"([{"role":"tool","content":"x","tool_call_id":5}])", "messages[0].tool_call_id"),
      // chat: tools and the rest
      chat(R"("tools":"x")", 400, "tools"),
      chat(R"("tools":[5])", 400, "tools[0]"),
      chat(R"("tools":[{"type":"retrieval"}])", 400, "tools[0].type"),
      chat(R"("tools":[{"type":"function"}])", 400, "tools[0].function"),
      chat(R"("tools":[{"type":"function","function":{}}])", 400, "tools[0].function.name"),
      chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])", 400, "tools[0].function.parameters"),
      chat(R"("tools":[{"type":"function","function":{"name":"f","description":5}}])", 400, "tools[0].function.description"),
      chat(R"("tool_choice":"required")", 400, "tool_choice"),
      chat(R"("tool_choice":5)", 400, "tool_choice"),
      chat(R"("tool_choice":{"type":"function","function":{"name":"f"}})", 400, "tool_choice"),
      chat(R"("logprobs":"yes")", 400, "logprobs"),
      chat(R"("top_logprobs":2)", 400, "top_logprobs"),
      chat(R"("logprobs":true,"top_logprobs":21)", 400, "top_logprobs"),
      chat(R"("max_completion_tokens":0)", 400, "max_completion_tokens"),
      chat(R"("add_generation_prompt":"x")", 400, "add_generation_prompt"),
      chat(R"("parallel_tool_calls":"x")", 400, "parallel_tool_calls"),
      chat(R"("n":13)", 400, "n"),
      chat(R"("model":"other")", 404, "model"),
      chat(R"("temperature":3)", 400, "temperature"),
      chat(R"("stop":[)" + repeat("\"s\"", 65) + "]", 400, "stop"),
      chat(R"("stream":true,"stream_options":{"include_usage":1})", 400, "stream_options.include_usage"),
      // /tokenize and /detokenize
      raw("POST", "/tokenize", "{}", 400, "prompt"),
      raw("POST", "/tokenize", R"({"prompt":5})", 400, "prompt"),
      raw("POST", "/tokenize", R"({"prompt":"a","add_special_tokens":"x"})", 400, "add_special_tokens"),
      raw("POST", "/tokenize", R"({"messages":"x"})", 400, "messages"),
      raw("POST", "/tokenize", R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", 400,
          "messages[0].content[0].text"),
      raw("POST", "/detokenize", "{}", 400, "tokens"),
      raw("POST", "/detokenize", R"({"tokens":"x"})", 400, "tokens"),
      raw("POST", "/detokenize", R"({"tokens":[-1]})", 400, "tokens"),
      raw("POST", "/detokenize", R"({"tokens":[99999999]})", 400, "tokens"),
      raw("POST", "/detokenize", R"({"tokens":[1.5]})", 400, "tokens"),
      // Methods and paths.
      raw("GET", "/v1/completions", "", 405),
      raw("DELETE", "/v1/chat/completions", "", 405),
      raw("PUT", "/tokenize", "{}", 405),
      raw("POST", "/v1/models", "{}", 405),
      raw("POST", "/health", "{}", 405),
      raw("GET", "/v1/nope", "", 404),
      raw("POST", "/v1/completions/extra", "{}", 404),
      raw("GET", "/", "", 404),
      raw("GET", "/internal/anything", "", 404),
      // Size.
      raw("POST", "/v1/completions", R"({"prompt":")" + std::string(70000, 'x') + R"("})", 413),
  };
  const std::vector<Case> responses = {
      raw("POST", "/v1/responses", "{not json", 400, "-"),
      raw("POST", "/v1/responses", "{}", 400, "input"),
      resp(R"("input":5)", 400, "input"),
      resp(R"("input":[])", 400, "input"),
      resp(R"("input":["hi"])", 400, "input[0]"),
      resp(R"("input":[{"role":"tool","content":"x"}])", 400, "input[0].role"),
      resp(R"("input":[{"role":"user"}])", 400, "input[0].content"),
      resp(R"("input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}])", 400, "input[0].content[0].type"),
      resp(R"("input":[{"role":"user","content":[{"type":"input_text"}]}])", 400, "input[0].content[0].text"),
      resp(R"("input":[{"type":"computer_call"}])", 400, "input[0].type"),
      resp(R"("input":[{"type":"function_call","name":"f","arguments":"{}"}])", 400, "input[0].call_id"),
      resp(R"("input":[{"type":"function_call_output","call_id":"c","output":5}])", 400, "input[0].output"),
      resp(R"("input":[{"type":"item_reference","id":"msg_none_0"}])", 400, "input[0].id"),
      resp(R"("input":")" + long_prompt + R"(")", 400, "input"),
      resp(R"("temperature":3)", 400, "temperature"),
      resp(R"("top_p":0)", 400, "top_p"),
      resp(R"("input":"hi","max_output_tokens":0)", 400, "max_output_tokens"),
      resp(R"("input":"hi","max_output_tokens":100000)", 400, "max_output_tokens"),
      resp(R"("stream":"yes")", 400, "stream"),
      resp(R"("store":1)", 400, "store"),
      resp(R"("instructions":5)", 400, "instructions"),
      resp(R"("previous_response_id":"resp_none")", 400, "previous_response_id"),
      resp(R"("previous_response_id":5)", 400, "previous_response_id"),
      resp(R"("metadata":[1])", 400, "metadata"),
      resp(R"("metadata":{"k":")" + std::string(600, 'v') + R"("})", 400, "metadata"),
      resp(R"("tools":{})", 400, "tools"),
      resp(R"("tools":[{"type":"file_search"}])", 400, "tools[0].type"),
      resp(R"("tools":[{"type":"function","name":"f","parameters":"x"}],"tool_choice":"none")", 400, "tools[0].parameters"),
      resp(R"("tool_choice":"maybe")", 400, "tool_choice"),
      resp(R"("text":{"format":{"type":"json_schema","name":"n","schema":{"type":"number","multipleOf":3}}})", 400, "text.format"),
      resp(R"("reasoning":{"effort":"low"})", 400, "reasoning.effort"),
      resp(R"("include":["reasoning.encrypted_content"])", 400, "include"),
      resp(R"("background":true)", 400, "background"),
      resp(R"("conversation":"conv_1")", 400, "conversation"),
      resp(R"("truncation":"never")", 400, "truncation"),
      resp(R"("messages":[])", 400, "messages"),
      resp(R"("max_tokens":2)", 400, "max_tokens"),
      resp(R"("seed":"x")", 400, "seed"),
      resp(R"("model":"nope")", 404, "model"),
      raw("GET", "/v1/responses/resp_missing", "", 404, "-"),
      raw("DELETE", "/v1/responses/resp_missing", "", 404, "-"),
      raw("GET", "/v1/responses/resp_missing?stream=true", "", 400, "stream"),
      raw("POST", "/v1/responses/resp_missing", "{}", 405, "-"),
      raw("GET", "/v1/responses", "", 405, "-"),
  };
  c.insert(c.end(), responses.begin(), responses.end());
  Case form = raw("POST", "/v1/completions", "prompt=hi", 400, "-");
  form.content_type = "application/x-www-form-urlencoded";
  c.push_back(form);
  return c;
}

// `port`: the replica's, or a router's in front of it (which may answer some cases itself, with its own
// wording: there only the status class and the error object are checked).
void check_case(std::uint16_t port, const Case& c, bool via_router = false) {
  CAPTURE(c.method);
  CAPTURE(c.target);
  CAPTURE(c.body.substr(0, 120));
  const auto start = std::chrono::steady_clock::now();
  const http::Response res = http::http_request("127.0.0.1", port, c.method, c.target, c.body,
                                                {{"Content-Type", c.content_type}}, std::chrono::seconds(10));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  if (via_router) {
    CHECK(res.status >= 400);
    CHECK(res.status < 500);
  } else {
    CHECK(res.status == c.status);
  }
  json::error_code ec;
  const json::value body = json::parse(res.body, ec);
  REQUIRE_MESSAGE(!ec, res.body.substr(0, 200));
  const json::value* error = body.is_object() ? body.as_object().if_contains("error") : nullptr;
  REQUIRE_MESSAGE((error && error->is_object()), res.body.substr(0, 200));
  const json::object& err = error->as_object();
  CHECK(err.at("message").is_string());
  CHECK(!err.at("message").as_string().empty());
  CHECK(err.at("type").is_string());
  CHECK(err.contains("param"));
  CHECK(err.contains("code"));
  const json::value& param = err.at("param");
  const std::string got = param.is_string() ? std::string(param.as_string()) : "";
  if (via_router) return;
  if (c.param == "-") CHECK(got.empty());
  else if (!c.param.empty()) CHECK(got == c.param);
}

}  // namespace

TEST_CASE("the bad-input suite: every case a 4xx OpenAI error naming the field; healthy, no memory growth") {
  test::ReplicaProcess replica({"--max-model-len", "256", "--max-num-seqs", "4", "--max-waiting-requests", "8",
                                "--enable-chunked-prefill", "false", "--max-num-batched-tokens", "128",
                                "--max-body-bytes", "65536"});
  const std::vector<Case> all = cases();
  CHECK(all.size() > 190);
  for (const Case& c : all) check_case(replica.port(), c);  // the first pass also warms the allocator up
  const std::size_t rss_before = replica.rss_bytes();
  for (int round = 0; round < 3; ++round)
    for (const Case& c : all) check_case(replica.port(), c);
  const std::size_t rss_after = replica.rss_bytes();
  CAPTURE(rss_before);
  CAPTURE(rss_after);
  CHECK(rss_before > 0);
  if (!test::kUnderAsan) CHECK(rss_after < rss_before + (8u << 20));  // three more passes: no growth past noise
  CHECK(replica.get("/health").status == 200);
  const auto ok = replica.post("/v1/completions", R"({"prompt":"hi","max_tokens":2})");
  CHECK(ok.status == 200);
  const auto chat_ok = replica.post("/v1/chat/completions", "{" + kChatBase + "}");
  CHECK(chat_ok.status == 200);
}

TEST_CASE("the bad-input suite through a router: 4xx relayed, the replica never looks failed to it") {
  test::ReplicaProcess replica({"--max-model-len", "256", "--max-num-seqs", "4", "--max-waiting-requests", "8",
                                "--enable-chunked-prefill", "false", "--max-num-batched-tokens", "128",
                                "--max-body-bytes", "65536"});
  test::RouterProcess router({&replica});
  int sent = 0;
  for (const Case& c : cases()) {
    if (c.method != "POST" || !c.target.starts_with("/v1/") || c.status == 413) continue;
    check_case(router.port(), c, true);
    ++sent;
  }
  CHECK(sent > 150);
  // A content part the replica refuses: the router routes it without a prefix match and relays the replica's
  // own 400, naming the part.
  const auto image = router.post("/v1/chat/completions", R"({"max_tokens":2,"messages":[{"role":"user","content":)"
                                                         R"([{"type":"text","text":"hi"},{"type":"image_url"}]}]})");
  CHECK(image.status == 400);
  CHECK(json::parse(image.body).at("error").at("param") == "messages[0].content[1].type");
  // Client faults are not the replica's: its circuit stays closed and a good request goes through.
  const auto ok = router.post("/v1/completions", R"({"prompt":"hi","max_tokens":2})");
  CHECK(ok.status == 200);
  const auto link = router.replica(replica.base_url());
  CHECK(link.at("healthy").as_bool());
  CHECK(link.at("circuit_breaker") == "closed");
}
