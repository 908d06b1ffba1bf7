// kvfleet_cuda_bench: the first throughput numbers of the CUDA backend.
// Makes (or reuses) a Llama-3.2-1B-shaped random bf16 model, then times ModelRunner::forward as the engine
// calls it (host metadata upload and the logits copy back included): decode steps at several batch sizes
// and a 512-token prefill, in the batch-invariant GEMM mode and the cuBLAS mode. Prints a table and
// writes JSON.
//   kvfleet_cuda_bench --model-dir DIR [--out FILE] [--batches 1,32,128] [--context 128] [--steps 16]
//                      [--prefill 512] [--modes invariant,cublas] [--small]
// --small: a tiny model instead (for checking the tool itself on the CPU build: --backend cpu).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"

namespace {

using namespace kvfleet;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string model_dir = "/tmp/kvfleet-llama-1b";
  std::string out;
  std::vector<int> batches = {1, 32, 128};
  int context = 128, steps = 16, prefill = 512;
  std::vector<std::string> modes = {"invariant", "cublas"};
  std::string backend = "cuda";
  bool small = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--model-dir")
      a.model_dir = next();
    else if (k == "--out")
      a.out = next();
    else if (k == "--batches") {
      a.batches.clear();
      for (auto& b : split(next())) a.batches.push_back(std::stoi(b));
    } else if (k == "--context")
      a.context = std::stoi(next());
    else if (k == "--steps")
      a.steps = std::stoi(next());
    else if (k == "--prefill")
      a.prefill = std::stoi(next());
    else if (k == "--modes")
      a.modes = split(next());
    else if (k == "--backend")
      a.backend = next();
    else if (k == "--small")
      a.small = true;
    else
      throw std::invalid_argument("unknown argument " + k);
  }
  return a;
}

