// Speculative decoding: propose a few tokens cheaply, verify them all in one forward of the target model,
// keep the ones the target agrees with. The contract every method shares:
//
//   Proposer::propose(tokens, k, out)   tokens = the sequence's prompt + outputs so far (its last token not yet
//                                       computed); writes at most k guesses of the tokens that follow into `out`
//                                       (cleared first; none is a fine answer). Pure function of `tokens` and the
//                                       proposer's own state: no randomness, so a configuration is deterministic.
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
#include <vector>

#include "kvfleet/block_hash.h"
#include "kvfleet/speculative.h"

namespace kvfleet::spec {

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void propose(std::span<const TokenId> tokens, std::int32_t k, std::vector<TokenId>& out) = 0;
};

// The proposer `config.method` names (config validated: "ngram").
std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& config);

// Prompt lookup (vLLM's "ngram" method). For n from prompt_lookup_max down to prompt_lookup_min: the last n
// tokens are searched for earlier in prompt + outputs; at the first n that occurs, the tokens that followed its
// earliest occurrence are the drafts (at most k, and no further than the end of the known tokens). No match at
// any n: no drafts. Costs O(n x length) per call, no state kept between calls.
class NgramProposer final : public Proposer {
 public:
  NgramProposer(std::int32_t min_n, std::int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(std::span<const TokenId> tokens, std::int32_t k, std::vector<TokenId>& out) override;

 private:
  std::int32_t min_n_, max_n_;
};

}  // namespace kvfleet::spec
