// Speculative decoding (ngram, prompt lookup) against speculation off, in one run: tokens/s at batch 1 on
// three workloads, and the ratio on/off at larger batches (how disable_by_batch_size's default was chosen);
// then an agent loop, off vs ngram vs suffix.
//
// Workloads, all on one model (default: the trained models/kvfleet-default, whose tokenizer gives real text):
//   copy      the prompt holds the text the answer repeats: S + O + S, where O is the model's own greedy
//             continuation of S (computed first); greedy, so the answer after the second S is mostly O again.
//             The input-grounded case (an edit that copies most of a file), built so that a small model
//             really copies.
//   loop      a prompt whose greedy continuation falls into repeating its own line (small models do): the
//             drafts come from the output itself.
//   sampled   temperature 1 (a seed per request): text with no exact repetition to look up; speculation
//             must switch itself off (acceptance tracking) and cost almost nothing.
// Each (workload, batch) is run off, on, off, on (--rounds pairs) on two warm engines and the best of each is
// kept, by wall time (tok/s) and by the process's CPU time (cpu ratio: steadier where other processes share
// the cores); every request
// generates --tokens tokens (ignore_eos). The on/off outputs of the greedy workloads are checked equal.
//
// agent: tool-agent loops at batch 1, one request at a time. --agent-tasks tasks, each run --agent-repeats
// times (sessions interleaved: task 0, 1, ..., then 0, 1, ... again: an agent retrying or re-running a task,
// its tool calls repeating the calls of an earlier run). A session is --agent-steps requests; step t's prompt
// is a shared system prompt, the task, and every earlier (call, result) pair; its output, the call, is the
// model's continuation (--agent-call-tokens tokens) at --agent-temperature (0.8; 0: greedy) with a seed fixed
// per (task, step), so that a re-run of a task samples the same calls; the result is text fixed per
// (task, step). Each
// method runs the whole workload on a fresh engine (suffix decoding's cache of earlier outputs starts empty;
// warmed with one request under another cache salt), best of --rounds; the outputs are checked equal.
//
//   build/bin/bench_speculative [--model DIR] [--tokens 160] [--k 4] [--min-n 2] [--max-n 4]
//                               [--batches 1,2,4,8,16] [--threads 1] [--rounds 2] [--disable-by-batch-size N]
//                               [--suffix-k 8] [--agent-tasks 4] [--agent-repeats 2] [--agent-steps 6]
//                               [--agent-call-tokens 48] [--agent-temperature 0.8] [--only agent|batch]
//                               [--draft-model DIR]
// --draft-model DIR: the sweep's "on" engine speculates with method draft_model (DIR drafts --k tokens, its
// vocabulary the model's) instead of ngram.
// --disable-by-batch-size: the per-step switch-off (default: none, so that the sweep measures speculation at
// every batch; pass 4, the engine's default, to see a served configuration).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "kvfleet/engine.h"
#include "kvfleet/tokenizer.h"

using namespace kvfleet;

