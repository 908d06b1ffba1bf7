// Internal pieces of the tokenizer (not a public header). The pipeline, as in Hugging Face tokenizers:
//   added-token split -> normalizer -> pre-tokenizer -> BPE model -> post-processor (BOS/EOS)
// and for the way back a per-id byte table built from the decoder config.
#pragma once

#include "kvfleet/tokenizer.h"

#include <boost/json/value.hpp>

#include <array>
#include <bit>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvfleet::tok {

class SectionCache;

// string -> id maps that accept string_view lookups without building a std::string.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

// ---- utf8.cpp -------------------------------------------------------------------------------------
inline constexpr std::size_t npos = static_cast<std::size_t>(-1);
// Byte offset of the first invalid UTF-8 sequence in s, or npos when s is valid.
std::size_t utf8_find_invalid(std::string_view s);
// Decodes the (valid) sequence at s[i]; sets len to its length.
char32_t utf8_decode(std::string_view s, std::size_t i, std::size_t& len);
void utf8_append(std::string& out, char32_t cp);
// Appends `bytes` to `out`, each invalid sequence replaced by one U+FFFD (the WHATWG rule). When
// keep_tail is set, a trailing sequence that is incomplete but could still become valid is not
// consumed. Returns the number of bytes consumed.
std::size_t utf8_append_lossy(std::string& out, std::string_view bytes, bool keep_tail);
bool is_unicode_space(char32_t cp);  // White_Space, as JavaScript's trim() sees it (plus U+FEFF)
// GPT-2's reversible byte <-> printable code point mapping.
const std::array<char32_t, 256>& byte_to_unicode();
std::optional<std::uint8_t> unicode_to_byte(char32_t cp);

// ---- regex.cpp ------------------------------------------------------------------------------------
struct Span {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// A PCRE2 pattern compiled with UTF + UCP and JIT. find_all is const and thread-safe.
class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Appends every non-empty, non-overlapping match in s[begin, end) (offsets into s).
  void find_all(std::string_view s, Span range, std::vector<Span>& out) const;

 private:
  void* code_;  // pcre2_code_8*, kept opaque so that pcre2.h stays in regex.cpp
};

// ---- normalizers.cpp ------------------------------------------------------------------------------
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};
// nullptr for a null config; throws std::runtime_error for an unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const boost::json::value& config);

// ---- pre_tokenizers.cpp ---------------------------------------------------------------------------
// One text section during pre-tokenization: its bytes and the pieces it is split into so far.
struct Pieces {
  std::string text;
  std::vector<Span> spans;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // first_section: this section starts at offset 0 of the input (Metaspace prepend_scheme "first").
  virtual void apply(Pieces& pieces, bool first_section) const = 0;
  // True when a ByteLevel step is present: the model then works on raw bytes (see BpeModel).
  virtual bool byte_level() const { return false; }
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const boost::json::value& config);
// The GPT-2 split pattern (ByteLevel's use_regex).
extern const char* const kGpt2Pattern;

