// Draft-model speculation (vLLM's "draft_model" method): a smaller model with the target's vocabulary drafts
// k tokens autoregressively for each speculating sequence; the target verifies them as any drafts.
//
// KV: the draft model has its own paged KV cache on its own backend instance (the target's pool holds blocks
// of the target's shape: layers, heads and head size differ), with the target's block size and number of
// blocks, so it holds as many tokens as the target's cache. Each sequence has its own block table here.
// The cache holds only tokens of the sequence: at a proposal, the positions whose token differs from the
// sequence's (rejected drafts) are dropped, the tokens it lacks (the prompt at the first proposal, the
// corrected or bonus token after a verification) are computed in one chunk, then the drafts one at a time.
// When the pool runs short, the sequences whose drafts were asked for longest ago lose their cache (caught
// up again at their next proposal); a sequence that still does not fit proposes nothing.
//
// Drafts: ids the tokenizer cannot show are never drafted. Greedy requests (temperature 0) get the draft
// model's argmax; sampled requests get tokens drawn from
// q, the draft's distribution under the request's temperature, top-k, top-p, min-p and logit bias
// (draft_probs.h: sampling_probs, draft_draw), and draft_probs() hands q to the verifier (min(1, p/q) and the
// renormalised residual, draft_probs.h).
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/spec/proposer.h"
#include "kvfleet/backend.h"
#include "kvfleet/model.h"
#include "kvfleet/model_runner.h"

namespace kvfleet::spec {

struct DraftModelOptions {
  BackendOptions backend;
  std::int64_t num_blocks = 0;        // the target's
  std::int64_t block_size = 16;       // the target's
  std::int64_t max_batch_tokens = 0;  // the longest chunk computed at once (catching up a prompt)
  std::int64_t target_vocab = 0;
};

class DraftModelProposer final : public Proposer {
 public:
  // Loads config.model. Throws std::invalid_argument ("speculative_config: model ...") when it cannot be loaded
  // or its vocabulary size differs from the target's.
  DraftModelProposer(const SpeculativeConfig& config, const DraftModelOptions& options);
  ~DraftModelProposer() override;

  void propose(const ProposeInput& seq, std::int32_t k, std::vector<TokenId>& out) override;
  void finish(const ProposeInput& seq) override;
  std::span<const float> draft_probs(std::uint64_t request, std::span<const TokenId> drafts) const override;

  // For tests: sequences with a cache here, free blocks, the tokens of a sequence's cache (positions 0..n).
  std::size_t num_live() const { return seqs_.size(); }
  std::size_t num_free_blocks() const { return free_.size(); }
  std::vector<TokenId> cached_tokens(std::uint64_t request) const;

 private:
  struct Seq {
    std::vector<std::int32_t> blocks;
    std::vector<TokenId> cached;  // the token at each position whose K/V the cache holds
    std::vector<TokenId> drafts;  // the last proposal
    std::vector<float> q;         // its distributions, [drafts][vocab] (empty: point masses)
    std::uint64_t last_used = 0;
  };
  bool reserve(std::uint64_t request, Seq& s, std::size_t positions);
  void release(Seq& s);
  std::span<float> compute(Seq& s, std::span<const TokenId> tokens);  // appends tokens; the last one's logits
  TokenId choose(std::span<float> logits, const ProposeInput& in, std::size_t position, Seq& s);

  std::unique_ptr<Model> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelRunner> runner_;
  DraftModelOptions options_;
  std::unordered_map<std::uint64_t, Seq> seqs_;
  std::vector<std::int32_t> free_;
  std::uint64_t clock_ = 0;
  std::vector<float> probs_;
};

}  // namespace kvfleet::spec
