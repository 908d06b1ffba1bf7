// The Engine's API (kvfleet/engine.h): what any thread calls. Requests, aborts, snapshots and KV tasks go
// into the inbox under Impl::mu; the engine thread takes them at its next loop turn (loop.cpp).
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "engine/runtime/engine_impl.h"

namespace kvfleet {

Engine::Engine(const Model& model, const EngineConfig& config)
    : model_(model), config_(config), impl_(std::make_unique<Impl>()) {
  const ModelConfig& mc = model.config();
  max_model_len_ = config.max_model_len > 0 ? std::min(config.max_model_len, mc.max_position_embeddings)
                                            : mc.max_position_embeddings;
  if (config_.served_model_name.empty()) config_.served_model_name = model.name();
  impl_->backend = make_backend(config.backend);
  RunnerOptions ro;
  ro.num_blocks = config.num_blocks;
  ro.block_size = config.block_size;
  ro.max_batch_tokens = config.scheduler.max_num_batched_tokens;
  ro.ep = config.ep;
  impl_->runner = std::make_unique<ModelRunner>(model, *impl_->backend, ro);
  // The CUDA backend picks its KV dtype from the checkpoint; a different explicit request is an error,
  // not a silent change of what the blocks hold.
  if (const auto want = parse_kv_cache_dtype(config.backend.kv_cache_dtype); want && *want != impl_->backend->kv_dtype())
    throw std::invalid_argument("kv_cache_dtype " + config.backend.kv_cache_dtype + ": the " +
                                std::string(impl_->backend->name()) + " backend keeps this model's KV cache in " +
                                std::string(dtype_name(impl_->backend->kv_dtype())));
  KvCacheConfig kv;
  kv.num_blocks = config.num_blocks;
  kv.block_size = config.block_size;
  kv.root = block_hash_root(config_.served_model_name);
  kv.enable_prefix_caching = config.enable_prefix_caching;
  impl_->scheduler = std::make_unique<Scheduler>(config.scheduler, kv);
  kv_events_ = impl_->scheduler->kv().events();
  if (config.kv_tiers.enabled()) {
    if (!config.enable_prefix_caching) throw std::invalid_argument("KV cache tiers need prefix caching");
    if (config.ep != nullptr) throw std::invalid_argument("KV cache tiers do not support expert parallelism");
    const std::uint64_t compat = kvtier::block_compat_hash(config_.served_model_name, mc.model_type, *impl_->backend);
    impl_->tiers = std::make_unique<kvtier::KvTiers>(config.kv_tiers, compat, *impl_->scheduler, *impl_->backend);
    impl_->stats.kv_tiers = impl_->tiers->stats();
    // An idle engine takes in finished I/O at once (its blocks' KV events go out), as a task between steps.
    impl_->tiers->set_wake([this] {
      run_kv_task([this](Scheduler&, Backend&) {
        impl_->tiers->collect();
        std::lock_guard lock(impl_->stats_mu);
        impl_->stats.kv_tiers = impl_->tiers->stats();
      });
    });
  }
  impl_->lockstep = make_lockstep(config_.ep, impl_->mu, impl_->wake);
  set_up_speculation();
  thread_ = std::thread([this] { loop(); });
}

void Engine::leave_group() {
  if (!impl_->lockstep->leave()) return wait_idle();
  impl_->wake.notify_one();
  if (thread_.joinable()) thread_.join();
}

Engine::~Engine() {
  if (!thread_.joinable()) return;  // left its group already
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  impl_->lockstep->wake_peers();  // the other ranks must come to the vote that ends the group
  thread_.join();
  impl_->tiers.reset();  // its I/O threads finish while what they report to still exists
}

void Engine::set_tokenizer(const Tokenizer* tokenizer) { impl_->tokenizer = tokenizer; }

void Engine::set_outputs_done(std::function<void()> done) { impl_->outputs_done = std::move(done); }

RequestId Engine::submit(GenerationRequest r, OutputCallback on_output) {
  if (r.prompt.empty()) throw std::invalid_argument("prompt must not be empty");
  r.sampling.validate();
  if (r.max_tokens < 1) throw std::invalid_argument("max_tokens must be at least 1");
  const auto vocab = model_.config().vocab_size;
  for (TokenId t : r.prompt)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument("prompt token id " + std::to_string(t) + " is outside the vocabulary (size " +
                                  std::to_string(vocab) + ")");
  for (TokenId t : r.resumed_outputs)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument("resumed output token id " + std::to_string(t) + " is outside the vocabulary (size " +
                                  std::to_string(vocab) + ")");
  if (std::cmp_greater_equal(r.resumed_outputs.size(), r.max_tokens))
    throw std::invalid_argument("the resumed outputs (" + std::to_string(r.resumed_outputs.size()) +
                                " tokens) leave nothing of max_tokens (" + std::to_string(r.max_tokens) + ")");
  // A resumed request's outputs so far take context as the prompt does.
  const auto prompt_len = static_cast<std::int64_t>(r.prompt.size() + r.resumed_outputs.size());
  if (prompt_len + 1 > max_model_len_)
    throw std::invalid_argument("the prompt has " + std::to_string(prompt_len) + " tokens; this model's context is " +
                                std::to_string(max_model_len_) + " tokens");
  if (std::string why = why_never_schedulable(prompt_len, config_.scheduler, config_.num_blocks, config_.block_size);
      !why.empty())
    throw std::invalid_argument(std::move(why));
  for (const auto& [t, bias] : r.logit_bias)
    if (t < 0 || t >= vocab || !std::isfinite(bias))
      throw std::invalid_argument("logit_bias: token id " + std::to_string(t) + " is outside the vocabulary or its bias is not finite");
  if (!r.stop.empty() && !impl_->tokenizer) throw std::invalid_argument("stop strings need a tokenizer");
  if (r.detokenize && !impl_->tokenizer) throw std::invalid_argument("detokenize needs a tokenizer");
  std::unique_ptr<TokenMatcher> matcher;
  if (r.grammar && !r.prefill_only) {  // a prefill_only request samples nothing: nothing to constrain
    if (r.grammar->vocab_size() > static_cast<std::size_t>(vocab))
      throw std::invalid_argument("the grammar's vocabulary (" + std::to_string(r.grammar->vocab_size()) +
                                  " tokens) is larger than the model's (" + std::to_string(vocab) + ")");
    matcher = r.grammar->make_matcher();  // here, on the caller's thread: never a cost to the engine's steps
    if (!matcher) throw std::invalid_argument("the grammar made no matcher");
    // A resumed request's outputs were sampled under this grammar elsewhere: the matcher reads them first.
    for (const TokenId t : r.resumed_outputs)
      if (!matcher->accept_token(t) || matcher->is_terminated())
        throw std::invalid_argument("the resumed outputs are not a prefix the grammar allows to continue");
  }
  const RequestId id = impl_->next_id++;
  {
    std::lock_guard lock(impl_->mu);
    impl_->submissions.push_back({id, EngineClock::now(), std::move(r), std::move(on_output), std::move(matcher)});
  }
  impl_->notify();
  return id;
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->aborts.push_back({id, {}});
  }
  impl_->notify();
}

void Engine::abort_all(std::string error) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->abort_everything = std::move(error);
  }
  impl_->notify();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->stats_mu);
  return impl_->stats;
}

KvSnapshot Engine::kv_snapshot() {
  auto promise = std::make_shared<std::promise<KvSnapshot>>();
  std::future<KvSnapshot> f = promise->get_future();
  kv_snapshot([promise](KvSnapshot snap) { promise->set_value(std::move(snap)); });
  return f.get();
}

void Engine::kv_snapshot(std::function<void(KvSnapshot)> done) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->snapshots.push_back(std::move(done));
  }
  impl_->notify();
}

void Engine::run_kv_task(KvTask task) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->kv_tasks.push_back(std::move(task));
  }
  impl_->notify();
}

void Engine::wait_idle() {
  std::unique_lock lock(impl_->mu);
  impl_->idle.wait(lock, [&] { return impl_->submissions.empty() && impl_->aborts.empty() && !impl_->busy; });
}

}  // namespace kvfleet
