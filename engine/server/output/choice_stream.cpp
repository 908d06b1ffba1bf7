#include "engine/server/output/choice_stream.h"

#include <algorithm>
#include <boost/json.hpp>

namespace kvfleet::server {
namespace json = boost::json;

ChoiceStream::ChoiceStream(std::vector<std::string> stop) : stop_(std::move(stop)) {
  for (const auto& s : stop_) hold_ = std::max(hold_, s.size() - 1);
}

std::string ChoiceStream::push(const RequestOutput& o) {
  num_prompt_tokens_ = o.num_prompt_tokens;
  num_cached_tokens_ = o.num_cached_tokens;
  tokens_.insert(tokens_.end(), o.new_tokens.begin(), o.new_tokens.end());
  logprobs_.insert(logprobs_.end(), o.logprobs.begin(), o.logprobs.end());
  decoded_ += o.text;  // decoded once, on the engine thread (GenerationRequest::detokenize)
  std::size_t end = decoded_.size();
  if (o.finished) {
    finish_reason_ = o.finish_reason == FinishReason::stop ? "stop" : o.finish_reason == FinishReason::length ? "length" : "abort";
    error_ = o.error;
    if (!o.stop_string.empty()) {  // the text ends before the stop string (OpenAI leaves it out)
      const auto at = decoded_.find(o.stop_string, sent_.size() > hold_ ? sent_.size() - hold_ : 0);
      if (at != std::string::npos) end = at;
    }
  } else if (hold_ > 0) {
    end = end > hold_ ? end - hold_ : 0;
    while (end > sent_.size() && (static_cast<unsigned char>(decoded_[end]) & 0xC0) == 0x80) --end;  // whole chars
  }
  if (end <= sent_.size()) return {};
  std::string piece = decoded_.substr(sent_.size(), end - sent_.size());
  sent_ += piece;
  return piece;
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