namespace {

struct Options {
  std::string model = std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default";
  std::int32_t tokens = 160, k = 4, min_n = 2, max_n = 4, rounds = 2;
  std::int32_t disable_by_batch_size = 1 << 20;  // default: speculate at every batch (the sweep)
  unsigned threads = 1;
  std::vector<int> batches{1, 2, 4, 8, 16};
  std::int32_t suffix_k = 8, agent_tasks = 4, agent_repeats = 2, agent_steps = 6, agent_call_tokens = 48;
  float agent_temperature = 0.8f;
  std::string only;  // "agent" or "batch": one part alone
  std::string draft_model;  // the sweep speculates with this draft model instead of ngram
};

struct Result {
  double tokens_per_s = 0.0;
  double tokens_per_cpu_s = 0.0;  // per second of the process's CPU time: steadier on a shared machine
  std::vector<std::vector<TokenId>> outputs;
  SpecDecodeStats spec;
  double ms_per_step = 0.0;
  std::uint64_t steps = 0;
};

EngineConfig engine_config(const Options& o, const std::string& method) {
  EngineConfig c;
  c.num_blocks = 2048;
  c.block_size = 16;
  c.scheduler.max_num_seqs = 64;
  c.backend.kind = "cpu";
  c.backend.threads = o.threads;
  if (method == "ngram") {
    c.speculative.method = "ngram";
    c.speculative.num_speculative_tokens = o.k;
    c.speculative.prompt_lookup_min = o.min_n;
    c.speculative.prompt_lookup_max = o.max_n;
  } else if (method == "draft_model") {
    c.speculative.method = "draft_model";
    c.speculative.draft_model = o.draft_model;
    c.speculative.num_speculative_tokens = o.k;
  } else if (method == "suffix") {
    c.speculative.method = "suffix";
    c.speculative.num_speculative_tokens = o.suffix_k;
  }
  c.speculative.disable_by_batch_size = o.disable_by_batch_size;
  return c;
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Runs the requests on a warm engine (its weights packed by an earlier request); counts from this run only.
Result run(Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::mutex mu;
  Result r;
  r.outputs.resize(requests.size());
  const EngineStats before = engine.stats();
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = cpu_seconds();
  for (std::size_t i = 0; i < requests.size(); ++i)
    engine.submit(requests[i], [&mu, &r, i](const RequestOutput& o) {
      std::lock_guard lock(mu);
      r.outputs[i].insert(r.outputs[i].end(), o.new_tokens.begin(), o.new_tokens.end());
    });
  engine.wait_idle();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::size_t n = 0;
  for (const auto& out : r.outputs) n += out.size();
  r.tokens_per_s = static_cast<double>(n) / s;
  r.tokens_per_cpu_s = static_cast<double>(n) / (cpu_seconds() - cpu0);
  const EngineStats st = engine.stats();
  r.spec.num_drafts = st.spec.num_drafts - before.spec.num_drafts;
  r.spec.num_draft_tokens = st.spec.num_draft_tokens - before.spec.num_draft_tokens;
  r.steps = st.steps - before.steps;
  r.spec.num_accepted_tokens = st.spec.num_accepted_tokens - before.spec.num_accepted_tokens;
  r.ms_per_step = 1e3 * (st.step_seconds - before.step_seconds) / static_cast<double>(std::max<std::uint64_t>(st.steps - before.steps, 1));
  return r;
}

Result run(const Model& model, const EngineConfig& c, const std::vector<GenerationRequest>& requests) {
  Engine engine(model, c);
  return run(engine, requests);
}

std::vector<TokenId> greedy(const Model& model, const Options& o, const std::vector<TokenId>& prompt, std::int32_t n) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = n;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  return run(model, engine_config(o, std::string()), {r}).outputs[0];
}

std::vector<GenerationRequest> workload(const std::string& name, const std::vector<TokenId>& prompt, int batch,
                                        const Options& o) {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < batch; ++i) {
    GenerationRequest r;
    r.prompt = prompt;
    r.prompt.insert(r.prompt.begin(), static_cast<TokenId>(100 + i));  // no prefix-cache sharing across the batch
    r.max_tokens = o.tokens;
    r.ignore_eos = true;
    r.sampling.temperature = name == "sampled" ? 1.0f : 0.0f;
    r.sampling.seed = static_cast<std::uint64_t>(i) + 1;
    out.push_back(r);
  }
  return out;
}

