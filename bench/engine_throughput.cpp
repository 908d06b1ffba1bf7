// CPU engine throughput with 1, 8 and 32 concurrent sequences on a small model: continuous batching must
// raise total tokens/s (each decode step reads the weights once for the whole batch).
//
//   build/bin/bench_engine_throughput [--threads N] [--tokens 64]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"

using namespace kvfleet;

int main(int argc, char** argv) {
  unsigned threads = 0;
  std::int32_t tokens = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else if (a == "--tokens") tokens = std::stoi(argv[i + 1]);
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
  for (int batch : {1, 8, 32}) {
    EngineConfig c;
    c.num_blocks = 1024;
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
      r.sampling.temperature = 0;
      engine.submit(r, nullptr);
    }
    engine.wait_idle();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = batch * tokens / s;
    if (batch == 1) base = tps;
    std::printf("batch %3d: %8.1f generated tokens/s  (%.2fx batch 1)\n", batch, tps, tps / base);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
