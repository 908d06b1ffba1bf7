// Test-only: turns tiktoken's JS rank file (cl100k_base.json: pat_str, special_tokens, and bpe_ranks
// as "! OFFSET base64 base64 ...") into an equivalent Hugging Face tokenizer.json, so that the
// production loader is tested against tiktoken at scale without knowing that format.
#pragma once

#include <filesystem>

namespace kvfleet::test {

// Writes dir/tokenizer.json. tiktoken merges the adjacent pair whose concatenation has the lowest
// rank and returns a piece found whole in the ranks directly, so: vocab = ranks (GPT-2 byte-mapped),
// one merge per way of splitting a token into two tokens, ordered by the token's rank, and
// ignore_merges = true.
void write_tiktoken_as_tokenizer_json(const std::filesystem::path& ranks_json, const std::filesystem::path& dir);

}  // namespace kvfleet::test