// The agent workload on a fresh engine with `method`: every session's steps one request at a time.
Result run_agent(const Model& model, const Tokenizer& tok, const Options& o, const std::string& method) {
  static const char* kLines[] = {
      "In the beginning God created the heaven and the earth.",
      "And the earth was without form, and void; and darkness was upon the face of the deep.",
      "And the Spirit of God moved upon the face of the waters.",
      "And God called the light Day, and the darkness he called Night.",
      "And God made the firmament, and divided the waters which were under the firmament.",
      "And the evening and the morning were the third day.",
      "Let the waters under the heaven be gathered together unto one place.",
      "And God saw every thing that he had made, and, behold, it was very good.",
      "Thus the heavens and the earth were finished, and all the host of them.",
      "And the LORD God planted a garden eastward in Eden.",
      "And a river went out of Eden to water the garden.",
  };
  constexpr int kNumLines = sizeof(kLines) / sizeof(kLines[0]);
  Engine engine(model, engine_config(o, method));
  GenerationRequest warm;
  warm.prompt = tok.encode("The LORD is my shepherd");
  warm.max_tokens = 2;
  warm.cache_salt = "warm-up";  // its output drafts nothing for the workload's requests
  run(engine, {warm});
  const std::vector<TokenId> system = tok.encode(
      "You are an agent. Call a tool with one line, read its result, then call the next tool.\n");
  Result total;
  double seconds = 0.0, cpu = 0.0;
  std::size_t tokens = 0;
  for (int rep = 0; rep < o.agent_repeats; ++rep) {
    for (int task = 0; task < o.agent_tasks; ++task) {
      GenerationRequest r;
      r.prompt = system;
      const std::vector<TokenId> t = tok.encode(std::string("Task: ") + kLines[task % kNumLines] + "\n");
      r.prompt.insert(r.prompt.end(), t.begin(), t.end());
      r.max_tokens = o.agent_call_tokens;
      r.ignore_eos = true;
      r.sampling.temperature = o.agent_temperature;
      for (int step = 0; step < o.agent_steps; ++step) {
        r.sampling.seed = static_cast<std::uint64_t>(task * 1000 + step + 1);  // a re-run samples the same call
        const auto t0 = std::chrono::steady_clock::now();
        const double cpu0 = cpu_seconds();
        Result one = run(engine, {r});
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        cpu += cpu_seconds() - cpu0;
        const std::vector<TokenId>& call = one.outputs[0];
        tokens += call.size();
        total.outputs.push_back(call);
        total.spec.num_drafts += one.spec.num_drafts;
        total.spec.num_draft_tokens += one.spec.num_draft_tokens;
        total.spec.num_accepted_tokens += one.spec.num_accepted_tokens;
        total.steps += one.steps;
        // The next step sees the call and its result.
        r.prompt.insert(r.prompt.end(), call.begin(), call.end());
        const std::vector<TokenId> result = tok.encode(std::string("\nResult: ") + kLines[(task * 3 + step + 1) % kNumLines] + "\n");
        r.prompt.insert(r.prompt.end(), result.begin(), result.end());
      }
    }
  }
  total.tokens_per_s = static_cast<double>(tokens) / seconds;
  total.tokens_per_cpu_s = static_cast<double>(tokens) / cpu;
  return total;
}

