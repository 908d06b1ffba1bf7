// MoE vs dense decode on the CPU, same run: a Mixtral-style model (8 experts, top-2, expert intermediate
// I/2) against the llama of equal active parameters (one MLP of intermediate I), so each token does the same
// multiply-adds and the MoE reads 4x the MLP weights in total. Generated tokens/s at batch 1 and 16.
//
//   build/bin/bench_moe_decode [--threads N] [--tokens 32]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"

using namespace kvfleet;

namespace {

double tokens_per_second(const Model& model, unsigned threads, int batch, std::int32_t tokens) {
  EngineConfig c;
  c.num_blocks = 512;
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
  return batch * tokens / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 0;
  std::int32_t tokens = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else if (a == "--tokens") tokens = std::stoi(argv[i + 1]);
  }
  const auto root = std::filesystem::temp_directory_path() / "kvfleet-bench-moe";
  MakeModelOptions dense;
  dense.layers = 4; dense.hidden = 512; dense.intermediate = 1536; dense.heads = 8; dense.kv_heads = 4;
  dense.vocab = 8192; dense.dtype = DType::bf16;
  MakeModelOptions moe = dense;
  moe.arch = "mixtral";
  moe.intermediate = dense.intermediate / 2;
  moe.experts = 8;
  moe.experts_per_tok = 2;
  make_model(dense, root / "dense");
  make_model(moe, root / "moe");
  const Model d = Model::load(root / "dense"), m = Model::load(root / "moe");
  std::printf("dense: %.1f MB bf16; moe (8 experts, top-2, expert intermediate %lld): %.1f MB; %d tokens per sequence\n",
              static_cast<double>(d.weight_bytes()) / 1e6, static_cast<long long>(moe.intermediate),
              static_cast<double>(m.weight_bytes()) / 1e6, tokens);
  for (int batch : {1, 16}) {
    const double td = tokens_per_second(d, threads, batch, tokens), tm = tokens_per_second(m, threads, batch, tokens);
    std::printf("batch %2d: dense %8.1f tok/s, moe %8.1f tok/s (moe/dense %.2f)\n", batch, td, tm, tm / td);
  }
  std::filesystem::remove_all(root);
  return 0;
}
