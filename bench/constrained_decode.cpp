// Constrained decoding's cost to a batch: the engine fills the constrained rows' token masks on its mask
// worker while the step's forward pass runs, so unconstrained sequences in the same batch should not step
// slower. Runs the same batch of B + C sequences twice on a small CPU model: (a) all unconstrained, (b) C of
// them constrained by a grammar whose mask costs --mask-us microseconds per row (a busy loop standing in for
// a grammar engine; it allows every token but one stripe, so sampling is as in (a)). Prints the mean step
// time of each run and the mask work per step that (b) hid behind its forward passes (a serial engine would
// add all of it).
//
// --sleep makes the mask's cost a sleep instead of a busy loop: the overlap itself, on a machine without a spare
// core for the mask worker (a busy loop there competes with the forward for the CPU, and the engine thread
// fills what the worker did not reach: the serial cost at worst).
//
//   build/bin/bench_constrained_decode [--threads 1] [--batch 8] [--constrained 4] [--mask-us 200] [--sleep 0|1]
//                                      [--tokens 64] [--vocab 32000] [--rounds 3]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <string>
#include <thread>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"

using namespace kvfleet;

namespace {

class BusyGrammar final : public TokenGrammar {
 public:
  BusyGrammar(std::size_t vocab, double mask_us, bool sleep) : vocab_(vocab), mask_us_(mask_us), sleep_(sleep) {}
  std::unique_ptr<TokenMatcher> make_matcher() const override { return std::make_unique<Matcher>(*this); }
  std::size_t vocab_size() const override { return vocab_; }

 private:
  class Matcher final : public TokenMatcher {
   public:
    explicit Matcher(const BusyGrammar& g) : g_(g) {}
    void fill_next_token_mask(std::span<std::uint32_t> mask) override {
      const auto cost = std::chrono::duration<double, std::micro>(g_.mask_us_);
      if (g_.sleep_) std::this_thread::sleep_for(cost);
      for (const auto until = std::chrono::steady_clock::now() + cost; !g_.sleep_ && std::chrono::steady_clock::now() < until;) {
      }
      std::fill(mask.begin(), mask.end(), ~0u);
      mask[(accepted_ * 7) % mask.size()] = 0u;  // one stripe of 32 ids forbidden, moving token by token
      if (g_.vocab_ % 32) mask.back() &= (1u << (g_.vocab_ % 32)) - 1u;
    }
    bool accept_token(TokenId) override {
      ++accepted_;
      return true;
    }
    void rollback(std::size_t n) override { accepted_ -= n; }
    bool is_terminated() const override { return false; }

   private:
    const BusyGrammar& g_;
    std::size_t accepted_ = 0;
  };
  std::size_t vocab_;
  double mask_us_;
  bool sleep_;
};

struct Run {
  double step_ms = 0.0, forward_ms = 0.0;
  std::uint64_t steps = 0;
};

Run run(const Model& model, int threads, int batch, int constrained, double mask_us, bool sleep, int tokens) {
  EngineConfig c;
  c.backend.kind = "cpu";
  c.backend.threads = threads;
  c.num_blocks = 2048;
  c.scheduler.max_num_seqs = batch + constrained;
  auto grammar = std::make_shared<BusyGrammar>(static_cast<std::size_t>(model.config().vocab_size), mask_us, sleep);
  Engine engine(model, c);
  for (int i = 0; i < batch + constrained; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 32; ++k) r.prompt.push_back(static_cast<TokenId>((i * 131 + k * 17) % 1000));
    r.max_tokens = tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    if (i >= batch && mask_us >= 0) r.grammar = grammar;
    engine.submit(r, nullptr);
  }
  engine.wait_idle();
  const EngineStats s = engine.stats();
  return {1e3 * s.step_seconds / static_cast<double>(s.steps), 1e3 * s.forward_seconds / static_cast<double>(s.steps), s.steps};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, batch = 8, constrained = 4, tokens = 64, vocab = 32000, rounds = 3;
  double mask_us = 200.0;
  bool sleep = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--batch") batch = std::stoi(argv[i + 1]);
    else if (a == "--constrained") constrained = std::stoi(argv[i + 1]);
    else if (a == "--mask-us") mask_us = std::stod(argv[i + 1]);
    else if (a == "--sleep") sleep = std::stoi(argv[i + 1]) != 0;
    else if (a == "--tokens") tokens = std::stoi(argv[i + 1]);
    else if (a == "--vocab") vocab = std::stoi(argv[i + 1]);
    else if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  const auto dir = std::filesystem::temp_directory_path() / ("kvfleet_bench_constrained_" + std::to_string(::getpid()));
  MakeModelOptions o;
  o.vocab = vocab;
  o.layers = 4;
  make_model(o, dir);
  const Model model = Model::load(dir);
  std::printf("batch %d unconstrained + %d rows, mask %.0f us (%s) per constrained row, %d tokens, %d threads\n", batch,
              constrained, mask_us, sleep ? "sleep" : "busy", tokens, threads);
  for (int r = 0; r < rounds; ++r) {  // interleaved, so that a noisy neighbour hits both alike
    const Run plain = run(model, threads, batch, constrained, -1.0, sleep, tokens);
    const Run masked = run(model, threads, batch, constrained, mask_us, sleep, tokens);
    std::printf("round %d: all unconstrained %.3f ms/step (forward %.3f) | %d constrained %.3f ms/step (forward %.3f)"
                " | mask work per step %.3f ms | step time added %.3f ms\n",
                r, plain.step_ms, plain.forward_ms, constrained, masked.step_ms, masked.forward_ms,
                constrained * mask_us / 1e3, masked.step_ms - plain.step_ms);
  }
  std::filesystem::remove_all(dir);
}
