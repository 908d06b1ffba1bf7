#include "engine/spec/draft_model.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/spec/draft_probs.h"

namespace kvfleet::spec {

namespace {

std::unique_ptr<Model> load_draft(const SpeculativeConfig& config, const DraftModelOptions& options) {
  std::unique_ptr<Model> m;
  try {
    m = std::make_unique<Model>(Model::load(config.draft_model));
  } catch (const std::exception& e) {
    throw std::invalid_argument("speculative_config: model \"" + config.draft_model + "\" cannot be loaded: " + e.what());
  }
  if (m->config().vocab_size != options.target_vocab)
    throw std::invalid_argument("speculative_config: model \"" + config.draft_model + "\" has a vocabulary of " +
                                std::to_string(m->config().vocab_size) + " tokens, the target model " +
                                std::to_string(options.target_vocab) +
                                " (a draft model needs the target's tokenizer)");
  return m;
}

}  // namespace

DraftModelProposer::DraftModelProposer(const SpeculativeConfig& config, const DraftModelOptions& options)
    : model_(load_draft(config, options)), backend_(make_backend(options.backend)), options_(options) {
  RunnerOptions ro;
  ro.num_blocks = options.num_blocks;
  ro.block_size = options.block_size;
  ro.max_batch_tokens = options.max_batch_tokens;
  runner_ = std::make_unique<ModelRunner>(*model_, *backend_, ro);
  free_.reserve(static_cast<std::size_t>(options.num_blocks));
  for (auto b = static_cast<std::int32_t>(options.num_blocks); b-- > 0;) free_.push_back(b);  // block 0 first out
}

DraftModelProposer::~DraftModelProposer() = default;

void DraftModelProposer::release(Seq& s) {
  free_.insert(free_.end(), s.blocks.rbegin(), s.blocks.rend());
  s.blocks.clear();
  s.cached.clear();
}

// Blocks for `positions` positions; the least recently used other sequences give theirs up when short.
bool DraftModelProposer::reserve(std::uint64_t request, Seq& s, std::size_t positions) {
  const auto bs = static_cast<std::size_t>(options_.block_size);
  const std::size_t want = (positions + bs - 1) / bs;
  while (s.blocks.size() < want) {
    if (free_.empty()) {
      Seq* victim = nullptr;
      for (auto& [id, other] : seqs_)
        if (id != request && !other.blocks.empty() && (!victim || other.last_used < victim->last_used)) victim = &other;
      if (!victim) return false;
      release(*victim);
      continue;
    }
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

std::span<float> DraftModelProposer::compute(Seq& s, std::span<const TokenId> tokens) {
  std::span<float> logits;
  const auto max = static_cast<std::size_t>(options_.max_batch_tokens);
  for (std::size_t at = 0; at < tokens.size(); at += max) {
    const std::span<const TokenId> piece = tokens.subspan(at, std::min(max, tokens.size() - at));
    ForwardBatch batch;
    SeqChunk c;
    c.tokens = piece;
    c.start_pos = static_cast<std::int32_t>(s.cached.size());
    c.block_table = s.blocks;
    c.logits = at + piece.size() == tokens.size() ? SeqChunk::Logits::last : SeqChunk::Logits::none;
    batch.chunks.push_back(c);
    logits = runner_->forward_view(batch);
    s.cached.insert(s.cached.end(), piece.begin(), piece.end());
  }
  return logits;
}

TokenId DraftModelProposer::choose(std::span<float> logits, const ProposeInput& in, std::size_t position, Seq& s) {
  if (in.showable > 0)
    std::fill(logits.begin() + static_cast<std::ptrdiff_t>(std::min(in.showable, logits.size())), logits.end(),
              -std::numeric_limits<float>::infinity());
  for (const auto& [t, bias] : in.logit_bias)
    if (t >= 0 && static_cast<std::size_t>(t) < logits.size()) logits[static_cast<std::size_t>(t)] += bias;
  const SamplingParams* sp = in.sampling;
  if (!sp || sp->temperature == 0.0f) {
    const auto best = std::max_element(logits.begin(), logits.end());
    return static_cast<TokenId>(best - logits.begin());
  }
  sampling_probs(logits, *sp, probs_);
  s.q.insert(s.q.end(), probs_.begin(), probs_.end());
  return draw_from(probs_, draft_draw(sp->seed, position));
}

void DraftModelProposer::propose(const ProposeInput& in, std::int32_t k, std::vector<TokenId>& out) {
  out.clear();
  const std::size_t n = in.tokens.size();
  const auto max_pos = static_cast<std::size_t>(model_->config().max_position_embeddings);
  if (n == 0 || n > max_pos) return;
  k = static_cast<std::int32_t>(std::min<std::size_t>(static_cast<std::size_t>(std::max(k, 0)), max_pos - n + 1));
  if (k <= 0) return;
  Seq& s = seqs_[in.request];
  s.last_used = ++clock_;
  s.drafts.clear();
  s.q.clear();
  // Keep the positions whose token is the sequence's (rejected drafts go); at least the last token is computed
  // here, for its logits.
  std::size_t keep = 0;
  const std::size_t limit = std::min(s.cached.size(), n - 1);
  while (keep < limit && s.cached[keep] == in.tokens[keep]) ++keep;
  s.cached.resize(keep);
  // The last draft is never fed back: positions up to n + k - 2 hold K/V.
  if (!reserve(in.request, s, n + static_cast<std::size_t>(k) - 1)) {
    release(s);
    return;
  }
  const auto first = static_cast<std::size_t>(std::max<std::int64_t>(0, static_cast<std::int64_t>(n) - in.num_prompt_tokens));
  try {
    std::span<float> logits = compute(s, in.tokens.subspan(keep));
    for (std::int32_t j = 0; j < k; ++j) {
      const TokenId d = choose(logits, in, first + static_cast<std::size_t>(j), s);
      out.push_back(d);
      if (j + 1 < k) logits = compute(s, std::span<const TokenId>(&out.back(), 1));
    }
  } catch (const std::exception&) {  // drafts only decide the speed: a draft that fails proposes nothing
    out.clear();
    s.q.clear();
    release(s);
    return;
  }
  s.drafts = out;
}

void DraftModelProposer::finish(const ProposeInput& in) {
  const auto it = seqs_.find(in.request);
  if (it == seqs_.end()) return;
  release(it->second);
  seqs_.erase(it);
}

std::span<const float> DraftModelProposer::draft_probs(std::uint64_t request, std::span<const TokenId> drafts) const {
  const auto it = seqs_.find(request);
  if (it == seqs_.end()) return {};
  const Seq& s = it->second;
  if (s.q.empty() || drafts.size() > s.drafts.size() || !std::equal(drafts.begin(), drafts.end(), s.drafts.begin()))
    return {};
  return std::span<const float>(s.q).first(drafts.size() * static_cast<std::size_t>(options_.target_vocab));
}

std::vector<TokenId> DraftModelProposer::cached_tokens(std::uint64_t request) const {
  const auto it = seqs_.find(request);
  return it == seqs_.end() ? std::vector<TokenId>{} : it->second.cached;
}

}  // namespace kvfleet::spec
