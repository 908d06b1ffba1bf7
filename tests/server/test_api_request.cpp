// Request parsing: what OpenAI clients send becomes plain structs; everything wrong is a 400 that names
// the offending field.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "engine/server/api/request.h"

using namespace kvfleet;
using namespace kvfleet::server;

namespace {

ApiError error_of_completion(const char* body) {
  try {
    parse_completion_request(parse_json_body(body));
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "no error", "");
}

}  // namespace

TEST_CASE("completion prompts: string, strings, ids, lists of ids") {
  auto r = parse_completion_request(parse_json_body(R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0.5,
    "top_p":0.9,"top_k":40,"min_p":0.1,"seed":7,"stop":["\n"],"n":2,"logprobs":3,"presence_penalty":0.5,
    "frequency_penalty":-0.5,"repetition_penalty":1.2,"ignore_eos":true,"stream":true,
    "stream_options":{"include_usage":true}})"));
  REQUIRE(r.prompts.size() == 1);
  CHECK(*r.prompts[0].text == "hi");
  CHECK(*r.params.max_tokens == 5);
  CHECK(r.params.sampling.temperature == 0.5f);
  CHECK(r.params.sampling.top_k == 40);
  CHECK(r.params.seeded);
  CHECK(r.params.stop == std::vector<std::string>{"\n"});
  CHECK(r.params.n == 2);
  CHECK(*r.params.logprobs == 3);
  CHECK(r.params.repetition_penalty == doctest::Approx(1.2));
  CHECK(r.params.include_usage);
  r = parse_completion_request(parse_json_body(R"({"prompt":["a","b"]})"));
  CHECK(r.prompts.size() == 2);
  r = parse_completion_request(parse_json_body(R"({"prompt":[1,2,3]})"));
  CHECK(r.prompts.size() == 1);
  CHECK(r.prompts[0].ids == std::vector<TokenId>{1, 2, 3});
  r = parse_completion_request(parse_json_body(R"({"prompt":[[1],[2,3]]})"));
  CHECK(r.prompts.size() == 2);
  CHECK(r.prompts[1].ids == std::vector<TokenId>{2, 3});
  CHECK_FALSE(r.params.max_tokens.has_value());
}

TEST_CASE("bad completion requests name the field") {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":[]})", "prompt"},
      {R"({"prompt":[-1]})", "prompt"},
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","temperature":3})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","n":100})", "n"},
      {R"({"prompt":"x","stop":[1]})", "stop"},
      {R"({"prompt":"x","logprobs":21})", "logprobs"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","model":3})", "model"},
  };
  for (const auto& c : cases) {
    CAPTURE(std::string(c.body));
    const ApiError e = error_of_completion(c.body);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param == c.param);
  }
  const ApiError e = error_of_completion("{nope");
  CHECK(e.status == 400);
  CHECK(std::string(e.what()).find("not valid JSON") != std::string::npos);
  CHECK(error_of_completion("[1]").status == 400);
}

TEST_CASE("chat requests: messages, content parts, logprobs") {
  auto r = parse_chat_request(parse_json_body(R"({"model":"m","messages":[{"role":"system","content":"Be brief."},
    {"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":"there"}]}],
    "logprobs":true,"top_logprobs":2,"max_completion_tokens":7})"));
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[1].at("content") == "Hello there");
  CHECK(*r.params.logprobs == 2);
  CHECK(*r.params.max_tokens == 7);
  auto err = [](const char* body) {
    try {
      parse_chat_request(parse_json_body(body));
    } catch (const ApiError& e) {
      return e.param;
    }
    return std::string("none");
  };
  CHECK(err(R"({"messages":[]})") == "messages");
  CHECK(err(R"({"messages":[{"content":"x"}]})") == "messages[0].role");
  CHECK(err(R"({"messages":[{"role":"user","content":5}]})") == "messages[0].content");
  CHECK(err(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})") == "top_logprobs");
  // Before: at("text") threw std::out_of_range, which the server answered with a 500.
  CHECK(err(R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})") == "messages[0].content[0].text");
  CHECK(err(R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"image_url"}]}]})") ==
        "messages[1].content[0].type");
  CHECK(err(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]})") ==
        "tools[0].function.name");
}

