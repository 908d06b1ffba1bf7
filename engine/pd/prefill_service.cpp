#include "engine/pd/prefill_service.h"

#include <algorithm>

#include "engine/pd/ucx_transport.h"
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
  awaitable<bool> finish() override { return w_.finish(); }

 private:
  http::ResponseWriter& w_;
};

http::Response frame_response(const Frame& f) {
  http::Response r;
  r.headers.set("Content-Type", "application/octet-stream");
  r.body = encode(f);
  return r;
}

}  // namespace

PrefillService::PrefillService(Engine& engine, KvLayout layout, PdConfig config)
    : engine_(engine), layout_(std::move(layout)), compat_(compat_hash(layout_)), config_(config) {
  per_read_ = static_cast<std::uint32_t>(std::clamp<std::size_t>((8u << 20) / layout_.block_bytes(), 1, 64));
  buffers_->bytes = per_read_ * block_frame_bytes(layout_.block_bytes());
  reaper_ = std::thread([this] { reap(); });
}

std::unique_ptr<char[]> PrefillService::BufferPool::take() {
  {
    std::lock_guard lock(mu);
    if (!spare.empty()) {
      auto b = std::move(spare.back());
      spare.pop_back();
      return b;
    }
  }
  return std::make_unique_for_overwrite<char[]>(bytes);
}

void PrefillService::BufferPool::give_back(std::unique_ptr<char[]> buffer) {
  std::lock_guard lock(mu);
  if (buffer && spare.size() < kSpare) spare.push_back(std::move(buffer));
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
  PinId pin = 0;
  {
    std::lock_guard lock(mu_);
    const auto it = leases_.find(id);
    if (it == leases_.end()) return false;
    pin = it->second.pin;
    leases_.erase(it);
  }
  engine_.run_kv_task([pin](Scheduler& s, Backend&) { s.kv().unpin(pin); });
  return true;
}

void PrefillService::reap() {
  const auto period = std::clamp(config_.lease / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(200));
  std::unique_lock lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, period);
    const auto now = Clock::now();
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      const PinId pin = it->second.pin;  // the engine frees the blocks at its next turn
      engine_.run_kv_task([pin](Scheduler& s, Backend&) { s.kv().unpin(pin); });
      it = leases_.erase(it);
      ++expired_;
    }
  }
}

awaitable<void> PrefillService::handle_prefill(const http::Request& req, http::ResponseWriter& w) {
  Hello hello;
  std::string bad_frame;
  try {
    Frame f = decode_one(req.body);
    if (!std::holds_alternative<Hello>(f)) throw WireError(WireError::Kind::malformed, "expected a hello frame");
    hello = std::get<Hello>(std::move(f));
  } catch (const WireError& e) {
    bad_frame = e.what();
  }
  if (!bad_frame.empty()) {  // (no co_await inside a handler)
    co_await w.send(http::json_error(400, "bad hello frame: " + bad_frame, "invalid_request_error", {}, "bad_frame"));
    co_return;
  }
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  std::string problem, code = "bad_request";
  int status = 400;
  const std::vector<BlockHash> hashes = block_hashes(layout_.root, hello.tokens, bs);
  if (hello.version != kProtocolVersion) {
    status = 409, code = "protocol_version", problem = "protocol version " + std::to_string(hello.version) + " (this replica speaks 1)";
  } else if (hello.layout != layout_ || hello.compat_hash != compat_) {
    status = 409, code = "compat_mismatch";
    problem = "KV layouts differ: " + describe_mismatch(layout_, hello.layout);
    if (hello.layout == layout_) problem = "compatibility hashes differ";
  } else if (pick_transport(hello.transports, offered_transports()).empty()) {
    status = 409, code = "no_common_transport", problem = "no common transport (this replica offers " + offered_list() + ")";
  } else if (hello.tokens.empty() || hello.tokens.size() % bs != 0) {
    problem = "tokens must be whole blocks of " + std::to_string(bs);
  } else if (hello.held.size() >= hashes.size() || !std::equal(hello.held.begin(), hello.held.end(), hashes.begin())) {
    problem = "held blocks must be a proper prefix of the prompt's blocks";
  }
  if (!problem.empty()) {
    co_await w.send(http::json_error(status, problem, http::error_type_for(status), {}, code));
    co_return;
  }
  GenerationRequest g;
  g.prompt = hello.tokens;
  g.prefill_only = true;
  g.max_tokens = 1;
  g.ignore_eos = true;
  auto queue = std::make_shared<http::AsyncQueue<RequestOutput>>(co_await boost::asio::this_coro::executor);
  RequestId rid = 0;
  std::string refused;
  try {
    rid = engine_.submit(std::move(g), [queue](const RequestOutput& o) { queue->push(o); });
  } catch (const std::invalid_argument& e) {
    refused = e.what();
  }
  if (!refused.empty()) {
    co_await w.send(http::json_error(400, refused, "invalid_request_error", {}, "prefill_failed"));
    co_return;
  }
  w.on_disconnect([this, rid] { engine_.abort(rid); });  // D left: stop computing for it
  RequestOutput out;
  while (auto o = co_await queue->pop()) {
    out = std::move(*o);
    if (out.finished) break;
  }
  w.on_disconnect([] {});
  if (out.pin == 0) {
    co_await w.send(http::json_error(503, "the prefill did not complete: " + out.error, "overloaded_error", {}, "prefill_failed"));
    co_return;
  }
  Accept a;
  a.layout = layout_;
  a.compat_hash = compat_;
  a.transport = pick_transport(hello.transports, offered_transports());
  if (a.transport == "ucx") a.transport_port = ucx_->port();
  a.lease_ms = static_cast<std::uint32_t>(
      hello.lease_ms > 0 ? std::min<std::int64_t>(hello.lease_ms, config_.lease.count()) : config_.lease.count());
  a.first_block = static_cast<std::uint32_t>(hello.held.size());
  a.num_blocks = static_cast<std::uint32_t>(hashes.size() - hello.held.size());
  a.hashes.assign(hashes.begin() + static_cast<std::ptrdiff_t>(a.first_block), hashes.end());
  {
    std::lock_guard lock(mu_);
    a.transfer_id = next_id_++;
    leases_[a.transfer_id] = {out.pin, a.first_block, a.num_blocks, a.hashes, std::chrono::milliseconds(a.lease_ms),
                              Clock::now() + std::chrono::milliseconds(a.lease_ms)};
  }
  if (w.client_gone() || !co_await w.send(frame_response(a))) release(a.transfer_id);
}

