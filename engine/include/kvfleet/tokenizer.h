// Text <-> token ids for Hugging Face BPE tokenizers (tokenizer.json), as used by the router (to hash
// prompt blocks) and the replica (prompts in, streamed text out).
//
// Supported: byte-level BPE (GPT-2, Llama-3, Qwen2/2.5/3, DeepSeek) and SentencePiece-style BPE with
// byte_fallback (Llama-2, Mistral, TinyLlama, Gemma); the GPT-2 encoder.json + vocab.bpe pair too.
// Anything else in tokenizer.json (another model type, an unknown normalizer or pre-tokenizer) makes
// load() throw std::runtime_error naming it, rather than tokenize differently from the reference.
//
// Thread-safety: a loaded Tokenizer is immutable. encode(), decode() and every other const member may
// be called concurrently from any number of threads on one const Tokenizer (the internal word cache
// is sharded and locked; so is the exact cache of long recurring sections between special tokens,
// such as a chat prompt's system message: stored on its second sighting, then not re-tokenized).
// A StreamDecoder is a small per-stream object: one thread at a time, and the Tokenizer it refers to
// must outlive it.
#pragma once

#include "kvfleet/block_hash.h"  // TokenId

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvfleet {

namespace tok {
struct TokenizerData;
}

class Tokenizer {
 public:
  // `path` is a tokenizer.json file, a model directory holding one, or a directory (or encoder.json
  // file) of the GPT-2 encoder.json + vocab.bpe pair. tokenizer_config.json and
  // generation_config.json next to it are read when present (bos/eos tokens, add_bos_token).
  // Throws std::runtime_error with the file and the reason on any problem.
  static Tokenizer load(const std::filesystem::path& path);

  // Added/special tokens in `text` are always recognised; add_special_tokens controls only what the
  // post-processor adds around the text (e.g. Llama's BOS). Throws std::invalid_argument when `text`
  // is not valid UTF-8 (the message gives the byte offset).
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const;
  // The same, except that special tokens whose text overlaps one of `plain_ranges` (sorted, disjoint
  // byte ranges [begin, end) of text, e.g. the message content inside a rendered chat prompt) are not
  // recognised there: that text is tokenized as ordinary text. Added tokens that are not special still are.
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens,
                              std::span<const std::pair<std::size_t, std::size_t>> plain_ranges) const;

  // Invalid UTF-8 produced by the ids (e.g. half of a character) comes out as U+FFFD.
  // An id outside [0, vocab_size()) (a model's padded embedding rows, a client's stray id) decodes to
  // nothing, as Hugging Face's decode does.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  std::optional<TokenId> bos_id() const;
  std::vector<TokenId> eos_ids() const;  // eos_token, plus generation_config.json's eos_token_id
  std::optional<TokenId> token_to_id(std::string_view token) const;  // token as written in the vocab
  std::optional<std::string> id_to_token(TokenId id) const;
  bool is_special(TokenId id) const;
  // The raw bytes `id` stands for in decoded output (before the UTF-8 pass and any leading-space strip);
  // empty for an unknown id.
  std::string_view token_bytes(TokenId id) const;
  std::size_t vocab_size() const;  // one past the largest id, added tokens included

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::unique_ptr<tok::TokenizerData> data);
  std::unique_ptr<tok::TokenizerData> data_;
};

// Incremental detokenizer for streaming: push ids one at a time; each call returns only text that is
// complete UTF-8, so a multi-byte character split over several tokens (byte-level BPE, <0xNN> byte
// fallback) is returned whole by the push that completes it. The concatenation of all push() results
// and flush() equals decode() of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(TokenId id);
  // Returns what is still held back (an incomplete character comes out as U+FFFD) and resets.
  std::string flush();

 private:
  const tok::TokenizerData* data_;
  bool skip_special_;
  bool at_start_ = true;  // the decoder's leading-space strip applies to the stream's first bytes
  std::size_t stripped_ = 0;
  std::string pending_;  // bytes of an incomplete trailing UTF-8 sequence
};

}  // namespace kvfleet