void agent_section(const Model& model, const Tokenizer& tok, const Options& o) {
  std::printf("\nagent loop: %d tasks x %d runs x %d steps, %d-token calls, temperature %.2f, batch 1; ngram k=%d n=%d..%d, suffix k=%d\n",
              o.agent_tasks, o.agent_repeats, o.agent_steps, o.agent_call_tokens, static_cast<double>(o.agent_temperature), o.k,
              o.min_n, o.max_n, o.suffix_k);
  std::map<std::string, Result> best;
  std::map<std::string, double> best_cpu;
  for (int round = 0; round < o.rounds; ++round)
    for (const char* method : {"off", "ngram", "suffix"}) {
      Result r = run_agent(model, tok, o, std::string(method) == "off" ? "" : method);
      best_cpu[method] = std::max(best_cpu[method], r.tokens_per_cpu_s);
      if (r.tokens_per_s > best[method].tokens_per_s) best[method] = std::move(r);
    }
  std::printf("%-8s %10s %8s %10s %10s %9s %10s\n", "method", "tok/s", "vs off", "cpu vs off", "accepted", "identical",
              "steps");
  for (const char* method : {"off", "ngram", "suffix"}) {
    const Result& r = best[method];
    const double rate = r.spec.num_draft_tokens ? static_cast<double>(r.spec.num_accepted_tokens) / r.spec.num_draft_tokens : 0.0;
    std::printf("%-8s %10.1f %7.2fx %9.2fx %9.0f%% %9s %10llu\n", method, r.tokens_per_s,
                r.tokens_per_s / best["off"].tokens_per_s, best_cpu[method] / best_cpu["off"], 100.0 * rate,
                r.outputs == best["off"].outputs ? "yes" : "NO", static_cast<unsigned long long>(r.steps));
  }
  std::printf("suffix / ngram: %.2fx tok/s, %.2fx cpu\n", best["suffix"].tokens_per_s / best["ngram"].tokens_per_s,
              best_cpu["suffix"] / best_cpu["ngram"]);
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) v.push_back(std::stoi(x));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") o.model = v;
    else if (a == "--tokens") o.tokens = std::stoi(v);
    else if (a == "--k") o.k = std::stoi(v);
    else if (a == "--min-n") o.min_n = std::stoi(v);
    else if (a == "--max-n") o.max_n = std::stoi(v);
    else if (a == "--rounds") o.rounds = std::stoi(v);
    else if (a == "--threads") o.threads = static_cast<unsigned>(std::stoi(v));
    else if (a == "--batches") o.batches = parse_list(v);
    else if (a == "--disable-by-batch-size") o.disable_by_batch_size = std::stoi(v);
    else if (a == "--suffix-k") o.suffix_k = std::stoi(v);
    else if (a == "--agent-tasks") o.agent_tasks = std::stoi(v);
    else if (a == "--agent-repeats") o.agent_repeats = std::stoi(v);
    else if (a == "--agent-steps") o.agent_steps = std::stoi(v);
    else if (a == "--agent-call-tokens") o.agent_call_tokens = std::stoi(v);
    else if (a == "--agent-temperature") o.agent_temperature = std::stof(v);
    else if (a == "--only") o.only = v;
    else if (a == "--draft-model") o.draft_model = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const Model model = Model::load(o.model);
  const Tokenizer tok = Tokenizer::load(o.model);
  if (o.only == "agent") {
    agent_section(model, tok, o);
    return 0;
  }
  std::string loop_text;
  for (int i = 0; i < 3; ++i) loop_text += "And God said, Let there be light: and there was light.\n";
  // copy: the seed and the model's own greedy continuation of it (2 x --tokens), whose greedy continuation in
  // turn goes on repeating text the prompt holds.
  std::vector<TokenId> copy_prompt = tok.encode(loop_text);
  const std::vector<TokenId> continuation = greedy(model, o, copy_prompt, 2 * o.tokens);
  copy_prompt.insert(copy_prompt.end(), continuation.begin(), continuation.end());
  const std::map<std::string, std::vector<TokenId>> prompts{
      {"copy", copy_prompt}, {"loop", tok.encode(loop_text)}, {"sampled", tok.encode("The LORD is my shepherd; I shall")}};
  const std::string on_method = o.draft_model.empty() ? "ngram" : "draft_model";
  if (on_method == "ngram")
    std::printf("model %s, %d tokens per request, ngram k=%d n=%d..%d, disable_by_batch_size %d, %u CPU thread(s)\n",
                o.model.c_str(), o.tokens, o.k, o.min_n, o.max_n, o.disable_by_batch_size, o.threads);
  else
    std::printf("model %s, %d tokens per request, draft_model %s k=%d, disable_by_batch_size %d, %u CPU thread(s)\n",
                o.model.c_str(), o.tokens, o.draft_model.c_str(), o.k, o.disable_by_batch_size, o.threads);
  std::printf("%-8s %6s %12s %12s %7s %9s %10s %9s %14s %16s\n", "workload", "batch", "off tok/s", "on tok/s", "ratio",
              "cpu ratio", "accepted", "identical", "ms/step off/on", "steps off/on/spec");
  for (const char* name : {"copy", "loop", "sampled"}) {
    for (const int batch : o.batches) {
      if (batch > 1 && std::string(name) == "sampled") continue;
      const auto requests = workload(name, prompts.at(name), batch, o);
      Engine engine_off(model, engine_config(o, std::string())), engine_on(model, engine_config(o, on_method));
      run(engine_off, {requests[0]});  // warm-up: the CPU backend packs its weights on the first forward
      run(engine_on, {requests[0]});
      Result best_off, best_on;
      double best_off_cpu = 0.0, best_on_cpu = 0.0;
      for (int r = 0; r < o.rounds; ++r) {
        Result off = run(engine_off, requests);
        Result on = run(engine_on, requests);
        best_off_cpu = std::max(best_off_cpu, off.tokens_per_cpu_s);
        best_on_cpu = std::max(best_on_cpu, on.tokens_per_cpu_s);
        if (off.tokens_per_s > best_off.tokens_per_s) best_off = std::move(off);
        if (on.tokens_per_s > best_on.tokens_per_s) best_on = std::move(on);
      }
      const double rate = best_on.spec.num_draft_tokens
                              ? static_cast<double>(best_on.spec.num_accepted_tokens) / best_on.spec.num_draft_tokens
                              : 0.0;
      std::printf("%-8s %6d %12.1f %12.1f %6.2fx %8.2fx %9.0f%% %9s %7.2f/%.2f %8llu/%llu/%llu\n", name, batch,
                  best_off.tokens_per_s, best_on.tokens_per_s, best_on.tokens_per_s / best_off.tokens_per_s,
                  best_on_cpu / best_off_cpu, 100.0 * rate,
                  best_on.outputs == best_off.outputs ? "yes" : "NO", best_off.ms_per_step, best_on.ms_per_step,
                  static_cast<unsigned long long>(best_off.steps), static_cast<unsigned long long>(best_on.steps),
                  static_cast<unsigned long long>(best_on.spec.num_drafts));
      std::fflush(stdout);
    }
  }
  if (o.only != "batch") agent_section(model, tok, o);
  return 0;
}
