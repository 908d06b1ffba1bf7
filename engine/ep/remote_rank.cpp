// RemoteRank (ep/remote_rank.h): requests to another process's rank and their outputs back.
#include "engine/ep/remote_rank.h"

#include <stdexcept>

#include "engine/ep/wire.h"

namespace kvfleet::ep {
namespace json = boost::json;

RemoteRank::RemoteRank(int rank, int size, int fd, std::shared_ptr<KvEventRing> ring, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout), ring_(std::move(ring)) {
  channel_ = std::make_unique<Channel>(
      fd, timeout, [this](Message& m) { on_message(m); }, [this](const std::string& why) { on_closed(why); });
  channel_->start();
}

RemoteRank::~RemoteRank() { channel_.reset(); }

void RemoteRank::on_failure(std::function<void(const std::string&)> handler) {
  std::string failed;
  {
    std::lock_guard lock(mu_);
    on_failure_ = handler;
    failed = failure_;
  }
  if (!failed.empty() && handler) handler(failed);
}

void RemoteRank::on_ring(std::function<void()> handler) {
  std::lock_guard lock(mu_);
  on_ring_ = std::move(handler);
}

RequestId RemoteRank::submit(GenerationRequest request, OutputCallback on_output) {
  if (request.grammar)  // a compiled grammar does not travel over the channel (EpGroup::submit avoids this)
    throw std::invalid_argument("constrained decoding runs only on the expert-parallel ranks in rank 0's process");
  RequestId id = 0;
  std::future<Ack> ack;
  {
    std::lock_guard lock(mu_);
    if (!failure_.empty()) throw std::runtime_error(failure_);
    id = next_id_++;
    callbacks_[id] = std::move(on_output);
    ack = acks_[id].get_future();
  }
  channel_->send(Message{{"t", "submit"}, {"id", id}, {"req", to_json(request)}});
  const bool answered = ack.wait_for(timeout_) == std::future_status::ready;
  Ack a;
  if (answered) a = ack.get();
  if (a.ok) return id;
  {
    std::lock_guard lock(mu_);
    callbacks_.erase(id);
    acks_.erase(id);
  }
  if (!answered)
    throw std::runtime_error("expert-parallel rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                             " did not take the request within " + std::to_string(timeout_.count()) + " ms");
  if (a.invalid) throw std::invalid_argument(a.error);
  throw std::runtime_error(a.error);
}

void RemoteRank::kv_state(std::function<void(boost::json::object)> done) { query("kv_state", std::move(done)); }

void RemoteRank::stats_now(std::function<void(EngineStats)> done) {
  query("stats", [this, done = std::move(done)](json::object a) {
    if (const auto* s = a.if_contains("s")) return done(stats_from_json(s->as_object()));
    done(stats());  // gone: what it sent last
  });
}

void RemoteRank::query(const std::string& what, std::function<void(boost::json::object)> done) {
  std::uint64_t id = 0;
  std::string failed;
  {
    std::lock_guard lock(mu_);
    failed = failure_;
    if (failed.empty()) {
      id = next_query_++;
      queries_[id] = std::move(done);
    }
  }
  if (id == 0) return done(json::object{{"error", failed}});
  channel_->send(Message{{"t", "query"}, {"id", id}, {"what", what}});
}

void RemoteRank::abort(RequestId id) { channel_->send(Message{{"t", "abort"}, {"id", id}}); }

void RemoteRank::abort_all(const std::string& error) { channel_->send(Message{{"t", "abort_all"}, {"error", error}}); }

EngineStats RemoteRank::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void RemoteRank::on_message(Message& m) {
  const std::string_view t = m.at("t").as_string();
  if (t == "out") {
    const auto id = m.at("id").to_number<RequestId>();
    RequestOutput o = output_from_json(m.at("o").as_object());
    o.id = id;
    OutputCallback cb;
    {
      std::lock_guard lock(mu_);
      const auto it = callbacks_.find(id);
      if (it == callbacks_.end()) return;  // refused, or already failed
      cb = o.finished ? std::move(it->second) : it->second;
      if (o.finished) callbacks_.erase(it);
    }
    if (cb) cb(o);
  } else if (t == "ack") {
    Ack a;
    const auto* error = m.if_contains("error");
    a.ok = !error;
    if (error) a.error = std::string(error->as_string());
    a.invalid = m.contains("invalid");
    std::lock_guard lock(mu_);
    if (auto it = acks_.find(m.at("id").to_number<RequestId>()); it != acks_.end()) {
      it->second.set_value(std::move(a));
      acks_.erase(it);
    }
  } else if (t == "kv") {
    std::vector<BlockHash> hashes;
    for (const auto& h : m.at("h").as_array()) hashes.push_back(h.to_number<BlockHash>());
    const std::string_view type = m.at("type").as_string();
    const auto kind = type == "stored" ? KvEvent::Type::stored : type == "removed" ? KvEvent::Type::removed : KvEvent::Type::cleared;
    ring_->publish(kind, std::move(hashes), m.at("p").to_number<BlockHash>());
  } else if (t == "answer") {
    std::function<void(json::object)> done;
    {
      std::lock_guard lock(mu_);
      const auto it = queries_.find(m.at("id").to_number<std::uint64_t>());
      if (it == queries_.end()) return;  // answered as failed already
      done = std::move(it->second);
      queries_.erase(it);
    }
    done(std::move(m.at("a").as_object()));
  } else if (t == "ring") {
    std::function<void()> ring;
    {
      std::lock_guard lock(mu_);
      ring = on_ring_;
    }
    if (ring) ring();
  } else if (t == "stats") {
    EngineStats s = stats_from_json(m.at("s").as_object());
    std::lock_guard lock(mu_);
    stats_ = std::move(s);
  } else {
    throw std::invalid_argument("unknown message type '" + std::string(t) + "'");
  }
}

void RemoteRank::on_closed(const std::string& why) {
  const std::string failure =
      "expert-parallel rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " is gone: " + why;
  std::unordered_map<RequestId, OutputCallback> callbacks;
  std::unordered_map<std::uint64_t, std::function<void(json::object)>> queries;
  std::function<void(const std::string&)> handler;
  {
    std::lock_guard lock(mu_);
    failure_ = failure;
    for (auto& [id, p] : acks_) p.set_value(Ack{false, false, failure});
    acks_.clear();
    callbacks.swap(callbacks_);
    queries.swap(queries_);
    handler = on_failure_;
  }
  for (auto& [id, done] : queries) done(json::object{{"error", failure}});
  for (auto& [id, cb] : callbacks) {
    RequestOutput o;
    o.id = id;
    o.finished = true;
    o.finish_reason = FinishReason::aborted;
    o.error = failure;
    if (cb) cb(o);
  }
  if (handler) handler(failure);
}

}  // namespace kvfleet::ep
