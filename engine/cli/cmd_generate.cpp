// kvfleet generate: runs prompts through one engine, concurrently (continuous batching).
//   --ids 1,2,3          one prompt of token ids; prints the generated ids as a JSON array
//   --prompts FILE.jsonl  many prompts, one JSON object a line: {"id", "prompt_ids": [...]} or {"id", "prompt"}
//                         with optional max_tokens, temperature, top_k, top_p, min_p, seed, stop; prints one
//                         line per prompt (in completion order): {"id", "output_ids", "text", "finish_reason"}
//   --speculative-config JSON  speculative decoding (kvfleet/speculative.h)
//   --ep-size N          MoE models: N expert-parallel ranks (engines in lockstep), prompts spread by prefix
//   --ep-rank R --ep-master HOST:PORT  with --ep-size N: this process is rank R of N processes over Gloo; every
//                        rank reads the same prompts, runs the ones that hash to it and prints their lines
//                        (the votes paced over a channel to rank 0: an idle group sleeps)
#include <boost/json.hpp>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>

#include "engine/cli/common.h"
#include "engine/cli/ep_options.h"
#include "kvfleet/communicator.h"
#include "kvfleet/engine.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet::cli {
namespace {
namespace json = boost::json;

struct Args {
  std::string model, ids, prompts;
  std::int32_t max_tokens = 16;
  bool ignore_eos = false;
  SamplingParams sampling;
  EngineConfig engine;
  std::string speculative_json;
  bool no_prefix_cache = false;
  int ep_size = 1;
  EpProcessOptions ep;
};

// Expert parallelism: the rank that serves a prompt, by the hash of its first block (Contract 1's chaining),
// so that prompts sharing a prefix meet the same rank's cache.
std::size_t rank_for(const std::vector<TokenId>& prompt, std::int32_t block_size, int ranks) {
  const auto n = std::min<std::size_t>(prompt.size(), static_cast<std::size_t>(block_size));
  const std::span<const TokenId> first(prompt.data(), n);
  return static_cast<std::size_t>(block_hash_next(block_hash_root("ep"), first) % static_cast<std::uint64_t>(ranks));
}

const char* reason_name(FinishReason r) { return r == FinishReason::stop ? "stop" : r == FinishReason::length ? "length" : "abort"; }

template <class T>
void read_opt(const json::object& o, const char* key, T& out) {
  if (const auto* v = o.if_contains(key)) out = v->to_number<T>();
}

// One JSONL line -> a request (defaults from the flags).
GenerationRequest parse_line(const json::object& o, const Args& a, const Tokenizer* tok) {
  GenerationRequest r;
  r.sampling = a.sampling;
  r.max_tokens = a.max_tokens;
  r.ignore_eos = a.ignore_eos;
  if (const auto* ids = o.if_contains("prompt_ids")) {
    for (const auto& v : ids->as_array()) r.prompt.push_back(v.to_number<TokenId>());
  } else if (const auto* text = o.if_contains("prompt")) {
    if (!tok) throw std::invalid_argument("\"prompt\" text needs a tokenizer.json in the model directory");
    r.prompt = tok->encode(std::string(text->as_string()));
  } else {
    throw std::invalid_argument("each line needs \"prompt_ids\" or \"prompt\"");
  }
  read_opt(o, "max_tokens", r.max_tokens);
  read_opt(o, "temperature", r.sampling.temperature);
  read_opt(o, "top_k", r.sampling.top_k);
  read_opt(o, "top_p", r.sampling.top_p);
  read_opt(o, "min_p", r.sampling.min_p);
  read_opt(o, "seed", r.sampling.seed);
  if (const auto* stop = o.if_contains("stop")) {
    if (stop->is_string()) r.stop.emplace_back(stop->as_string());
    else for (const auto& s : stop->as_array()) r.stop.emplace_back(s.as_string());
  }
  return r;
}

void run(const Args& a) {
  const Model model = Model::load(a.model);
  std::optional<Tokenizer> tok;
  if (std::filesystem::exists(std::filesystem::path(a.model) / "tokenizer.json")) tok = Tokenizer::load(a.model);
  EngineConfig ec = a.engine;
  ec.enable_prefix_caching = !a.no_prefix_cache;
  if (a.ep_size > 1 && !model.config().moe.enabled()) throw std::invalid_argument("--ep-size needs a mixture-of-experts model");
  if (a.ep.over_processes() && !model.config().moe.enabled()) throw std::invalid_argument("--ep-rank needs a mixture-of-experts model");
  // One engine, one per expert-parallel rank (threads of this process), each with its own cache, or this
  // process's rank of a group over Gloo.
  std::vector<std::unique_ptr<Communicator>> comms;
  if (a.ep.over_processes()) comms.push_back(connect_paced_ep_rank(a.ep_size, a.ep, ec.backend));
  else if (a.ep_size > 1) comms = make_in_process_group(a.ep_size);
  std::vector<std::unique_ptr<Engine>> engines;
  for (std::size_t r = 0; r < std::max<std::size_t>(1, comms.size()); ++r) {
    if (!comms.empty()) ec.ep = comms[r].get();
    engines.push_back(std::make_unique<Engine>(model, ec));
    if (tok) engines.back()->set_tokenizer(&*tok);
  }

  std::mutex mu;  // serializes printing from the engine thread
  std::vector<json::value> ids;
  std::vector<GenerationRequest> requests;
  if (!a.ids.empty()) {
    GenerationRequest r;
    r.prompt = parse_ids(a.ids);
    r.sampling = a.sampling;
    r.max_tokens = a.max_tokens;
    r.ignore_eos = a.ignore_eos;
    requests.push_back(std::move(r));
    ids.emplace_back(nullptr);
  } else {
    std::ifstream in(a.prompts);
    if (!in) throw std::invalid_argument(a.prompts + ": cannot read");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        const json::value v = json::parse(line);
        requests.push_back(parse_line(v.as_object(), a, tok ? &*tok : nullptr));
        ids.push_back(v.as_object().contains("id") ? v.at("id") : json::value(n));
      } catch (const std::exception& e) {
        throw std::invalid_argument(a.prompts + ":" + std::to_string(n) + ": " + e.what());
      }
    }
  }
  std::vector<std::vector<TokenId>> outputs(requests.size());
  bool failed = false;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const std::size_t rank = rank_for(requests[i].prompt, ec.block_size, a.ep_size);
    if (a.ep.over_processes() && rank != static_cast<std::size_t>(a.ep.rank)) continue;  // another process's
    Engine& engine = *engines[a.ep.over_processes() ? 0 : rank];
    engine.submit(requests[i], [&, i](const RequestOutput& o) {
      std::lock_guard lock(mu);
      auto& out = outputs[i];
      out.insert(out.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (!o.finished) return;
      if (!a.ids.empty()) {
        std::string s = "[";
        for (std::size_t k = 0; k < out.size(); ++k) s += (k ? "," : "") + std::to_string(out[k]);
        std::printf("%s]\n", s.c_str());
        return;
      }
      json::object line{{"id", ids[i]}, {"output_ids", json::value_from(out)}, {"finish_reason", reason_name(o.finish_reason)}};
      if (tok) line["text"] = tok->decode(out, true);
      if (!o.error.empty()) {
        line["error"] = o.error;
        failed = true;
      }
      std::printf("%s\n", json::serialize(line).c_str());
      std::fflush(stdout);
    });
  }
  for (auto& e : engines) e->wait_idle();
  // A rank done with its own prompts still serves its experts to the others until all are done.
  if (a.ep.over_processes()) engines[0]->leave_group();
  if (failed && a.ep.over_processes()) throw std::runtime_error("expert-parallel rank " + std::to_string(a.ep.rank) + ": requests failed");
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<Args>();
  a->sampling.temperature = 0.0f;
  a->engine.backend.kind = "auto";
  auto* cmd = app.add_subcommand("generate", "Generate from prompts (token ids or a JSONL file) with one engine");
  cmd->add_option("--model", a->model, "Hugging Face model directory")->required();
  auto* ids = cmd->add_option("--ids", a->ids, "One prompt of token ids, e.g. 1,2,3");
  auto* prompts = cmd->add_option("--prompts", a->prompts, "JSONL file of prompts, run concurrently");
  ids->excludes(prompts);
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens to generate (per prompt unless the line says)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", a->sampling.temperature, "0 (default): greedy");
  cmd->add_option("--top-k", a->sampling.top_k);
  cmd->add_option("--top-p", a->sampling.top_p);
  cmd->add_option("--min-p", a->sampling.min_p);
  cmd->add_option("--seed", a->sampling.seed);
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at an end-of-sequence token");
  cmd->add_option("--max-num-seqs", a->engine.scheduler.max_num_seqs, "Sequences per step")->check(CLI::PositiveNumber);
  cmd->add_option("--max-batched-tokens", a->engine.scheduler.max_num_batched_tokens, "Token budget per step")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--num-blocks", a->engine.num_blocks, "KV cache blocks")->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", a->engine.block_size, "Tokens per KV block")->check(CLI::PositiveNumber);
  cmd->add_flag("--no-prefix-cache", a->no_prefix_cache, "Disable automatic prefix caching");
  add_backend_options(*cmd, a->engine.backend);
  cmd->add_option("--speculative-config", a->speculative_json,
                  "Speculative decoding, vLLM's JSON: {\"method\":\"ngram\",\"num_speculative_tokens\":K,...}");
  cmd->add_option("--ep-size", a->ep_size, "MoE: expert-parallel ranks in process, prompts spread by prefix")
      ->check(CLI::PositiveNumber);
  add_ep_process_options(*cmd, a->ep);
  cmd->callback([a] {
    if (a->ids.empty() && a->prompts.empty()) throw std::invalid_argument("give --ids or --prompts");
    a->sampling.validate();
    if (!a->speculative_json.empty()) a->engine.speculative = parse_speculative_config(a->speculative_json);
    run(*a);
  });
}

}  // namespace kvfleet::cli
