// Expert parallelism in process: dispatch + combine time per MoE layer and its share of the step, at
// ep_size 1, 2 and 4 (ranks as threads). Each rank prefills `batch` sequences of 32 tokens, then decodes
// `steps` steps of `batch` rows; a Mixtral-style model (4 layers, hidden 512, 8 experts, top-2, bf16).
// ep_size 1 has no exchange (the single-rank path). Ranks share this machine's cores.
// --comm gloo: the same ranks (threads) exchange through Gloo over loopback TCP (the separate-process
// transport, minus process boundaries); both: in-process, then Gloo, in one run.
//
//   build/bin/bench_moe_dispatch [--batch 8] [--steps 16] [--comm in_process|gloo|both]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <unistd.h>

#include "kvfleet/communicator.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model_runner.h"

using namespace kvfleet;

namespace {

struct RankTimes {
  double step_s = 0.0, exchange_s = 0.0;
};

RankTimes run_rank(const Model& model, Communicator* ep, int batch, int steps) {
  auto backend = make_cpu_backend(1);
  RunnerOptions ro;
  ro.num_blocks = 4 * batch;
  ro.ep = ep;
  ModelRunner runner(model, *backend, ro);
  std::vector<std::vector<TokenId>> prompts(static_cast<std::size_t>(batch));
  std::vector<std::vector<std::int32_t>> tables(static_cast<std::size_t>(batch));
  for (int i = 0; i < batch; ++i) {
    for (int t = 0; t < 32; ++t) prompts[static_cast<std::size_t>(i)].push_back((t * 31 + i) % 1000);
    for (int b = 0; b < 4; ++b) tables[static_cast<std::size_t>(i)].push_back(4 * i + b);
  }
  ForwardBatch prefill;
  for (int i = 0; i < batch; ++i) prefill.chunks.push_back({prompts[static_cast<std::size_t>(i)], 0, tables[static_cast<std::size_t>(i)], SeqChunk::Logits::last});
  runner.forward(prefill);
  const double before = runner.ep_exchange_seconds();
  const TokenId token = 7;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    ForwardBatch step;
    for (int i = 0; i < batch; ++i)
      step.chunks.push_back({std::span<const TokenId>(&token, 1), 32 + s, tables[static_cast<std::size_t>(i)], SeqChunk::Logits::last});
    runner.forward(step);
  }
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), runner.ep_exchange_seconds() - before};
}

}  // namespace

int main(int argc, char** argv) {
  int batch = 8, steps = 16;
  std::string comm = "both";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batch") batch = std::stoi(argv[i + 1]);
    else if (a == "--steps") steps = std::stoi(argv[i + 1]);
    else if (a == "--comm") comm = argv[i + 1];
  }
  std::vector<std::string> kinds;
  if (comm == "in_process" || comm == "both") kinds.push_back("in_process");
  if ((comm == "gloo" || comm == "both") && gloo_available()) kinds.push_back("gloo");
  if (comm == "gloo" && !gloo_available()) std::fprintf(stderr, "built without Gloo\n");
  const auto dir = std::filesystem::temp_directory_path() / "kvfleet-bench-moe-dispatch";
  MakeModelOptions o;
  o.arch = "mixtral";
  o.layers = 4; o.hidden = 512; o.intermediate = 768; o.heads = 8; o.kv_heads = 4; o.vocab = 1000;
  o.experts = 8; o.experts_per_tok = 2; o.dtype = DType::bf16;
  make_model(o, dir);
  const Model model = Model::load(dir);
  std::printf("mixtral-style, 4 sparse layers, hidden 512, 8 experts top-2; %d decode rows per rank, %d steps\n", batch, steps);
  int port = 29600 + static_cast<int>(::getpid() % 300);
  for (const auto& kind : kinds)
  for (int ep : {1, 2, 4}) {
    if (kind == "gloo" && ep == 1) continue;  // no exchange: the same as in process
    auto comms = kind == "in_process" ? make_in_process_group(ep) : std::vector<std::unique_ptr<Communicator>>(static_cast<std::size_t>(ep));
    const std::string master = "127.0.0.1:" + std::to_string(port++);
    std::vector<RankTimes> t(static_cast<std::size_t>(ep));
    std::vector<std::thread> threads;
    for (int r = 0; r < ep; ++r)
      threads.emplace_back([&, r] {
        auto& c = comms[static_cast<std::size_t>(r)];
        if (kind == "gloo") c = make_gloo_communicator({r, ep, master, "", std::chrono::milliseconds(60000)});
        t[static_cast<std::size_t>(r)] = run_rank(model, ep > 1 ? c.get() : nullptr, batch, steps);
        if (kind == "gloo") c->barrier();  // nobody closes its pairs while another still exchanges
      });
    for (auto& th : threads) th.join();
    double step = 0.0, ex = 0.0;
    for (const auto& x : t) step = std::max(step, x.step_s), ex = std::max(ex, x.exchange_s);
    std::printf("%-10s ep_size %d: step %.2f ms, dispatch+combine %.3f ms per layer (%.1f%% of the step), %.1f tok/s total\n",
                kind.c_str(), ep, 1e3 * step / steps, 1e3 * ex / steps / o.layers, 100.0 * ex / step, ep * batch * steps / step);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
