// CPU engine throughput with 1, 8 and 32 (or --batches) concurrent sequences on a small model: continuous
// batching must raise total tokens/s (each decode step reads the weights once for the whole batch). Also
// prints the engine's own share of its steps (schedule, sample, stop check, outputs: a step's wall time
// outside the forward pass, EngineStats::step_seconds - forward_seconds).
//
// --outputs says where the tokens go: `none` (no callback), or to one coroutine per request on two io
// threads (kvfleet-replica's default http_threads) the way the replica's handlers receive them: `queue`
// (the old path: one AsyncQueue push and wake-up per token per request) or `relay` (OutputRelay: the
// callback only appends to the request's inbox, one post per step wakes every inbox that got something).
// `both` runs queue and relay interleaved (queue, relay, queue, relay: --rounds) for each batch, and
// also prints the io threads' CPU time per token.
//
// --top-p, --top-k, --min-p, --presence and --frequency set the other sampling modes a chat user runs
// (each request's SamplingParams and Penalties); every request gets its own seed.
//
// --model DIR runs that model instead of the built-in one (26M parameters, vocab 8,192, no tokenizer). When
// DIR has a tokenizer, every request is detokenized on the engine thread as the replica's are
// (GenerationRequest::detokenize: the stream decoder the stop strings are matched on, RequestOutput::text),
// and --stop S gives each request a stop string (one that never matches still costs its check every token).
// --json FILE writes every run's figures as a JSON array (bench/cpu_goals.py reads it).
//
//   build/bin/bench_engine_throughput [--threads N] [--tokens 64] [--batches 1,8,32,256] [--temperature 0]
//                                     [--top-p 1] [--top-k 0] [--min-p 0] [--presence 0] [--frequency 0]
//                                     [--outputs none|queue|relay|both] [--rounds 2]
//                                     [--model DIR] [--stop S] [--json FILE]
#include <time.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/server/output/relay.h"
#include "kvfleet/engine.h"
#include "kvfleet/http/async_queue.h"
#include "kvfleet/make_model.h"
#include "kvfleet/tokenizer.h"

using namespace kvfleet;
namespace asio = boost::asio;

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The server's side: io threads running one consumer coroutine per request.
struct Consumers {
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> guard = asio::make_work_guard(ioc);
  std::vector<std::thread> threads;
  std::vector<double> cpu = std::vector<double>(2, 0.0);
  std::atomic<std::uint64_t> tokens{0};
  std::atomic<int> finished{0};
  Consumers() {
    for (std::size_t k = 0; k < cpu.size(); ++k)
      threads.emplace_back([this, k] {
        ioc.run();
        cpu[k] = thread_cpu_seconds();
      });
  }
  // Each output as a handler takes it: count its tokens, build the SSE line a stream would send.
  void consume(const RequestOutput& o, std::string& line) {
    line.assign("data: {\"choices\":[{\"index\":0,\"text\":\"");
    line += o.text;
    line += "\"}]}\n\n";
    tokens += o.new_tokens.size();
  }
  OutputCallback queue_callback() {
    auto q = std::make_shared<http::AsyncQueue<RequestOutput>>(ioc.get_executor());
    auto reader = [this, q]() -> asio::awaitable<void> {
      std::string line;
      for (;;) {
        auto o = co_await q->pop();
        consume(*o, line);
        if (o->finished) break;
      }
      ++finished;
    };
    asio::co_spawn(ioc, std::move(reader), asio::detached);
    return [q](const RequestOutput& o) { q->push(o); };
  }
  OutputCallback relay_callback(server::OutputRelay& relay) {
    auto inbox = std::make_shared<server::OutputInbox>(ioc.get_executor());
    auto reader = [this, inbox]() -> asio::awaitable<void> {
      std::vector<server::OutputInbox::Item> items;
      std::string line;
      for (bool done = false; !done;) {
        co_await inbox->take(items);
        for (const auto& [choice, o] : items) {
          consume(o, line);
          done = done || o.finished;
        }
      }
      ++finished;
    };
    asio::co_spawn(ioc, std::move(reader), asio::detached);
    return relay.callback(inbox, 0);
  }
  double stop(int expected) {  // the io threads' CPU seconds
    while (finished < expected) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    guard.reset();
    for (auto& t : threads) t.join();
    return cpu[0] + cpu[1];
  }
};

