// bench_kv_tiers: time to first token of a returning conversation whose long prefix was evicted from the
// device pool: recomputed (no tiers), found in the device pool (`device`: not evicted, the best case), copied back from the host tier, read back from the disk tier (its files
// in the page cache: `disk`; pushed out of it with posix_fadvise(DONTNEED) before each return: `disk_cold`).
//   build/bin/bench_kv_tiers [--tokens 4096] [--reps 5] [--warmup 1] [--threads 2] [--layers 4] [--hidden 256]
//                            [--kv-heads 4] [--no-reuse-prompts 8]
// One engine per mode in one process, the modes interleaved rep by rep, so the machine's load hits all
// alike; the --warmup reps are not counted; reported: the median TTFT per mode and recompute / mode, the ratio the tiers are for. Each rep:
// the conversation (--tokens prompt tokens, 1 output token), two unrelated prompts of the same length that
// push it out of a device pool just big enough for one, then the conversation again (timed: from submit to
// its first token). The model is random (llama, bf16 weights, f32 KV cache, 16-token blocks) with the given
// shape (head size 64): a KV block of all layers is 2 x kv_heads x 16 x 64 x 4 bytes x layers (128 KiB by
// default). The host and disk tiers hold three long prompts, so they recycle memory and files as full ones do.
// Block moves: a tier's move rate is the bytes it brought back (cached tokens' blocks) over the time its return
// took beyond a device hit's (TTFT - TTFT(device)): read, verify and copy into device blocks, end to end. The
// host tier's is set against memcpy of the same bytes in the same block-sized pieces (measured here, buffers
// already touched); bench/kv_tier_moves.sh sets the cold disk's against fio's sequential read.
// No reuse (`no_reuse` in the output): what the tiers cost when nothing comes back. Each rep sends
// --no-reuse-prompts prompts of --tokens / 2 tokens that share nothing (fresh ones every rep) one after the
// other through the engines without tiers, with the host tier and with the disk tier, the engines' order
// rotating rep by rep; reported: the median seconds per engine and each tier's cost over none (every block
// committed is written to disk, every block evicted is copied to the host tier, and none is read back), and
// the seconds each tier spent storing blocks over the engine's step seconds in those rounds (the share that
// does not depend on the machine's load as the wall-clock ratio does).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model.h"

using namespace kvfleet;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  int tokens = 4096, reps = 5, warmup = 1, layers = 4, hidden = 256, kv_heads = 4, no_reuse_prompts = 8;
  unsigned threads = 2;
};

std::vector<TokenId> prompt(int n, int seed, int vocab) {
  std::vector<TokenId> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<TokenId>((seed * 7919 + i * 104729 + i / 7) % vocab);
  return out;
}

// Runs one request to its end; returns (seconds to its first token, cached tokens).
std::pair<double, int> run(Engine& engine, const std::vector<TokenId>& tokens) {
  GenerationRequest r;
  r.prompt = tokens;
  r.max_tokens = 1;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  std::promise<std::pair<double, int>> done;
  const auto t0 = Clock::now();
  double first = -1.0;
  engine.submit(r, [&](const RequestOutput& o) {
    if (first < 0 && !o.new_tokens.empty()) first = std::chrono::duration<double>(Clock::now() - t0).count();
    if (o.finished) done.set_value({first, o.num_cached_tokens});
  });
  auto result = done.get_future().get();
  engine.wait_idle();
  return result;
}

