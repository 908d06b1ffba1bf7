#include "engine/cli/common.h"

#include <charconv>
#include <stdexcept>

namespace kvfleet::cli {

std::vector<TokenId> parse_ids(const std::string& text) {
  std::vector<TokenId> ids;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    std::string_view item(text.data() + start, end - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    TokenId id = 0;
    const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || id < 0)
      throw std::invalid_argument("--ids: '" + std::string(item) + "' is not a token id (expected e.g. 1,2,3)");
    ids.push_back(id);
    start = end + 1;
  }
  return ids;
}

void add_backend_options(CLI::App& cmd, BackendOptions& o) {
  cmd.add_option("--backend", o.kind, "cpu, cuda or auto (CUDA when a GPU is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd.add_option("--threads", o.threads, "CPU threads (0: all cores)");
  cmd.add_option("--kv-cache-dtype", o.kv_cache_dtype, "KV cache element type: auto, float32, bfloat16 or float16")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"}));
}

}  // namespace kvfleet::cli
