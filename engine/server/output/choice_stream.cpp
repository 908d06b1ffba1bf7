#include "engine/server/output/choice_stream.h"

#include <boost/json.hpp>

namespace kvfleet::server {
namespace json = boost::json;

const std::string& ChoiceStream::push(const RequestOutput& o) {
  num_prompt_tokens_ = o.num_prompt_tokens;
  num_cached_tokens_ = o.num_cached_tokens;
  tokens_.insert(tokens_.end(), o.new_tokens.begin(), o.new_tokens.end());
  logprobs_.insert(logprobs_.end(), o.logprobs.begin(), o.logprobs.end());
  sent_ += o.resumed_text;  // shown by the replica that generated the resumed tokens
  sent_ += o.text;  // decoded once, on the engine thread, a stop string's possible beginning held back there
  if (o.finished) {
    finish_reason_ = o.finish_reason == FinishReason::stop ? "stop" : o.finish_reason == FinishReason::length ? "length" : "abort";
    error_ = o.error;
  }
  return o.text;
}

void ChoiceStream::resume(const std::vector<TokenId>& tokens, bool logprobs) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  if (logprobs) logprobs_.resize(logprobs_.size() + tokens.size());
  ids_taken_ = tokens_.size();
}

json::array ChoiceStream::take_token_ids() {
  json::array ids;
  ids.reserve(tokens_.size() - ids_taken_);
  for (; ids_taken_ < tokens_.size(); ++ids_taken_) ids.emplace_back(tokens_[ids_taken_]);
  return ids;
}

json::value completion_logprobs(const Tokenizer& tok, const std::vector<TokenId>& tokens,
                                const std::vector<RequestOutput::Logprobs>& lps, std::size_t text_offset) {
  json::array toks, token_lps, tops, offsets;
  for (std::size_t i = 0; i < tokens.size() && i < lps.size(); ++i) {
    const std::string piece = tok.decode(std::span(&tokens[i], 1));
    toks.emplace_back(piece);
    token_lps.emplace_back(lps[i].logprob);
    json::object top;
    for (const auto& t : lps[i].top) top[tok.decode(std::span(&t.id, 1))] = t.logprob;
    tops.emplace_back(std::move(top));
    offsets.emplace_back(text_offset);
    text_offset += piece.size();
  }
  return json::object{{"tokens", toks}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json::value chat_logprobs(const Tokenizer& tok, const std::vector<TokenId>& tokens,
                          const std::vector<RequestOutput::Logprobs>& lps) {
  auto entry = [&](TokenId id, float lp) {
    const std::string piece = tok.decode(std::span(&id, 1));
    json::array bytes;
    for (unsigned char c : piece) bytes.emplace_back(c);
    return json::object{{"token", piece}, {"logprob", lp}, {"bytes", bytes}};
  };
  json::array content;
  for (std::size_t i = 0; i < tokens.size() && i < lps.size(); ++i) {
    json::object e = entry(tokens[i], lps[i].logprob);
    json::array top;
    for (const auto& t : lps[i].top) top.emplace_back(entry(t.id, t.logprob));
    e["top_logprobs"] = std::move(top);
    content.emplace_back(std::move(e));
  }
  return json::object{{"content", content}};
}

}  // namespace kvfleet::server
