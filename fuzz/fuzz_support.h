// Helpers shared by the libFuzzer targets (fuzz/<target>.cpp). A target reports a finding by aborting
// (libFuzzer saves the input as a crash): an exception of a type the API does not promise, a broken
// invariant, or a sanitizer report. Exceptions the API documents for bad input are the expected outcome.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace kvfleet::fuzz {

[[noreturn]] inline void finding(std::string_view what, std::string_view detail = {}) {
  std::fprintf(stderr, "FUZZ FINDING: %.*s: %.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input cut at the first occurrence of `separator`: (before, after); no separator: (all, "").
inline std::pair<std::string_view, std::string_view> split_once(std::string_view in, std::string_view separator) {
  const auto at = in.find(separator);
  if (at == std::string_view::npos) return {in, {}};
  return {in.substr(0, at), in.substr(at + separator.size())};
}

// The checkout the target was built from (test fixtures: real tokenizers, chat templates). The
// KVFLEET_SOURCE_DIR environment variable overrides the compiled-in path (a moved checkout).
inline std::filesystem::path source_dir() {
  if (const char* env = std::getenv("KVFLEET_SOURCE_DIR"); env && *env) return env;
  return KVFLEET_SOURCE_DIR;
}

}  // namespace kvfleet::fuzz
