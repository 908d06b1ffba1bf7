// The public Tokenizer: picks a loader for the path, runs the encode pipeline, answers vocab queries.
#include "engine/core/tokenizer/parts.h"
#include "engine/core/tokenizer/section_cache.h"

#include <stdexcept>

namespace kvfleet {
namespace fs = std::filesystem;

tok::TokenizerData::TokenizerData() : section_cache(std::make_unique<SectionCache>()) {}
tok::TokenizerData::~TokenizerData() = default;

Tokenizer Tokenizer::load(const fs::path& path) {
  if (fs::is_directory(path)) {
    if (fs::exists(path / "tokenizer.json")) return Tokenizer(tok::load_tokenizer_json(path / "tokenizer.json"));
    if (fs::exists(path / "encoder.json") && fs::exists(path / "vocab.bpe")) {
      return Tokenizer(tok::load_gpt2_pair(path / "encoder.json", path / "vocab.bpe"));
    }
    throw std::runtime_error("tokenizer: " + path.string() +
                             " holds neither tokenizer.json nor encoder.json + vocab.bpe");
  }
  if (!fs::exists(path)) throw std::runtime_error("tokenizer: " + path.string() + " does not exist");
  if (path.filename() == "encoder.json") {
    return Tokenizer(tok::load_gpt2_pair(path, path.parent_path() / "vocab.bpe"));
  }
  return Tokenizer(tok::load_tokenizer_json(path));
}

Tokenizer::Tokenizer(std::unique_ptr<tok::TokenizerData> data) : data_(std::move(data)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return encode(text, add_special_tokens, {});
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens,
                                       std::span<const std::pair<std::size_t, std::size_t>> plain_ranges) const {
  if (const std::size_t bad = tok::utf8_find_invalid(text); bad != tok::npos) {
    throw std::invalid_argument("tokenizer: input is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  }
  const tok::TokenizerData& d = *data_;
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), d.prefix_ids.begin(), d.prefix_ids.end());

  std::vector<tok::AddedTokenMatcher::Section> sections;
  d.added.split(text, sections, plain_ranges);
  tok::Pieces pieces;
  for (const auto& section : sections) {
    if (section.token >= 0) {
      ids.push_back(d.added.tokens()[section.token].id);
      continue;
    }
    if (section.begin == section.end) continue;
    const std::string_view raw = text.substr(section.begin, section.end - section.begin);
    const bool first = section.begin == 0;
    if (d.section_cache->find(raw, first, ids)) continue;
    const std::size_t section_start = ids.size();
    pieces.text.assign(raw);
    if (d.normalizer) d.normalizer->normalize(pieces.text);
    if (pieces.text.empty()) continue;
    pieces.spans.assign(1, {0, pieces.text.size()});
    if (d.pre_tokenizer) d.pre_tokenizer->apply(pieces, first);
    for (const tok::Span& span : pieces.spans) {
      d.model->encode_word(std::string_view(pieces.text).substr(span.begin, span.end - span.begin), ids);
    }
    d.section_cache->offer(raw, first, ids.data() + section_start, ids.size() - section_start);
  }
  if (add_special_tokens) ids.insert(ids.end(), d.suffix_ids.begin(), d.suffix_ids.end());
  return ids;
}

std::optional<TokenId> Tokenizer::bos_id() const { return data_->bos; }

std::vector<TokenId> Tokenizer::eos_ids() const { return data_->eos; }

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = data_->token_to_id.find(token);
  if (it == data_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= data_->id_to_token.size()) return std::nullopt;
  const std::string& token = data_->id_to_token[id];
  if (token.empty()) return std::nullopt;  // a hole in the id space
  return token;
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<std::size_t>(id) < data_->is_special.size() && data_->is_special[id];
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= data_->decoder.bytes.size()) return {};
  return data_->decoder.bytes[id];
}

std::size_t Tokenizer::vocab_size() const { return data_->id_to_token.size(); }

}  // namespace kvfleet
