// kvfleet generate: generate token ids from a prompt of ids. Greedy and seeded sampling are deterministic.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "engine/cli/common.h"
#include "kvfleet/model_runner.h"
#include "kvfleet/sampler.h"

namespace kvfleet::cli {

void register_generate(CLI::App& app) {
  struct Args {
    std::string model, ids;
    std::int64_t max_tokens = 16;
    bool ignore_eos = false;
    SamplingParams sampling;
    BackendOptions backend;
  };
  auto a = std::make_shared<Args>();
  a->sampling.temperature = 0.0f;
  auto* cmd = app.add_subcommand("generate", "Generate token ids after a prompt of ids; prints a JSON array");
  cmd->add_option("--model", a->model, "Hugging Face model directory")->required();
  cmd->add_option("--ids", a->ids, "Prompt token ids, e.g. 1,2,3")->required();
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens to generate")->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", a->sampling.temperature, "0 (default): greedy");
  cmd->add_option("--top-k", a->sampling.top_k);
  cmd->add_option("--top-p", a->sampling.top_p);
  cmd->add_option("--min-p", a->sampling.min_p);
  cmd->add_option("--seed", a->sampling.seed);
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at an end-of-sequence token");
  add_backend_options(*cmd, a->backend);
  cmd->callback([a] {
    a->sampling.validate();
    std::vector<TokenId> tokens = parse_ids(a->ids);
    const Model model = Model::load(a->model);
    const ModelConfig& c = model.config();
    const std::int64_t max_len = std::min<std::int64_t>(c.max_position_embeddings,
                                                        static_cast<std::int64_t>(tokens.size()) + a->max_tokens);
    if (static_cast<std::int64_t>(tokens.size()) >= max_len)
      throw std::invalid_argument("the prompt fills the model's context (" + std::to_string(max_len) + " tokens)");
    auto backend = make_backend(a->backend);
    RunnerOptions ro;
    ro.num_blocks = max_len / ro.block_size + 1;
    ro.max_batch_tokens = static_cast<std::int64_t>(tokens.size());
    ModelRunner runner(model, *backend, ro);
    std::vector<std::int32_t> table(static_cast<std::size_t>(ro.num_blocks));
    std::iota(table.begin(), table.end(), 0);

    std::vector<TokenId> out;
    std::size_t computed = 0;
    while (static_cast<std::int64_t>(tokens.size()) < max_len) {
      ForwardBatch batch;
      batch.chunks.push_back({std::span<const TokenId>(tokens).subspan(computed),
                              static_cast<std::int32_t>(computed), table, SeqChunk::Logits::last});
      const auto logits = runner.forward(batch);
      computed = tokens.size();
      const TokenId next = sample(logits, a->sampling, out.size());
      out.push_back(next);
      tokens.push_back(next);
      const auto& eos = c.eos_token_ids;
      if (!a->ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    }
    std::string text = "[";
    for (std::size_t i = 0; i < out.size(); ++i) text += (i ? "," : "") + std::to_string(out[i]);
    std::printf("%s]\n", text.c_str());
  });
}

}  // namespace kvfleet::cli