// ---- merge_table.cpp ------------------------------------------------------------------------------
// (left id, right id) -> (rank, merged id): the BPE hot path's only lookup. Open addressing with
// linear probing over a power-of-two table, built once and read-only afterwards.
class MergeTable {
 public:
  struct Merge {
    std::uint32_t rank;
    TokenId merged;
  };
  explicit MergeTable(std::size_t expected = 0);
  // Keeps the first entry for a pair (the lowest rank when filled in rank order).
  void insert(TokenId left, TokenId right, Merge merge);
  const Merge* find(TokenId left, TokenId right) const {
    if (left < 0 || right < 0) return nullptr;
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return &e.merge;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  struct Entry {
    std::uint64_t key = kEmpty;
    Merge merge{};
  };
  static std::uint64_t pack(TokenId left, TokenId right) {
    return (std::uint64_t(std::uint32_t(left)) << 32) | std::uint32_t(right);
  }
  std::size_t slot(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void grow();
  std::vector<Entry> entries_;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t size_ = 0;
};

// ---- bpe_model.cpp --------------------------------------------------------------------------------
struct BpeOptions {
  bool byte_level = false;  // vocab strings are GPT-2 byte-mapped; words arrive as raw bytes
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  std::optional<TokenId> unk_id;
};

// Rank-based BPE over token ids: a word starts as one symbol per character (per byte when byte
// level), and the adjacent pair with the lowest merge rank (leftmost on ties) is merged until none
// is left. Results per word are cached (bounded, sharded, locked), so encode_word is thread-safe.
class BpeModel {
 public:
  BpeModel(const std::vector<std::pair<std::string, TokenId>>& vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  ~BpeModel();
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;
  struct Symbol {
    TokenId id;  // -1: a character outside the vocab
    std::uint32_t begin;  // bytes of the word it covers
    std::uint32_t len;
    std::int32_t prev;
    std::int32_t next;
  };

 private:
  using Merge = MergeTable::Merge;
  struct Cache;
  std::optional<TokenId> lookup(std::string_view model_key) const;
  const Merge* merge_of(TokenId left, TokenId right) const { return merges_.find(left, right); }
  void note_word_crossing(std::string_view merged);
  std::size_t next_word_start(std::string_view word, std::size_t from) const;
  void encode_piece(std::string_view word, std::vector<TokenId>& out) const;
  void merge_small(std::vector<Symbol>& symbols) const;
  void merge_large(std::vector<Symbol>& symbols) const;
  void emit(std::string_view word, const std::vector<Symbol>& symbols, std::vector<TokenId>& out) const;
  std::string model_key(std::string_view vocab_string) const;

  BpeOptions options_;
  StringMap vocab_;  // model-space key (raw bytes when byte level)
  MergeTable merges_;
  bool split_words_ = true;  // SentencePiece: words may be cut before U+2581 (see bpe_model.cpp)
  std::vector<char32_t> no_cut_after_;  // ... except after these characters
  std::array<TokenId, 256> byte_ids_{};  // byte level: byte -> id; byte_fallback: byte -> <0xNN>
  std::array<TokenId, 128> ascii_ids_{};  // not byte level: ASCII character -> id, -1 if absent
  std::unique_ptr<Cache> cache_;
};

// ---- added_tokens.cpp -----------------------------------------------------------------------------
struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// Finds added tokens in raw text, leftmost-longest (a byte trie), before normalization.
class AddedTokenMatcher {
 public:
  struct Section {
    std::size_t begin = 0;
    std::size_t end = 0;
    int token = -1;  // index into tokens(), or -1 for plain text
  };
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  // Splits text into plain and added-token sections; lstrip/rstrip whitespace is cut from the
  // neighbouring plain sections (which may become empty). A special token whose text overlaps one of
  // `plain` (sorted, disjoint byte ranges) is not recognised there: that text stays plain.
  void split(std::string_view text, std::vector<Section>& out,
             std::span<const std::pair<std::size_t, std::size_t>> plain = {}) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  int longest_match(std::string_view text, std::size_t pos) const;
  bool word_boundary_ok(std::string_view text, std::size_t begin, std::size_t end) const;
  std::vector<AddedToken> tokens_;
  std::vector<int> node_token_;  // trie node -> token index or -1
  std::unordered_map<std::uint32_t, int> edges_;  // (node << 8 | byte) -> child node
  std::array<bool, 256> first_byte_{};
};

// ---- decoder.cpp ----------------------------------------------------------------------------------
// The decoder config reduced to data: the bytes each id decodes to, plus how many leading spaces the
// whole output loses (Strip decoder, Metaspace's prefix space).
struct DecoderTable {
  std::vector<std::string> bytes;
  std::size_t strip_leading_spaces = 0;
};
DecoderTable make_decoder_table(const boost::json::value& config, const std::vector<std::string>& id_to_token);

// ---- everything, as loaded (tokenizer.cpp runs the pipeline) --------------------------------------
struct TokenizerData {
  TokenizerData();
  ~TokenizerData();
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  AddedTokenMatcher added;
  std::vector<TokenId> prefix_ids;  // post-processor, with add_special_tokens
  std::vector<TokenId> suffix_ids;
  DecoderTable decoder;
  std::vector<std::string> id_to_token;  // "" for holes
  StringMap token_to_id;
  std::vector<std::uint8_t> is_special;
  std::optional<TokenId> bos;
  std::vector<TokenId> eos;
  // Exact results of long recurring sections (section_cache.h); logically const: a cache.
  std::unique_ptr<SectionCache> section_cache;
};

// ---- loaders --------------------------------------------------------------------------------------
// json_loader.cpp: tokenizer.json (+ tokenizer_config.json / generation_config.json in `dir`).
std::unique_ptr<TokenizerData> load_tokenizer_json(const std::filesystem::path& file);
// gpt2_loader.cpp: GPT-2's encoder.json + vocab.bpe.
std::unique_ptr<TokenizerData> load_gpt2_pair(const std::filesystem::path& encoder_json,
                                              const std::filesystem::path& vocab_bpe);
// json_loader.cpp: shared helpers.
boost::json::value read_json_file(const std::filesystem::path& file);
// Reads tokenizer_config.json / generation_config.json in dir when present: bos, eos and, unless the
// post-processor already adds special tokens, add_bos_token / add_eos_token.
void read_model_configs(TokenizerData& data, const std::filesystem::path& dir, bool post_processor_adds);
void index_vocab(TokenizerData& data, const std::vector<std::pair<std::string, TokenId>>& vocab,
                 const std::vector<AddedToken>& added);

}  // namespace kvfleet::tok
