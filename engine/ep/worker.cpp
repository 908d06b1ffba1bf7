// EpWorker (kvfleet/ep_worker.h): a remote rank's side of the request channel. The channel's reader thread
// submits and aborts on the engine; the engine thread's output callbacks queue frames; a pump thread sends
// the KV events the engine publishes (woken by the ring's listener) and the engine's stats every
// kStatsPeriod, which is also the heartbeat rank 0 watches. The engine votes through a
// WorkerCommunicator (ep/paced_comm.h): on rank 0's tickets, so an idle group sleeps.
#include "kvfleet/ep_worker.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "engine/comm/tcp_store.h"
#include "engine/ep/channel.h"
#include "engine/ep/paced_comm.h"
#include "engine/ep/remote_rank.h"
#include "engine/ep/wire.h"
#include "kvfleet/kv_cache_manager.h"

namespace kvfleet {
namespace json = boost::json;
using ep::Message;

namespace {
constexpr std::chrono::milliseconds kStatsPeriod{200};
}

struct EpWorker::Impl {
  std::unique_ptr<Communicator> gloo;  // or NCCL (--ep-comm)
  std::unique_ptr<ep::WorkerCommunicator> comm;  // over gloo: votes on rank 0's tickets
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ep::Channel> channel;
  std::shared_ptr<void> kv_listener;
  std::thread pump;

  mutable std::mutex mu;
  std::condition_variable cv;
  bool ended = false, kv_news = false;
  bool engine_alive = true;  // the reader may call into the engine (false once the destructor began)
  std::string why;
  std::unordered_map<RequestId, RequestId> engine_id;  // rank 0's id -> this engine's

  void end(const std::string& reason) {
    {
      std::lock_guard lock(mu);
      if (ended) return;
      ended = true;
      why = reason;
    }
    cv.notify_all();
  }

  void on_message(Message& m) {
    const std::string_view t = m.at("t").as_string();
    if (t == "vote") return comm->ticket();

    std::lock_guard lock(mu);  // the engine stays while this runs (the destructor takes mu to end it)
    if (!engine_alive) return;
    if (t == "abort") {
      const auto it = engine_id.find(m.at("id").to_number<RequestId>());
      if (it != engine_id.end()) engine->abort(it->second);  // else finished already
      return;
    }
    if (t == "abort_all") return engine->abort_all(std::string(m.at("error").as_string()));
    if (t == "submit") return submit(m.at("id").to_number<RequestId>(), m.at("req").as_object());
    if (t == "query") return query(m.at("id").to_number<std::uint64_t>(), m.at("what").as_string());
    throw std::invalid_argument("unknown message type '" + std::string(t) + "'");
  }

  void submit(RequestId id, const json::object& body) {
    Message ack{{"t", "ack"}, {"id", id}};
    try {
      auto on_output = [this, id](const RequestOutput& o) {
        Message out{{"t", "out"}, {"id", id}, {"o", ep::to_json(o)}};
        std::lock_guard lock(mu);
        if (o.finished) engine_id.erase(id);
        if (channel) channel->send(std::move(out));
      };
      // (Caller holds mu: the mapping exists before the first output can look for it.)
      engine_id[id] = engine->submit(ep::request_from_json(body), std::move(on_output));
    } catch (const std::invalid_argument& e) {
      ack["error"] = e.what();
      ack["invalid"] = true;
    } catch (const std::exception& e) {
      ack["error"] = e.what();
    }
    channel->send(std::move(ack));
  }

  // Caller holds mu. A question rank 0 asks for fresh figures; the answer travels as {t: answer, id, a}.
  void query(std::uint64_t id, std::string_view what) {
    if (what == "stats") {
      channel->send(Message{{"t", "answer"}, {"id", id}, {"a", json::object{{"s", ep::to_json(engine->stats())}}}});
      return;
    }
    if (what != "kv_state") {
      channel->send(Message{{"t", "answer"}, {"id", id}, {"a", json::object{{"error", "unknown query '" + std::string(what) + "'"}}}});
      return;
    }
    engine->run_kv_task([this, id](Scheduler& s, Backend&) {
      Message answer{{"t", "answer"}, {"id", id}, {"a", ep::kv_state_json(s)}};
      std::lock_guard lock(mu);
      if (channel) channel->send(std::move(answer));
    });
  }

