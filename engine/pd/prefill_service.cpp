#include "engine/pd/prefill_service.h"

#include <algorithm>
#include <boost/asio/steady_timer.hpp>

#include "engine/pd/ucx/transport.h"
#include "engine/pd/wire.h"
#include "kvfleet/http/json_error.h"

namespace kvfleet::pd {
using boost::asio::awaitable;

namespace {

std::optional<std::uint64_t> query_number(const http::Request& req, std::string_view name) {
  const auto v = req.query_param(name);
  if (!v || v->empty() || v->size() > 19 || !std::all_of(v->begin(), v->end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoull(*v);
}

// The HTTP transport's sink: the pull's frames are the chunks of the response body.
class HttpPullSink : public PullSink {
 public:
  explicit HttpPullSink(http::ResponseWriter& w) : w_(w) {}
  awaitable<bool> write(std::string_view piece) override { return w_.write(piece); }
  awaitable<bool> write_pieces(std::span<const std::string_view> pieces) override { return w_.write_pieces(pieces); }
  awaitable<bool> finish() override { return w_.finish(); }

 private:
  http::ResponseWriter& w_;
};

}  // namespace

PrefillService::PrefillService(Engine& engine, KvLayout layout, PdConfig config)
    : engine_(engine), layout_(std::move(layout)), compat_(compat_hash(layout_)), config_(config) {
  per_read_ = static_cast<std::uint32_t>(std::clamp<std::size_t>((8u << 20) / layout_.block_bytes(), 1, 64));
  buffers_->bytes = per_read_ * block_frame_bytes(layout_.block_bytes());
  per_send_ = static_cast<std::uint32_t>(std::clamp<std::size_t>((1u << 20) / layout_.block_bytes(), 1, 64));
  reaper_ = std::thread([this] { reap(); });
}

PrefillService::~PrefillService() {
  ucx_.reset();  // no pull is served after this
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    for (const auto& [id, lease] : leases_) ids.push_back(id);
  }
  wake_.notify_all();
  reaper_.join();
  for (const auto id : ids) release(id);
}

std::size_t PrefillService::num_leases() const {
  std::lock_guard lock(mu_);
  return leases_.size();
}

std::uint64_t PrefillService::leases_expired() const {
  std::lock_guard lock(mu_);
  return expired_;
}

bool PrefillService::touch(std::uint64_t id) {
  std::lock_guard lock(mu_);
  const auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  it->second.deadline = Clock::now() + it->second.ttl;
  return true;
}

bool PrefillService::release(std::uint64_t id) {
  Lease gone;  // unpins as it goes out of scope (or after the write of a pull still sending from it)
  {
    std::lock_guard lock(mu_);
    const auto it = leases_.find(id);
    if (it == leases_.end()) return false;
    gone = std::move(it->second);
    leases_.erase(it);
  }
  if (gone.prefill != 0) engine_.abort(gone.prefill);  // nobody will pull what it computes
  return true;
}

void PrefillService::reap() {
  const auto period = std::clamp(config_.lease / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(200));
  std::unique_lock lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, period);
    const auto now = Clock::now();
    std::vector<Lease> ended;  // the engine frees their blocks at its next turn
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      ended.push_back(std::move(it->second));
      it = leases_.erase(it);
      ++expired_;
    }
    lock.unlock();
    for (const Lease& l : ended)
      if (l.prefill != 0) engine_.abort(l.prefill);
    ended.clear();
    lock.lock();
  }
}

void PrefillService::prefill_done(std::uint64_t id, const RequestOutput& out) {
  auto hold = out.pin != 0 ? std::make_shared<EnginePin>(engine_, out.pin) : nullptr;  // unpins if the lease is gone
  std::lock_guard lock(mu_);
  const auto it = leases_.find(id);
  if (it == leases_.end()) return;
  it->second.prefill = 0;
  it->second.done = out.pin;
  it->second.done_hold = std::move(hold);
  it->second.failed = out.pin == 0;
}

PrefillService::Ready PrefillService::locate(const Lease& lease, std::uint32_t at, std::uint32_t last, Scheduler& s,
                                             Backend& b) const {
  Ready r;
  KvCacheManager& kv = s.kv();
  const PinId pin = lease.pin;
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const std::span<const BlockId> done = kv.pinned_blocks(lease.done);
  for (std::size_t have = kv.pinned_blocks(pin).size(); lease.first + have < last; ++have) {
    const std::size_t i = lease.first + have;  // the next block to pin, in order
    BlockId block = i < done.size() ? done[i] : kNoBlock;
    if (block == kNoBlock) block = kv.cached_block(lease.hashes[have], std::span(*lease.tokens).subspan(i * bs, bs));
    if (block == kNoBlock || !kv.add_to_pin(pin, block)) break;
  }
  const std::span<const BlockId> pinned = kv.pinned_blocks(pin);
  if (lease.first + pinned.size() <= at) {
    r.state = lease.failed ? Ready::State::failed : Ready::State::waiting;
    return r;
  }
  r.state = Ready::State::ready;
  r.blocks.assign(pinned.begin() + (at - lease.first), pinned.begin() + std::min<std::size_t>(pinned.size(), last - lease.first));
  const std::int64_t layers = b.kv_cache_shape().num_layers;
  for (const BlockId block : r.blocks)
    for (std::int64_t l = 0; l < layers; ++l) {
      const void* p = b.kv_host_bytes(l, block);
      if (!p) {
        r.layers.clear();
        return r;
      }
      r.layers.push_back(static_cast<const char*>(p));
    }
  return r;
}