std::shared_ptr<PrefillService::Batches> PrefillService::start_read(boost::asio::any_io_executor ex, PinId pin,
                                                                    std::uint32_t from, std::uint32_t count) {
  auto out = std::make_shared<Batches>(std::move(ex));
  const std::size_t stride = block_frame_bytes(layout_.block_bytes());
  // Copies on the engine thread while the pin holds the blocks, straight into the payloads of a batch of
  // block frames (one backend call: the CUDA backend stages it through pinned memory); the io thread
  // writes the frames' headers and checksums. A lease that ended before this turn finds no pin: no bytes.
  engine_.run_kv_task([out, pool = buffers_, pin, from, count, stride](Scheduler& s, Backend& b) {
    Batch batch;
    const auto blocks = s.kv().pinned_blocks(pin);
    if (blocks.size() >= static_cast<std::size_t>(from) + count) {
      batch.bytes = pool->take();  // count <= per_read_
      batch.size = stride * count;
      b.read_kv_blocks(blocks.subspan(from, count), batch.bytes.get() + kBlockPayloadOffset, stride);
    }
    out->push(std::move(batch));
  });
  return out;
}

awaitable<void> PrefillService::handle_pull(const http::Request& req, http::ResponseWriter& w) {
  const auto id = query_number(req, "transfer"), from = query_number(req, "from"), count = query_number(req, "count");
  if (!id || !from || !count || *count == 0) {
    co_await w.send(http::json_error(400, "give transfer, from and count (count > 0)", "invalid_request_error", {}, "bad_range"));
    co_return;
  }
  Lease lease;
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
  // Batches of about 8 MiB; the next batch is copied on the engine thread while this one is sent.
  const std::uint32_t per_read = per_read_;
  const auto ex = co_await boost::asio::this_coro::executor;
  std::shared_ptr<Batches> pending;
  if (touch(id)) pending = start_read(ex, lease.pin, first, std::min(per_read, last - first));
  const std::size_t stride = block_frame_bytes(layout_.block_bytes());
  for (std::uint32_t at = first; at < last;) {
    const std::uint32_t n = std::min(per_read, last - at);
    Batch batch;  // n block frames back to back, or empty when the lease ended first
    if (pending) {
      auto got = co_await pending->pop();
      if (got) batch = std::move(*got);
    }
    pending.reset();
    if (at + n < last && touch(id)) pending = start_read(ex, lease.pin, at + n, std::min(per_read, last - at - n));
    if (batch.size == 0) {
      ErrorFrame e{ErrorCode::lease_expired, "the transfer's lease expired; its blocks are freed"};
      const std::string bytes = encode(e);
      co_await w.write(bytes);
      co_await w.finish();
      co_return;
    }
    for (std::uint32_t i = 0; i < n; ++i) {
      char* frame = batch.bytes.get() + i * stride;
      put_block_header(frame, at + i, lease.hashes[at + i - lease.first], 0, static_cast<std::uint16_t>(layout_.num_layers),
                       layout_.block_bytes());
      seal_frame(frame, stride);
    }
    const bool sent = co_await w.write(std::string_view(batch.bytes.get(), batch.size));  // one chunk, one write
    buffers_->give_back(std::move(batch.bytes));
    if (!sent) {
      release(id);
      co_return;
    }
    touch(id);
    end.payload_bytes += batch.size;
    end.num_blocks += n;
    at += n;
  }
  const std::string bytes = encode(end);
  bool ok = co_await w.write(bytes);
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