  // Sends the ring's events after `seq`; when the pump fell behind the ring, the cache as it is instead.
  void send_kv(std::uint64_t& seq) {
    KvReplay replay = engine->kv_events()->since(seq);
    if (replay.fell_behind) {
      const KvSnapshot snap = engine->kv_snapshot();
      channel->send(Message{{"t", "kv"}, {"type", "cleared"}, {"h", json::array{}}, {"p", 0}});
      for (const auto& b : snap.blocks)
        channel->send(Message{{"t", "kv"}, {"type", "stored"}, {"h", json::array{b.hash}}, {"p", b.parent}});
      seq = snap.seq;
      replay = engine->kv_events()->since(seq);
      if (replay.fell_behind) return;  // again next time
    }
    for (const KvEvent& e : replay.events) {
      json::array hashes;
      for (BlockHash h : e.block_hashes) hashes.emplace_back(h);
      channel->send(Message{{"t", "kv"}, {"type", to_string(e.type)}, {"h", std::move(hashes)}, {"p", e.parent}});
      seq = e.seq;
    }
  }

  void pump_loop() {
    std::uint64_t seq = 0;
    auto next_stats = std::chrono::steady_clock::now();
    for (;;) {
      {
        std::unique_lock lock(mu);
        cv.wait_until(lock, next_stats, [&] { return ended || kv_news; });
        if (ended) return;
        kv_news = false;
      }
      send_kv(seq);
      if (std::chrono::steady_clock::now() >= next_stats) {
        channel->send(Message{{"t", "stats"}, {"s", ep::to_json(engine->stats())}});
        next_stats = std::chrono::steady_clock::now() + kStatsPeriod;
      }
    }
  }
};

EpWorker::EpWorker(const Model& model, const Tokenizer* tokenizer, const EngineConfig& config, const EpCommOptions& opts)
    : impl_(std::make_unique<Impl>()) {
  if (opts.rank < 1 || opts.rank >= opts.size)
    throw std::invalid_argument("an expert-parallel worker is rank 1 .. " + std::to_string(opts.size - 1) + ", not " +
                                std::to_string(opts.rank));
  Impl& m = *impl_;
  const auto [master_host, master_port] = comm::parse_host_port(opts.master);
  const std::string address = ep::reachable_address(opts.bind_host, master_host);
  unsigned short port = 0;
  const int listen_fd = ep::listen_tcp(opts.bind_host.empty() && address != "127.0.0.1" ? "0.0.0.0" : address, port);
  struct CloseListener {
    int fd;
    ~CloseListener() { ::close(fd); }
  } close_listener{listen_fd};
  EngineConfig ec = config;
  m.gloo = make_ep_communicator(opts, ec.backend);
  m.comm = std::make_unique<ep::WorkerCommunicator>(*m.gloo);
  ec.ep = m.comm.get();
  m.engine = std::make_unique<Engine>(model, ec);
  m.engine->set_tokenizer(tokenizer);
  const std::string where = address + ":" + std::to_string(port);
  const auto join = std::max(opts.timeout, opts.join_timeout);
  comm::TcpStoreClient store(master_host, master_port, join);
  store.set(ep::channel_key(opts.rank), std::vector<char>(where.begin(), where.end()));
  const int fd = ep::accept_tcp(listen_fd, join);
  m.channel = std::make_unique<ep::Channel>(
      fd, opts.timeout, [&m](Message& msg) { m.on_message(msg); },
      [&m](const std::string& why) {
        m.comm->shutdown("expert-parallel rank 0 is gone: " + why);
        m.end("rank 0 is gone: " + why);
      });
  m.comm->attach(m.channel.get());
  m.kv_listener = m.engine->kv_events()->subscribe([&m] {
    {
      std::lock_guard lock(m.mu);
      m.kv_news = true;
    }
    m.cv.notify_all();
  });
  m.channel->start();
  m.pump = std::thread([&m] { m.pump_loop(); });
}

EpWorker::~EpWorker() {
  Impl& m = *impl_;
  m.end("stopped");
  if (m.pump.joinable()) m.pump.join();
  m.kv_listener.reset();
  if (m.comm) {
    m.comm->attach(nullptr);
    m.comm->shutdown("expert-parallel rank " + std::to_string(m.comm->rank()) + " is stopping");  // votes fail at once
  }
  {
    std::lock_guard lock(m.mu);
    m.engine_alive = false;  // the channel's reader leaves the engine alone from here
  }
  m.engine.reset();  // joins its thread: no output callback runs after this
  std::unique_ptr<ep::Channel> channel;
  {
    std::lock_guard lock(m.mu);
    channel = std::move(m.channel);
  }
  channel.reset();  // rank 0 learns that this rank is gone
  m.comm.reset();
  m.gloo.reset();
}

bool EpWorker::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->ended; });
}

std::string EpWorker::why() const {
  std::lock_guard lock(impl_->mu);
  return impl_->why;
}

void EpWorker::stop(const std::string& why) { impl_->end(why); }

}  // namespace kvfleet