awaitable<PrefillService::Ready> PrefillService::wait_ready(std::uint64_t id, std::uint32_t at, std::uint32_t last,
                                                            std::function<bool()> stop) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  for (;;) {
    if (stop && stop()) co_return Ready{Ready::State::waiting, {}, {}};
    std::optional<Lease> lease;  // a copy without the holds: an engine-thread task must never drop the last
    {                            // one (EnginePin's release queues a task)
      std::lock_guard lock(mu_);
      if (const auto it = leases_.find(id); it != leases_.end()) {
        it->second.deadline = Clock::now() + it->second.ttl;
        lease = it->second;
        lease->hold.reset();
        lease->done_hold.reset();
      }
    }
    if (!lease) co_return Ready{Ready::State::gone, {}, {}};
    auto find = [this, lease = std::move(*lease), at, last](Scheduler& s, Backend& b) { return locate(lease, at, last, s, b); };
    Ready r = co_await on_engine_thread(engine_, std::move(find));  // (runs between steps: paced by them)
    if (r.state != Ready::State::waiting) co_return r;
    timer.expires_after(std::chrono::milliseconds(2));
    co_await timer.async_wait(boost::asio::use_awaitable);
  }
}

awaitable<void> PrefillService::handle_pull(const http::Request& req, http::ResponseWriter& w) {
  const auto id = query_number(req, "transfer"), from = query_number(req, "from"), count = query_number(req, "count");
  if (!id || !from || !count || *count == 0) {
    co_await w.send(http::json_error(400, "give transfer, from and count (count > 0)", "invalid_request_error", {}, "bad_range"));
    co_return;
  }
  Lease lease;  // the pull's copy holds the stream pin until it is done, so the blocks it sends stay
  bool known = false;
  {
    std::lock_guard lock(mu_);
    if (const auto it = leases_.find(*id); it != leases_.end()) lease = it->second, known = true;
  }
  if (!known) {
    co_await w.send(http::json_error(410, "no such transfer (its lease expired, or it was released)", "invalid_request_error",
                                     "transfer", "lease_expired"));
    co_return;
  }
  if (*from < lease.first || *from + *count > std::uint64_t{lease.first} + lease.count) {
    co_await w.send(http::json_error(400, "blocks outside the transfer's range", "invalid_request_error", {}, "bad_range"));
    co_return;
  }
  touch(*id);
  http::Headers headers{{"Content-Type", "application/octet-stream"}};
  if (!co_await w.begin_stream(200, std::move(headers))) {
    release(*id);
    co_return;
  }
  w.on_disconnect([this, id = *id] { release(id); });  // D is gone: nobody will pull the rest
  HttpPullSink sink(w);
  co_await serve_blocks(*id, lease, static_cast<std::uint32_t>(*from), static_cast<std::uint32_t>(*from + *count), sink);
}

awaitable<void> PrefillService::serve_pull(std::uint64_t id, std::uint32_t from, std::uint32_t count, PullSink& sink) {
  Lease lease;
  bool known = false;
  {
    std::lock_guard lock(mu_);
    if (const auto it = leases_.find(id); it != leases_.end()) lease = it->second, known = true;
  }
  std::optional<ErrorFrame> refused;
  if (!known) refused = ErrorFrame{ErrorCode::lease_expired, "no such transfer (its lease expired, or it was released)"};
  else if (count == 0 || from < lease.first || std::uint64_t{from} + count > std::uint64_t{lease.first} + lease.count)
    refused = ErrorFrame{ErrorCode::bad_range, "blocks outside the transfer's range"};
  if (refused) {
    const std::string bytes = encode(*refused);
    const bool written = co_await sink.write(bytes);  // (named: GCC 12 miscompiles a co_await in an if)
    if (written) co_await sink.finish();
    co_return;
  }
  touch(id);
  co_await serve_blocks(id, lease, from, from + count, sink);
}

awaitable<void> PrefillService::serve_blocks(std::uint64_t id, const Lease& lease, std::uint32_t first,
                                             std::uint32_t last, PullSink& w) {
  End end;
  bool ok = true;
  const std::function<bool()> no_stop;
  for (std::uint32_t at = first; ok && at < last;) {
    const Ready ready = co_await wait_ready(id, at, last, no_stop);  // what is computed by now (mostly all)
    if (ready.state == Ready::State::ready) {
      if (ready.layers.empty()) {
        ok = co_await send_copied(w, id, lease, at, ready, end);
      } else {
        ok = co_await send_from_cache(w, id, lease, at, ready, end);
      }
      at += static_cast<std::uint32_t>(ready.blocks.size());
    } else if (ready.state == Ready::State::failed) {
      ok = co_await send_error(w, ErrorCode::internal, "the prefill failed; its blocks are not there");
    } else {
      ok = co_await send_error(w, ErrorCode::lease_expired, "the transfer's lease expired; its blocks are freed");
    }
  }
  if (!ok) {  // D gone, or the lease ended or the prefill failed (an error frame went out)
    release(id);
    co_return;
  }
  const std::string bytes = encode(end);
  ok = co_await w.write(bytes);
  if (ok) ok = co_await w.finish();
  if (!ok || last == lease.first + lease.count) release(id);  // everything delivered (or D gone)
}

awaitable<void> PrefillService::handle_release(const http::Request& req, http::ResponseWriter& w) {
  const auto id = query_number(req, "transfer");
  if (!id) {
    co_await w.send(http::json_error(400, "give transfer", "invalid_request_error", "transfer", "bad_request"));
    co_return;
  }
  const bool released = release(*id);
  co_await w.send(http::Response::json(200, released ? R"({"released":true})" : R"({"released":false})"));
}

}  // namespace kvfleet::pd
