// The sampler as an engine step meets it: 256 rows of logits in one buffer (8 MB at vocab 8,192, out of
// L2 before each round), sampled in order by one thread with the same SamplerScratch, the next row given
// as SamplerScratch::next_row (the engine's prefetch hint). Prints the thread CPU time per row, best of 5
// rounds. bench/sampler_rows_ab.sh builds this file against an older commit's sampler (-DKVFLEET_NO_NEXT_ROW
// where SamplerScratch has no next_row) and alternates the two.
//
//   build/bin/bench_sampler_rows VOCAB LOGIT_STD TEMPERATURE TOP_P TOP_K MIN_P   (e.g. 8192 0.5 1 1 0 0)
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvfleet/sampler.h"

using namespace kvfleet;

namespace {
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: bench_sampler_rows VOCAB LOGIT_STD TEMPERATURE TOP_P TOP_K MIN_P\n");
    return 2;
  }
  const std::size_t vocab = std::stoul(argv[1]), rows = 256;
  SamplingParams p;
  p.temperature = std::stof(argv[3]);
  p.top_p = std::stof(argv[4]);
  p.top_k = std::stoi(argv[5]);
  p.min_p = std::stof(argv[6]);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, std::stof(argv[2]));
  std::vector<float> logits(vocab * rows), fresh(vocab * rows);
  for (auto& l : fresh) l = normal(rng);
  std::vector<char> evict(64 << 20, 1);  // larger than L2: the rows come from the last level, as in a step
  SamplerScratch scratch;
  double best = 1e30;
  long checksum = 0;
  for (int round = 0; round < 5; ++round) {
    std::memcpy(logits.data(), fresh.data(), fresh.size() * sizeof(float));
    for (std::size_t i = 0; i < evict.size(); i += 64) ++evict[i];
    const double t0 = thread_cpu_seconds();
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = logits.data() + r * vocab;
#ifndef KVFLEET_NO_NEXT_ROW
      scratch.next_row = r + 1 < rows ? row + vocab : nullptr;
#endif
      p.seed = r;
      checksum += sample(std::span<const float>(row, vocab), p, static_cast<std::uint64_t>(round), scratch);
    }
    best = std::min(best, (thread_cpu_seconds() - t0) * 1e6 / static_cast<double>(rows));
  }
  std::printf("%.1f us/row (checksum %ld)\n", best, checksum + evict[0]);
  return 0;
}