MakeModelOptions llama_1b_shape(bool small) {
  MakeModelOptions o;
  o.dtype = DType::bf16;
  o.tie_embeddings = true;  // as Llama-3.2-1B
  o.rope_theta = 500000.0;
  o.seed = 1;
  if (small) {
    o.layers = 2, o.hidden = 128, o.intermediate = 256, o.heads = 8, o.kv_heads = 2, o.vocab = 1000;
    return o;
  }
  o.layers = 16, o.hidden = 2048, o.intermediate = 8192, o.heads = 32, o.kv_heads = 8, o.vocab = 128256;
  o.shards = 2;
  return o;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Result {
  std::string mode, kind;
  int batch = 0, tokens = 0;
  double seconds = 0, tokens_per_s = 0;
};

// B sequences of `context` tokens each (prefilled untimed), then `steps` timed decode steps of B rows.
Result time_decode(ModelRunner& runner, int batch, int context, int steps) {
  const std::int64_t bs = runner.options().block_size;
  const std::int64_t per_seq = (context + steps + 2 + bs - 1) / bs;
  std::vector<std::vector<std::int32_t>> tables(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    tables[static_cast<std::size_t>(b)].resize(static_cast<std::size_t>(per_seq));
    std::iota(tables[static_cast<std::size_t>(b)].begin(), tables[static_cast<std::size_t>(b)].end(),
              static_cast<std::int32_t>(b * per_seq));
  }
  std::vector<TokenId> prompt(static_cast<std::size_t>(context));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>((i * 7919 + 13) % 1000);
  for (int b = 0; b < batch; ++b) {  // prefill, untimed
    ForwardBatch fb;
    fb.chunks.push_back({prompt, 0, tables[static_cast<std::size_t>(b)], SeqChunk::Logits::last});
    runner.forward(fb);
  }
  std::vector<TokenId> next(static_cast<std::size_t>(batch), 42);
  auto step = [&](int pos) {
    ForwardBatch fb;
    for (int b = 0; b < batch; ++b)
      fb.chunks.push_back({std::span<const TokenId>(&next[static_cast<std::size_t>(b)], 1), pos,
                           tables[static_cast<std::size_t>(b)], SeqChunk::Logits::last});
    runner.forward(fb);  // returns host logits, so the step is complete
  };
  step(context);  // warm-up
  const auto t0 = Clock::now();
  for (int s = 1; s <= steps; ++s) step(context + s);
  Result r;
  r.kind = "decode";
  r.batch = batch;
  r.tokens = batch * steps;
  r.seconds = seconds_since(t0);
  r.tokens_per_s = r.tokens / r.seconds;
  return r;
}

Result time_prefill(ModelRunner& runner, int length, int repeats) {
  std::vector<TokenId> prompt(static_cast<std::size_t>(length));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>((i * 104729 + 7) % 1000);
  std::vector<std::int32_t> table(
      static_cast<std::size_t>((length + runner.options().block_size - 1) / runner.options().block_size));
  std::iota(table.begin(), table.end(), 0);
  ForwardBatch fb;
  fb.chunks.push_back({prompt, 0, table, SeqChunk::Logits::last});
  runner.forward(fb);  // warm-up
  const auto t0 = Clock::now();
  for (int i = 0; i < repeats; ++i) runner.forward(fb);
  Result r;
  r.kind = "prefill";
  r.batch = 1;
  r.tokens = length * repeats;
  r.seconds = seconds_since(t0);
  r.tokens_per_s = r.tokens / r.seconds;
  return r;
}

void write_json(const Args& a, const ModelConfig& c, double weight_gb, const std::vector<Result>& results) {
  if (a.out.empty()) return;
  std::ofstream f(a.out);
  f << "{\"model\": {\"layers\": " << c.num_layers << ", \"hidden\": " << c.hidden_size
    << ", \"heads\": " << c.num_heads << ", \"kv_heads\": " << c.num_kv_heads
    << ", \"intermediate\": " << c.intermediate_size << ", \"vocab\": " << c.vocab_size
    << ", \"dtype\": \"bf16\", \"weight_gb\": " << weight_gb << "},\n"
    << " \"backend\": \"" << a.backend << "\", \"context\": " << a.context << ", \"steps\": " << a.steps
    << ",\n \"results\": [\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    f << "  {\"mode\": \"" << r.mode << "\", \"kind\": \"" << r.kind << "\", \"batch\": " << r.batch
      << ", \"tokens\": " << r.tokens << ", \"seconds\": " << r.seconds << ", \"tokens_per_s\": " << r.tokens_per_s
      << "}" << (i + 1 < results.size() ? ",\n" : "\n");
  }
  f << " ]}\n";
}

int run(const Args& a) {
  const auto t_make = Clock::now();
  if (!std::filesystem::exists(std::filesystem::path(a.model_dir) / "config.json"))
    make_model(llama_1b_shape(a.small), a.model_dir);
  const Model model = Model::load(a.model_dir);
  const ModelConfig& c = model.config();
  const double params =
      static_cast<double>(c.vocab_size * c.hidden_size) +
      static_cast<double>(c.num_layers) *
          static_cast<double>(c.hidden_size * (2 * c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim) +
                              3 * c.hidden_size * c.intermediate_size);
  std::printf("model ready in %.1f s: %.2f B parameters (%.2f GB bf16)\n", seconds_since(t_make), params / 1e9,
              params * 2 / 1e9);
  const int max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  std::vector<Result> results;
  for (const std::string& mode : a.modes) {
    BackendOptions bo;
    bo.kind = a.backend;
    bo.batch_invariant = mode == "invariant";
    auto backend = make_backend(bo);
    RunnerOptions ro;
    ro.max_batch_tokens = std::max(a.prefill, max_batch);
    const std::int64_t per_seq = (a.context + a.steps + 2 + ro.block_size - 1) / ro.block_size;
    ro.num_blocks = std::max<std::int64_t>(max_batch * per_seq, (a.prefill + ro.block_size - 1) / ro.block_size);
    const auto t_load = Clock::now();
    ModelRunner runner(model, *backend, ro);
    backend->synchronize();
    std::printf("[%s] weights on %s in %.1f s; KV blocks that fit: %lld (using %lld)\n", mode.c_str(),
                std::string(backend->name()).c_str(), seconds_since(t_load),
                static_cast<long long>(backend->kv_blocks_that_fit(backend->kv_cache_shape())),
                static_cast<long long>(ro.num_blocks));
    for (int b : a.batches) {
      results.push_back(time_decode(runner, b, a.context, a.steps));
      results.back().mode = mode;
      std::printf("[%s] decode batch %d: %.1f tok/s\n", mode.c_str(), b, results.back().tokens_per_s);
      std::fflush(stdout);
    }
    if (a.prefill > 0) {
      results.push_back(time_prefill(runner, a.prefill, 3));
      results.back().mode = mode;
      std::printf("[%s] prefill %d: %.1f tok/s\n", mode.c_str(), a.prefill, results.back().tokens_per_s);
    }
  }
  std::printf("\n%-10s %-8s %6s %12s %14s\n", "mode", "kind", "batch", "tokens/s", "ms/step");
  for (const Result& r : results) {
    const double step_ms = 1e3 * r.seconds / (r.kind == "decode" ? r.tokens / r.batch : r.tokens / a.prefill);
    std::printf("%-10s %-8s %6d %12.1f %14.2f\n", r.mode.c_str(), r.kind.c_str(),
                r.kind == "decode" ? r.batch : a.prefill, r.tokens_per_s, step_ms);
  }
  std::printf("(forward() as the engine calls it: metadata upload and the fp32 logits copy to the host included)\n");
  write_json(a, c, params * 2 / 1e9, results);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvfleet_cuda_bench: %s\n", e.what());
    return 1;
  }
}