struct Run {
  double tps, share, ms_outside, io_us_per_token;
  unsigned long long steps;
};

// What every request asks for besides its seed.
struct Sampling {
  SamplingParams params;
  Penalties penalties;
  bool detokenize = false;  // the model has a tokenizer: text out, as the replica asks for it
  std::vector<std::string> stop;
};

Run run_once(const Model& model, const Tokenizer* tokenizer, int batch, std::int32_t tokens, const Sampling& sampling,
             unsigned threads, const std::string& outputs) {
  EngineConfig c;
  c.num_blocks = std::max(1024, batch * ((8 + tokens) / 16 + 2));
  c.scheduler.max_num_seqs = std::max(c.scheduler.max_num_seqs, batch);
  c.scheduler.max_num_batched_tokens = std::max(c.scheduler.max_num_batched_tokens, batch * 8);
  c.backend.kind = "cpu";
  c.backend.threads = threads;
  c.enable_prefix_caching = false;
  server::OutputRelay relay(/*immediate=*/false);
  std::unique_ptr<Consumers> consumers;
  if (outputs != "none") consumers = std::make_unique<Consumers>();
  double io_cpu = 0.0;
  Run run{};
  {
    Engine engine(model, c);
    engine.set_tokenizer(tokenizer);
    if (outputs == "relay") engine.set_outputs_done([&relay] { relay.flush(); });
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) {
      GenerationRequest r;
      r.prompt = {1 + i, 2, 3, 4, 5, 6, 7, 8};
      r.max_tokens = tokens;
      r.ignore_eos = true;
      r.sampling = sampling.params;
      r.penalties = sampling.penalties;
      r.sampling.seed = static_cast<std::uint64_t>(i);
      r.detokenize = sampling.detokenize;
      r.stop = sampling.stop;
      OutputCallback cb = outputs == "queue" ? consumers->queue_callback()
                          : outputs == "relay" ? consumers->relay_callback(relay) : OutputCallback{};
      engine.submit(r, std::move(cb));
    }
    engine.wait_idle();
    if (consumers) io_cpu = consumers->stop(batch);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const EngineStats st = engine.stats();
    run.tps = batch * tokens / s;
    run.steps = static_cast<unsigned long long>(st.steps);
    run.share = 100.0 * (st.step_seconds - st.forward_seconds) / st.step_seconds;
    run.ms_outside = 1e3 * (st.step_seconds - st.forward_seconds) / static_cast<double>(st.steps);
    run.io_us_per_token = 1e6 * io_cpu / (static_cast<double>(batch) * tokens);
  }
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 0;
  std::int32_t tokens = 64;
  Sampling sampling;
  sampling.params.temperature = 0.0f;
  int rounds = 2;
  std::string outputs = "none";
  std::vector<int> batches{1, 8, 32};
  std::string model_dir, json_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = static_cast<unsigned>(std::stoul(argv[i + 1]));
    else if (a == "--tokens") tokens = std::stoi(argv[i + 1]);
    else if (a == "--temperature") sampling.params.temperature = std::stof(argv[i + 1]);
    else if (a == "--top-p") sampling.params.top_p = std::stof(argv[i + 1]);
    else if (a == "--top-k") sampling.params.top_k = std::stoi(argv[i + 1]);
    else if (a == "--min-p") sampling.params.min_p = std::stof(argv[i + 1]);
    else if (a == "--presence") sampling.penalties.presence = std::stof(argv[i + 1]);
    else if (a == "--frequency") sampling.penalties.frequency = std::stof(argv[i + 1]);
    else if (a == "--outputs") outputs = argv[i + 1];
    else if (a == "--rounds") rounds = std::stoi(argv[i + 1]);
    else if (a == "--model") model_dir = argv[i + 1];
    else if (a == "--stop") sampling.stop.emplace_back(argv[i + 1]);
    else if (a == "--json") json_path = argv[i + 1];
    else if (a == "--batches") {
      batches.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string b; std::getline(list, b, ',');) batches.push_back(std::stoi(b));
    }
  }
  if (outputs != "none" && outputs != "queue" && outputs != "relay" && outputs != "both") {
    std::fprintf(stderr, "--outputs: none, queue, relay or both\n");
    return 2;
  }
  const bool own_model = model_dir.empty();
  const auto dir = own_model ? std::filesystem::temp_directory_path() / "kvfleet-bench-model"
                             : std::filesystem::path(model_dir);
  if (own_model) {
    MakeModelOptions o;  // ~26M parameters in bf16: a small llama
    o.layers = 4; o.hidden = 512; o.intermediate = 1536; o.heads = 8; o.kv_heads = 4; o.vocab = 8192;
    o.dtype = DType::bf16;
    make_model(o, dir);
  }
  const Model model = Model::load(dir);
  std::optional<Tokenizer> tokenizer;
  if (std::filesystem::exists(dir / "tokenizer.json")) tokenizer = Tokenizer::load(dir);
  sampling.detokenize = tokenizer.has_value();
  if (!sampling.stop.empty() && !tokenizer) {
    std::fprintf(stderr, "--stop needs a model with a tokenizer (--model DIR with tokenizer.json)\n");
    return 2;
  }
  const ModelConfig& mc = model.config();
  std::printf("model: %lld layers, hidden %lld, vocab %lld, %.1f MB of weights; %d tokens per sequence; outputs: %s; "
              "detokenized: %s, %zu stop strings\n",
              static_cast<long long>(mc.num_layers), static_cast<long long>(mc.hidden_size),
              static_cast<long long>(mc.vocab_size), static_cast<double>(model.weight_bytes()) / 1e6, tokens,
              outputs.c_str(), tokenizer ? "yes" : "no", sampling.stop.size());
  const SamplingParams& sp = sampling.params;
  std::printf("sampling: temperature %g, top_p %g, top_k %d, min_p %g, presence %g, frequency %g\n", sp.temperature,
              sp.top_p, sp.top_k, sp.min_p, sampling.penalties.presence, sampling.penalties.frequency);
  std::vector<std::string> modes{outputs};
  if (outputs == "both") {
    modes.clear();
    for (int r = 0; r < rounds; ++r) modes.insert(modes.end(), {"queue", "relay"});
  }
  double base = 0.0;
  boost::json::array runs;
  for (int batch : batches) {
    for (const std::string& mode : modes) {
      const Run r = run_once(model, tokenizer ? &*tokenizer : nullptr, batch, tokens, sampling, threads, mode);
      runs.push_back(boost::json::object{{"batch", batch}, {"outputs", mode}, {"tok_per_s", r.tps},
                                         {"steps", r.steps}, {"engine_own_share", r.share / 100.0},
                                         {"engine_own_s_per_step", r.ms_outside / 1e3}});
      if (base == 0.0) base = r.tps;
      std::printf("batch %3d %-5s: %8.1f generated tokens/s  (%.2fx the first); %llu steps, engine's own share %.2f%% "
                  "(%.3f ms/step outside the forward pass)",
                  batch, mode.c_str(), r.tps, r.tps / base, r.steps, r.share, r.ms_outside);
      if (mode != "none") std::printf("; io threads %.2f us CPU/token", r.io_us_per_token);
      std::printf("\n");
    }
  }
  if (own_model) std::filesystem::remove_all(dir);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << boost::json::serialize(runs) << "\n";
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