TEST_CASE("caps: stop strings, stop_token_ids, logit_bias, prompts; cache_salt") {
  auto err = [](const std::string& fields) {
    try {
      parse_completion_request(parse_json_body(R"({"prompt":"x")" + fields + "}"));
    } catch (const ApiError& e) {
      return e.param;
    }
    return std::string("none");
  };
  auto list = [](const std::string& item, std::size_t n) {
    std::string s = "[";
    for (std::size_t i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s + "]";
  };
  CHECK(err(",\"stop\":" + list("\"s\"", RequestLimits::max_stop_strings)) == "none");
  CHECK(err(",\"stop\":" + list("\"s\"", RequestLimits::max_stop_strings + 1)) == "stop");
  CHECK(err(",\"stop\":\"" + std::string(RequestLimits::max_stop_bytes, 'a') + "\"") == "none");
  CHECK(err(",\"stop\":\"" + std::string(RequestLimits::max_stop_bytes + 1, 'a') + "\"") == "stop");
  CHECK(err(",\"stop_token_ids\":" + list("3", RequestLimits::max_stop_token_ids + 1)) == "stop_token_ids");
  CHECK(err(R"(,"logit_bias":{"12":-100,"13":100})") == "none");
  CHECK(err(R"(,"logit_bias":{"12":-101})") == "logit_bias");
  CHECK(err(R"(,"cache_salt":"tenant-1")") == "none");
  CHECK(err(R"(,"cache_salt":"")") == "cache_salt");
  const auto r = parse_completion_request(parse_json_body(R"({"prompt":"x","cache_salt":"t","logit_bias":{"7":2.5}})"));
  CHECK(r.params.cache_salt == "t");
  REQUIRE(r.params.logit_bias.size() == 1);
  CHECK(r.params.logit_bias[0] == std::pair<TokenId, float>{7, 2.5f});
  auto prompts = [&](std::size_t n) {
    try {
      parse_completion_request(parse_json_body(R"({"prompt":)" + list("\"p\"", n) + "}"));
    } catch (const ApiError& e) {
      return e.param;
    }
    return std::string("none");
  };
  CHECK(prompts(RequestLimits::max_prompts) == "none");
  CHECK(prompts(RequestLimits::max_prompts + 1) == "prompt");
}

TEST_CASE("data_parallel_rank (body, SGLang) and X-data-parallel-rank (header, vLLM); the header wins") {
  auto r = parse_completion_request(parse_json_body(R"({"prompt":"x","data_parallel_rank":3})"));
  REQUIRE(r.params.dp_rank);
  CHECK(*r.params.dp_rank == 3);
  CHECK_FALSE(parse_completion_request(parse_json_body(R"({"prompt":"x"})")).params.dp_rank);
  CHECK(error_of_completion(R"({"prompt":"x","data_parallel_rank":-1})").param == "data_parallel_rank");
  CHECK(error_of_completion(R"({"prompt":"x","data_parallel_rank":"1"})").param == "data_parallel_rank");
  CHECK(error_of_completion(R"({"prompt":"x","data_parallel_rank":1.5})").param == "data_parallel_rank");
  const std::string one = "1";
  apply_dp_rank_header(&one, r.params);
  CHECK(*r.params.dp_rank == 1);
  apply_dp_rank_header(nullptr, r.params);  // no header: the body's (here the header's) stays
  CHECK(*r.params.dp_rank == 1);
  for (const std::string bad : {"", "-1", "x", "1x", " 1", "99999999999"}) {
    CAPTURE(bad);
    GenerateParams p;
    try {
      apply_dp_rank_header(&bad, p);
      FAIL("no error");
    } catch (const ApiError& e) {
      CHECK(e.status == 400);
      CHECK(e.param == "X-data-parallel-rank");
    }
  }
}
