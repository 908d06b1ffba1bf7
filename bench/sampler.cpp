// sample() against sample_reference() (the full sort it replaced), interleaved in one run, on logits shaped
// like a trained model's (a normal spread of std 0.5, 2 and 4 over the vocabulary), in the modes a chat user
// runs. Times are wall time per draw; run an older binary beside this one for an old-vs-new ratio.
//
//   build/bin/bench_sampler [--vocab 151936] [--reps 200]
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kvfleet/sampler.h"

using namespace kvfleet;

int main(int argc, char** argv) {
  std::size_t vocab = 151936;
  int reps = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--vocab") vocab = std::stoul(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
  }
  std::mt19937 rng(1);
  SamplerScratch scratch;
  std::printf("vocab %zu, %d draws each, interleaved\n", vocab, reps);
  for (const float spread : {0.5f, 2.0f, 4.0f}) {
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> logits(vocab);
    for (auto& l : logits) l = normal(rng);
    struct Setting { const char* name; SamplingParams p; };
    Setting settings[] = {{"temperature 1", {}}, {"top_k 50", {}}, {"top_p 0.9", {}}, {"greedy", {}},
                          {"t 0.7 top_p 0.9", {}}, {"min_p 0.05", {}}};
    settings[1].p.top_k = 50;
    settings[2].p.top_p = 0.9f;
    settings[3].p.temperature = 0.0f;
    settings[4].p.temperature = 0.7f;
    settings[4].p.top_p = 0.9f;
    settings[5].p.min_p = 0.05f;
    for (auto& [name, p] : settings) {
      double t_ref = 0, t_new = 0;
      std::uint64_t agree = 0;
      for (int i = 0; i < reps; ++i) {
        p.seed = static_cast<std::uint64_t>(i);
        auto t0 = std::chrono::steady_clock::now();
        const TokenId a = sample_reference(logits, p, 0);
        auto t1 = std::chrono::steady_clock::now();
        const TokenId b = sample(logits, p, 0, scratch);
        auto t2 = std::chrono::steady_clock::now();
        t_ref += std::chrono::duration<double>(t1 - t0).count();
        t_new += std::chrono::duration<double>(t2 - t1).count();
        agree += a == b;
      }
      std::printf("logit std %.1f, %-15s: full sort %8.1f us | sample %8.1f us (%.1fx), same token %llu/%d\n", spread,
                  name, t_ref / reps * 1e6, t_new / reps * 1e6, t_ref / t_new, static_cast<unsigned long long>(agree), reps);
    }
  }
  return 0;
}
