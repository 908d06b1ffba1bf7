// Speculative decoding: propose a few tokens cheaply, verify them all in one forward of the target model,
// keep the ones the target agrees with. The contract every method shares:
//
//   Proposer::propose(seq, k, out)      seq.tokens = the sequence's prompt + outputs so far (its last token not
//                                       yet computed); writes at most k guesses of the tokens that follow into
//                                       `out` (cleared first; none is a fine answer). A function of the tokens and
//                                       the proposer's own state (for suffix decoding: earlier requests' outputs
//                                       under the same cache salt), or drawn with the request's
//                                       own draws (a draft model, draft_probs.h). Drafts only decide the speed;
//                                       the output is the target model's whatever they are.
//   Proposer::draft_probs(request, d)   drafts drawn at random (a draft model on a sampled request): the
//                                       distribution q each of the last proposal's drafts `d` was drawn from, for
//                                       the verifier's min(1, p/q) rule (engine/spec/draft_probs.h); empty for
//                                       drafts that are a function of the tokens (the point-mass rule, verify.h).
//   Proposer::finish(seq)               the request ended (any reason) with these tokens: a proposer that keeps
//                                       per-request state drops it here.
//   Scheduler                           schedules a proposing sequence's last token + its d drafts as one chunk of
//                                       d + 1 tokens, in the same batch as plain decodes and prefills; the chunk
//                                       asks for the logits of all d + 1 rows (engine/sched, SeqChunk::Logits::all).
//   accept_drafts (verify.h)            walks the rows left to right; the sequence keeps the accepted drafts and
//                                       one token sampled by the target (1 to d + 1 tokens per step).
//   Scheduler::update                   appends them; the K/V of the rejected positions is dropped (their slots are
//                                       overwritten later, whole blocks past the sequence's tokens are freed); only
//                                       full blocks of computed, accepted tokens ever reach the prefix cache.
//
// Proposers are used by the engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kvfleet/block_hash.h"
#include "kvfleet/sampler.h"
#include "kvfleet/speculative.h"

namespace kvfleet::spec {

// What a proposer sees of a sequence.
struct ProposeInput {
  std::uint64_t request = 0;        // the engine's RequestId
  std::string_view cache_salt;      // the request's cache_salt (empty: none)
  std::span<const TokenId> tokens;  // prompt + outputs so far
  std::int32_t num_prompt_tokens = 0;
  // The request's sampling (a draft model drafts as the request samples); null: greedy drafts.
  const SamplingParams* sampling = nullptr;
  std::span<const std::pair<TokenId, float>> logit_bias;
  std::size_t showable = 0;  // ids from here on are never sampled (a vocabulary padded past the tokenizer); 0: none
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void propose(const ProposeInput& seq, std::int32_t k, std::vector<TokenId>& out) = 0;
  virtual void finish(const ProposeInput&) {}
  // [drafts.size()][vocab] when `drafts` begins the last proposal for `request` and it was drawn at random.
  virtual std::span<const float> draft_probs(std::uint64_t /*request*/, std::span<const TokenId> /*drafts*/) const {
    return {};
  }
};

// The proposer `config.method` names (config validated: "ngram" or "suffix"; "draft_model" needs the target's
// settings: DraftModelProposer, engine/spec/draft_model.h).
std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config);

// Prompt lookup (vLLM's "ngram" method). For n from prompt_lookup_max down to prompt_lookup_min: the last n
// tokens are searched for earlier in prompt + outputs; at the first n that occurs, the tokens that followed its
// earliest occurrence are the drafts (at most k, and no further than the end of the known tokens). No match at
// any n: no drafts. Costs O(n x length) per call, no state kept between calls.
class NgramProposer final : public Proposer {
 public:
  NgramProposer(std::int32_t min_n, std::int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(std::span<const TokenId> tokens, std::int32_t k, std::vector<TokenId>& out);
  void propose(const ProposeInput& seq, std::int32_t k, std::vector<TokenId>& out) override {
    propose(seq.tokens, k, out);
  }

 private:
  std::int32_t min_n_, max_n_;
};

}  // namespace kvfleet::spec
