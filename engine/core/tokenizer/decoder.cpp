// Decoding. The decoder config (ByteLevel; Metaspace; Sequence of Replace / ByteFallback / Fuse /
// Strip) is reduced at load time to data: the bytes every id stands for, and how many leading spaces
// the whole output loses. Decoding is then a concatenation plus a lossy UTF-8 pass, and the stream
// decoder can do exactly the same thing incrementally.
#include "engine/core/tokenizer/parts.h"

#include <boost/json.hpp>

#include <stdexcept>

namespace kvfleet::tok {
namespace json = boost::json;
namespace {

// As Hugging Face does: a token with a character outside GPT-2's mapping (a special token such as
// DeepSeek's "<｜begin▁of▁sentence｜>") stands for its own UTF-8 bytes.
std::string byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0, len = 0; i < token.size(); i += len) {
    const auto byte = unicode_to_byte(utf8_decode(token, i, len));
    if (!byte) return std::string(token);
    out.push_back(static_cast<char>(*byte));
  }
  return out;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  for (std::size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
}

// "<0xAB>" -> the byte 0xAB.
std::optional<char> byte_fallback(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return std::nullopt;
  unsigned value = 0;
  for (const char c : token.substr(3, 2)) {
    const int digit = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + static_cast<unsigned>(digit);
  }
  return static_cast<char>(value);
}

// One decoder step applied to one (non-added) token; may raise table.strip_leading_spaces.
void apply_step(const json::object& step, std::string& token, DecoderTable& table) {
  const std::string type(step.at("type").as_string());
  if (type == "ByteLevel") {
    token = byte_level_decode(token);
  } else if (type == "Replace") {
    const json::object& pattern = step.at("pattern").as_object();
    const auto* from = pattern.if_contains("String");
    if (!from) throw std::runtime_error("tokenizer: Replace decoder with a regex is not supported");
    replace_all(token, from->as_string(), step.at("content").as_string());
  } else if (type == "ByteFallback") {
    if (const auto byte = byte_fallback(token)) token.assign(1, *byte);
  } else if (type == "Fuse") {
    // Concatenation is what decoding does anyway.
  } else if (type == "Strip") {
    const std::string content(step.at("content").as_string());
    if (content != " ") throw std::runtime_error("tokenizer: Strip decoder only strips spaces");
    table.strip_leading_spaces = static_cast<std::size_t>(step.at("start").to_number<std::int64_t>());
  } else if (type == "Metaspace") {
    const auto* r = step.if_contains("replacement");
    replace_all(token, r ? std::string_view(r->as_string()) : "\xE2\x96\x81", " ");
    const auto* scheme = step.if_contains("prepend_scheme");
    const auto* add = step.if_contains("add_prefix_space");
    const bool prepends = scheme ? scheme->as_string() != "never" : (!add || add->as_bool());
    if (prepends) table.strip_leading_spaces = 1;
  } else {
    throw std::runtime_error("tokenizer: unsupported decoder type '" + type + "'");
  }
}

void collect_steps(const json::value& config, std::vector<const json::object*>& steps) {
  if (config.is_null()) return;
  const json::object& obj = config.as_object();
  if (obj.at("type").as_string() == "Sequence") {
    for (const json::value& step : obj.at("decoders").as_array()) collect_steps(step, steps);
  } else {
    steps.push_back(&obj);
  }
}

}  // namespace

DecoderTable make_decoder_table(const json::value& config, const std::vector<std::string>& id_to_token) {
  std::vector<const json::object*> steps;
  collect_steps(config, steps);
  DecoderTable table;
  table.bytes.resize(id_to_token.size());
  for (std::size_t id = 0; id < id_to_token.size(); ++id) {
    // Added tokens go through the decoder too (Gemma's whitespace tokens are written with U+2581).
    std::string token = id_to_token[id];
    for (const json::object* step : steps) apply_step(*step, token, table);
    table.bytes[id] = std::move(token);
  }
  return table;
}

}  // namespace kvfleet::tok

namespace kvfleet {

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  const tok::TokenizerData& d = *data_;
  std::string bytes;
  for (const TokenId id : ids) {
    // An id the tokenizer does not know (a padded embedding row) decodes to nothing, as in Hugging Face.
    if (id < 0 || static_cast<std::size_t>(id) >= d.decoder.bytes.size()) continue;
    if (skip_special_tokens && d.is_special[id]) continue;
    bytes += d.decoder.bytes[id];
  }
  std::size_t skip = 0;
  while (skip < d.decoder.strip_leading_spaces && skip < bytes.size() && bytes[skip] == ' ') ++skip;
  std::string text;
  text.reserve(bytes.size() - skip);
  tok::utf8_append_lossy(text, std::string_view(bytes).substr(skip), false);
  return text;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : data_(tokenizer.data_.get()), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(TokenId id) {
  if (id < 0 || static_cast<std::size_t>(id) >= data_->decoder.bytes.size()) return {};  // as decode()
  if (skip_special_ && data_->is_special[id]) return {};
  std::string_view bytes = data_->decoder.bytes[id];
  // The leading-space strip applies to the stream's first bytes, however many tokens they span.
  while (at_start_ && !bytes.empty()) {
    if (bytes[0] == ' ' && stripped_ < data_->decoder.strip_leading_spaces) {
      bytes.remove_prefix(1);
      ++stripped_;
    } else {
      at_start_ = false;
    }
  }
  pending_.append(bytes);
  std::string text;
  const std::size_t used = tok::utf8_append_lossy(text, pending_, true);
  pending_.erase(0, used);
  return text;
}

std::string StreamDecoder::flush() {
  std::string text;
  tok::utf8_append_lossy(text, pending_, false);
  pending_.clear();
  at_start_ = true;
  stripped_ = 0;
  return text;
}

}  // namespace kvfleet