void drop_page_cache(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--tokens") o.tokens = std::stoi(v);
    else if (a == "--reps") o.reps = std::stoi(v);
    else if (a == "--warmup") o.warmup = std::stoi(v);
    else if (a == "--threads") o.threads = static_cast<unsigned>(std::stoi(v));
    else if (a == "--layers") o.layers = std::stoi(v);
    else if (a == "--hidden") o.hidden = std::stoi(v);
    else if (a == "--kv-heads") o.kv_heads = std::stoi(v);
    else if (a == "--no-reuse-prompts") o.no_reuse_prompts = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const fs::path root = fs::temp_directory_path() / ("kvfleet-bench-kv-tiers-" + std::to_string(::getpid()));
  fs::create_directories(root);
  MakeModelOptions mo;
  mo.layers = o.layers;
  mo.hidden = o.hidden;
  mo.heads = o.hidden / 64;
  mo.kv_heads = o.kv_heads;
  mo.intermediate = o.hidden * 11 / 4;
  mo.vocab = 4096;
  mo.max_position = o.tokens + 64;
  mo.dtype = DType::bf16;
  make_model(mo, root / "model");
  const Model model = Model::load(root / "model");

  const int block = 16;
  EngineConfig base;
  base.num_blocks = o.tokens / block + 8;  // one long prompt at a time
  base.scheduler.max_num_batched_tokens = 2048;
  base.backend.kind = "cpu";
  base.backend.threads = o.threads;
  std::map<std::string, EngineConfig> configs{{"recompute", base}, {"host", base}, {"disk", base}};
  // Room for three long prompts: the tiers recycle their memory and files from the second rep on, as a
  // replica's do once they are full (a buffer's first use costs page faults: see engine/kvtier/stored_block.h).
  const std::int64_t prompt_bytes = static_cast<std::int64_t>(o.tokens) * 2 * o.kv_heads * 64 * 4 * o.layers;
  configs["host"].kv_tiers.host_bytes = 3 * prompt_bytes + (8 << 20);
  configs["disk"].kv_tiers.disk_dir = (root / "disk").string();
  configs["disk"].kv_tiers.disk_bytes = 3 * prompt_bytes + (8 << 20);
  std::map<std::string, std::unique_ptr<Engine>> engines;
  for (const auto& [name, c] : configs) engines[name] = std::make_unique<Engine>(model, c);

  const auto convo = prompt(o.tokens, 1, 4096);
  std::map<std::string, std::vector<double>> ttft;
  std::map<std::string, int> cached;
  const std::vector<std::string> modes{"device", "recompute", "host", "disk", "disk_cold"};
  for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
    for (const std::string& mode : modes) {
      Engine& e = *engines[mode == "disk_cold" ? "disk" : mode == "device" ? "recompute" : mode];
      run(e, convo);  // the conversation's first turn (on later reps a hit: it is cached by then)
      if (mode != "device") {  // device: the conversation comes back while its blocks are still in the pool
        run(e, prompt(o.tokens, 100 + 2 * rep, 4096));
        run(e, prompt(o.tokens, 101 + 2 * rep, 4096));
      }
      if (mode == "disk_cold") drop_page_cache(root / "disk");
      const auto [seconds, hit] = run(e, convo);
      if (rep < o.warmup) continue;
      ttft[mode].push_back(seconds);
      cached[mode] = hit;
    }
  }
  // No reuse: distinct prompts through each engine, the order of the engines rotating rep by rep.
  const std::vector<std::string> plain{"recompute", "host", "disk"};
  std::map<std::string, std::vector<double>> no_reuse;
  // Seconds the tier spent storing blocks over the engine's step seconds, in the same rounds: the host tier's
  // copies run on the engine thread, inside its steps; the disk tier's writes on the I/O threads, beside them.
  std::map<std::string, std::vector<double>> offload_share;
  for (int rep = 0; rep < o.warmup + o.reps; ++rep) {
    for (std::size_t k = 0; k < plain.size(); ++k) {
      const std::string& name = plain[(k + static_cast<std::size_t>(rep)) % plain.size()];
      const EngineStats before = engines[name]->stats();
      const auto t0 = Clock::now();
      for (int i = 0; i < o.no_reuse_prompts; ++i) run(*engines[name], prompt(o.tokens / 2, 1000 + 1000 * rep + 100 * static_cast<int>(k) + i, 4096));
      if (rep < o.warmup) continue;
      no_reuse[name].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      const EngineStats after = engines[name]->stats();
      if (name == "recompute") continue;
      const auto m = static_cast<std::size_t>(name == "host" ? KvMedium::host : KvMedium::disk);
      offload_share[name].push_back((after.kv_tiers.media[m].offload_seconds - before.kv_tiers.media[m].offload_seconds) /
                                    (after.step_seconds - before.step_seconds));
    }
  }
  const KvCacheShape shape{o.layers, 0, block, o.kv_heads, 64};
  const std::size_t block_bytes = static_cast<std::size_t>(shape.block_elems()) * 4 * static_cast<std::size_t>(o.layers);
  // memcpy of a prompt's blocks, one block at a time, between buffers already touched.
  std::vector<double> memcpy_gbps;
  {
    const std::size_t bytes = static_cast<std::size_t>(o.tokens / block) * block_bytes;
    std::vector<char> from(bytes, 1), to(bytes, 2);
    for (int rep = 0; rep < std::max(5, o.reps); ++rep) {
      const auto t0 = Clock::now();
      for (std::size_t at = 0; at < bytes; at += block_bytes) std::memcpy(to.data() + at, from.data() + at, block_bytes);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (to[static_cast<std::size_t>(rep) % bytes] != 1) return 1;  // (keeps the copy)
      memcpy_gbps.push_back(static_cast<double>(bytes) / s / 1e9);
    }
  }
  std::printf("{\"tokens\":%d,\"layers\":%d,\"hidden\":%d,\"kv_heads\":%d,\"block_kib\":%lld,\"threads\":%u,\"reps\":%d",
              o.tokens, o.layers, o.hidden, o.kv_heads, static_cast<long long>(shape.block_elems() * 4 * o.layers / 1024),
              o.threads, o.reps);
  const double recompute = median(ttft["recompute"]);
  const double device = median(ttft["device"]);
  for (const std::string& mode : modes) {
    std::printf(",\"%s\":{\"ttft_ms\":%.2f,\"cached_tokens\":%d,\"speedup\":%.2f", mode.c_str(), 1e3 * median(ttft[mode]),
                cached[mode], recompute / median(ttft[mode]));
    const double extra = median(ttft[mode]) - device;
    if (mode != "device" && mode != "recompute" && extra > 0)
      std::printf(",\"move_gbps\":%.3f", static_cast<double>(cached[mode] / block) * block_bytes / extra / 1e9);
    std::printf("}");
  }
  std::printf(",\"memcpy_gbps\":%.3f", median(memcpy_gbps));
  const double off = median(no_reuse["recompute"]);
  std::printf(",\"no_reuse\":{\"prompts\":%d,\"prompt_tokens\":%d,\"off_s\":%.3f,\"host_s\":%.3f,\"disk_s\":%.3f,"
              "\"host_cost\":%.4f,\"disk_cost\":%.4f,\"host_offload_share\":%.4f,\"disk_offload_share\":%.4f}}\n",
              o.no_reuse_prompts, o.tokens / 2, off, median(no_reuse["host"]), median(no_reuse["disk"]),
              median(no_reuse["host"]) / off - 1.0, median(no_reuse["disk"]) / off - 1.0, median(offload_share["host"]),
              median(offload_share["disk"]));
  for (const auto& [name, medium] : {std::pair{"host", KvMedium::host}, std::pair{"disk", KvMedium::disk}}) {
    const EngineStats st = engines[name]->stats();
    const KvTierMediumStats& m = st.kv_tiers.media[static_cast<std::size_t>(medium)];
    std::fprintf(stderr, "%s: onload %.1f MiB in %.1f ms (%.2f GB/s), offload %.1f MiB in %.1f ms, steps %llu step %.1f ms forward %.1f ms\n", name,
                 static_cast<double>(m.onload_bytes) / (1 << 20), 1e3 * m.onload_seconds,
                 static_cast<double>(m.onload_bytes) / m.onload_seconds / 1e9, static_cast<double>(m.offload_bytes) / (1 << 20),
                 1e3 * m.offload_seconds, static_cast<unsigned long long>(st.steps), 1e3 * st.step_seconds, 1e3 * st.forward_seconds);
  }
  engines.clear();
  fs::remove_all(root);
  return 0;
}
