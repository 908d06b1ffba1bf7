// CPU engine throughput with 1, 8 and 32 (or --batches) concurrent sequences on a small model: continuous
// batching must raise total tokens/s (each decode step reads the weights once for the whole batch). Also
// prints the engine's own share of its steps (schedule, sample, stop check, outputs: a step's wall time
// outside the forward pass, EngineStats::step_seconds - forward_seconds).
//
//   build/bin/bench_engine_throughput [--threads N] [--tokens 64] [--batches 1,8,32,256] [--temperature 0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"

using namespace kvfleet;

int main(int argc, char** argv) {
  unsigned threads = 0;
  std::int32_t tokens = 64;
  float temperature = 0.0f;
  std::vector<int> batches{1, 8, 32};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else if (a == "--tokens") tokens = std::stoi(argv[i + 1]);
    else if (a == "--temperature") temperature = std::stof(argv[i + 1]);
    else if (a == "--batches") {
      batches.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string b; std::getline(list, b, ',');) batches.push_back(std::stoi(b));
    }
  }
  const auto dir = std::filesystem::temp_directory_path() / "kvfleet-bench-model";
  MakeModelOptions o;  // ~26M parameters in bf16: a small llama
  o.layers = 4; o.hidden = 512; o.intermediate = 1536; o.heads = 8; o.kv_heads = 4; o.vocab = 8192;
  o.dtype = DType::bf16;
  make_model(o, dir);
  const Model model = Model::load(dir);
  std::printf("model: %lld layers, hidden %lld, %.1f MB of bf16 weights; %d tokens per sequence\n",
              static_cast<long long>(o.layers), static_cast<long long>(o.hidden),
              static_cast<double>(model.weight_bytes()) / 1e6, tokens);
  double base = 0.0;
  for (int batch : batches) {
    EngineConfig c;
    c.num_blocks = std::max(1024, batch * ((8 + tokens) / 16 + 2));
    c.scheduler.max_num_seqs = std::max(c.scheduler.max_num_seqs, batch);
    c.scheduler.max_num_batched_tokens = std::max(c.scheduler.max_num_batched_tokens, batch * 8);
    c.backend.kind = "cpu";
    c.backend.threads = threads;
    c.enable_prefix_caching = false;
    Engine engine(model, c);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) {
      GenerationRequest r;
      r.prompt = {1 + i, 2, 3, 4, 5, 6, 7, 8};
      r.max_tokens = tokens;
      r.ignore_eos = true;
      r.sampling.temperature = temperature;
      r.sampling.seed = static_cast<std::uint64_t>(i);
      engine.submit(r, nullptr);
    }
    engine.wait_idle();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = batch * tokens / s;
    if (batch == 1) base = tps;
    const EngineStats st = engine.stats();
    std::printf("batch %3d: %8.1f generated tokens/s  (%.2fx batch 1); %llu steps, engine's own share %.2f%% "
                "(%.3f ms/step outside the forward pass)\n",
                batch, tps, tps / base, static_cast<unsigned long long>(st.steps),
                100.0 * (st.step_seconds - st.forward_seconds) / st.step_seconds,
                1e3 * (st.step_seconds - st.forward_seconds) / static_cast<double>(st.steps));
  }
  std::filesystem::remove_all(dir);
  return 0;
}
