#include "engine/pd/ucx/transport.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>

#include "engine/pd/pull_reader.h"

namespace kvfleet::pd {
using boost::asio::awaitable;

namespace {

constexpr char kHelloBytes[8] = {'K', 'V', 'F', 'U', 'C', 'X', '1', '\n'};
constexpr char kReadyBytes[8] = {'K', 'V', 'F', 'R', 'E', 'A', 'D', 'Y'};
constexpr char kPongBytes[8] = {'K', 'V', 'F', 'P', 'O', 'N', 'G', '\n'};
constexpr std::size_t kRequestHeaderBytes = 4 + 4 + 8 + 4 + 4;

template <typename T>
void put(char*& at, T v) {
  std::memcpy(at, &v, sizeof v);  // little-endian hosts only, as wire.cpp
  at += sizeof v;
}

template <typename T>
T get(const char*& at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  at += sizeof v;
  return v;
}

UcxClock::time_point after(std::chrono::milliseconds d) { return UcxClock::now() + d; }

}  // namespace

awaitable<bool> UcxPullSink::write(std::string_view piece) {
  const std::string_view one[] = {piece};
  const bool ok = co_await write_pieces(one);  // (named: GCC 12)
  co_return ok;
}

awaitable<bool> UcxPullSink::write_pieces(std::span<const std::string_view> pieces) {
  std::uint64_t n = 0;
  for (const std::string_view p : pieces) n += p.size();
  if (n == 0) co_return true;  // a zero length would end the pull
  std::vector<std::string_view> all;
  all.reserve(pieces.size() + 1);
  all.emplace_back(reinterpret_cast<const char*>(&n), sizeof n);
  all.insert(all.end(), pieces.begin(), pieces.end());
  bool ok = true;
  try {
    co_await ep_.send_gather(all, after(io_timeout_));
  } catch (const std::exception&) {
    ok = false;
  }
  co_return ok;
}

awaitable<bool> UcxPullSink::finish() {
  const std::uint64_t zero = 0;
  bool ok = true;
  try {
    co_await ep_.send(std::string_view(reinterpret_cast<const char*>(&zero), sizeof zero), after(io_timeout_));
  } catch (const std::exception&) {
    ok = false;
  }
  co_return ok;
}

UcxPullSource::UcxPullSource(UcxEndpoint& ep, std::chrono::milliseconds io_timeout, std::shared_ptr<ReceivedPull> target)
    : ep_(ep), io_timeout_(io_timeout), target_(std::move(target)) {}

UcxPullSource::~UcxPullSource() {
  if (!ahead_) return;
  UcxEndpoint::detach(*ahead_);
  if (!progress_.done) ep_.close();  // mid-answer: this also ends the receive ahead (and frees target_ after it)
}

awaitable<std::size_t> UcxPullSource::read_ahead(std::span<char> into) {
  for (;;) {
    if (progress_.received > delivered_) {
      const std::size_t n = std::min(progress_.received - delivered_, into.size());
      if (into.data() != base_ + delivered_) std::memmove(into.data(), base_ + delivered_, n);  // (only off the reader's buffer)
      delivered_ += n;
      co_return n;
    }
    if (progress_.done) {
      ended_ = true;
      co_return 0;
    }
    if (!progress_.reason.empty()) throw PdFailure(progress_.reason, progress_.why);
    progress_ = co_await ep_.wait_pieces(ahead_, delivered_, after(io_timeout_));
  }
}

awaitable<std::size_t> UcxPullSource::read_some_into(std::span<char> into) {
  if (ended_ || into.empty()) co_return 0;
  if (!ahead_ && target_ && left_ == 0 && into.data() == target_->bytes.get()) {
    base_ = target_->bytes.get();
    ahead_ = co_await ep_.receive_pieces(target_->bytes.get(), target_->capacity, target_);
  }
  if (ahead_) {
    const std::size_t n = co_await read_ahead(into);  // (named: GCC 12)
    co_return n;
  }
  if (left_ == 0) {
    std::uint64_t n = 0;
    co_await ep_.recv(reinterpret_cast<char*>(&n), sizeof n, after(io_timeout_));
    if (n == 0) {
      ended_ = true;
      co_return 0;
    }
    if (n > kUcxMaxPiece) throw PdFailure("malformed", "UCX piece of " + std::to_string(n) + " bytes");
    left_ = n;
  }
  const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(left_, into.size()));
  co_await ep_.recv(into.data(), take, after(io_timeout_));
  left_ -= take;
  co_return take;
}

awaitable<void> send_pull_request(UcxEndpoint& ep, const UcxPullRequest& req, UcxClock::time_point deadline) {
  if (req.key.size() > kUcxMaxKeyBytes) throw PdFailure("error", "internal key too long for the UCX pull request");
  std::string bytes(kRequestHeaderBytes + req.key.size(), '\0');
  char* at = bytes.data();
  std::memcpy(at, "KVFP", 4);
  at += 4;
  put(at, static_cast<std::uint32_t>(req.key.size()));
  put(at, req.transfer);
  put(at, req.from);
  put(at, req.count);
  std::memcpy(at, req.key.data(), req.key.size());
  co_await ep.send(bytes, deadline);
}

UcxPullServer::UcxPullServer(std::shared_ptr<UcxWorker> worker, const std::string& host, std::uint16_t port,
                             std::chrono::milliseconds io_timeout, Handler handler)
    : worker_(std::move(worker)), io_timeout_(io_timeout), handler_(std::move(handler)) {
  thread_ = std::thread([this] { io_.run(); });
  try {
    port_ = worker_->listen(host, port, [this](std::shared_ptr<UcxEndpoint> ep) {  // on the worker thread
      if (stopping_) return;  // the endpoint closes as it goes out of scope
      {
        std::lock_guard lock(mu_);
        conns_.push_back(ep);
      }
      ++active_;
      boost::asio::co_spawn(io_, serve(std::move(ep)), boost::asio::detached);
    });
  } catch (...) {
    work_.reset();
    io_.stop();
    thread_.join();
    throw;
  }
}

UcxPullServer::~UcxPullServer() {
  stopping_ = true;
  {
    std::lock_guard lock(mu_);
    for (auto& w : conns_)
      if (auto ep = w.lock()) ep->close();  // their handlers fail out of every wait
  }
  for (int i = 0; i < 200 && active_ > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  work_.reset();
  io_.stop();
  thread_.join();
}

awaitable<void> UcxPullServer::serve(std::shared_ptr<UcxEndpoint> ep) {
  const auto forever = UcxClock::time_point::max();  // an idle pooled endpoint waits for D's next pull
  try {
    char hello[8];
    co_await ep->recv(hello, sizeof hello, after(io_timeout_));
    if (std::memcmp(hello, kHelloBytes, sizeof hello) != 0) throw PdFailure("malformed", "not a kvfleet UCX peer");
    co_await ep->send(std::string_view(kReadyBytes, sizeof kReadyBytes), after(io_timeout_));
    while (!stopping_) {
      char head[kRequestHeaderBytes];
      co_await ep->recv(head, sizeof head, forever);
      const char* at = head;
      if (std::memcmp(at, "KVFI", 4) == 0) {  // D checks that a pooled endpoint still works
        co_await ep->send(std::string_view(kPongBytes, sizeof kPongBytes), after(io_timeout_));
        continue;
      }
      if (std::memcmp(at, "KVFP", 4) != 0) throw PdFailure("malformed", "bad UCX pull request");
      at += 4;
      UcxPullRequest req;
      const auto key_bytes = get<std::uint32_t>(at);
      req.transfer = get<std::uint64_t>(at);
      req.from = get<std::uint32_t>(at);
      req.count = get<std::uint32_t>(at);
      if (key_bytes > kUcxMaxKeyBytes) throw PdFailure("malformed", "UCX pull request key too long");
      req.key.resize(key_bytes);
      if (key_bytes > 0) co_await ep->recv(req.key.data(), key_bytes, after(io_timeout_));
      UcxPullSink sink(*ep, io_timeout_);
      co_await handler_(req, sink);
      if (ep->broken()) break;
    }
  } catch (const std::exception&) {  // D closed, failed or spoke nonsense: drop the connection
  }
  ep->close();
  --active_;
}

awaitable<bool> UcxPullClient::alive(UcxEndpoint& ep, UcxClock::time_point deadline) {
  char ping[kRequestHeaderBytes] = {'K', 'V', 'F', 'I'};
  char pong[sizeof kPongBytes];
  bool ok = true;
  try {
    co_await ep.send(std::string_view(ping, sizeof ping), deadline);
    co_await ep.recv(pong, sizeof pong, deadline);
    ok = std::memcmp(pong, kPongBytes, sizeof pong) == 0;
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok) ep.close();
  co_return ok;
}

awaitable<std::shared_ptr<UcxEndpoint>> UcxPullClient::acquire(const std::string& host, std::uint16_t port,
                                                               UcxClock::time_point deadline) {
  const std::string peer = host + ":" + std::to_string(port);
  // An idle pooled endpoint, checked by a round trip first: one whose P died or dropped it while it sat in
  // the pool (UCX need not have noticed yet) is closed, and the pull gets a fresh connection instead of
  // failing into a local prefill.
  for (;;) {
    std::shared_ptr<UcxEndpoint> ep;
    {
      std::lock_guard lock(mu_);
      auto& idle = idle_[peer];
      while (!ep && !idle.empty()) {
        ep = std::move(idle.back());
        idle.pop_back();
        if (ep->broken()) ep.reset();
      }
    }
    if (!ep) break;
    const bool ok = co_await alive(*ep, deadline);  // (named: GCC 12)
    if (ok) co_return ep;
    ++replaced_;
  }
  std::shared_ptr<UcxEndpoint> ep = worker_->connect(host, port);
  if (!ep) throw PdFailure("connect", "UCX is not available");
  std::string failed;
  try {
    co_await ep->send(std::string_view(kHelloBytes, sizeof kHelloBytes), deadline);
    char ready[8];
    co_await ep->recv(ready, sizeof ready, deadline);
    if (std::memcmp(ready, kReadyBytes, sizeof ready) != 0) failed = "the peer is not a kvfleet UCX listener";
  } catch (const std::exception& e) {
    failed = e.what();
  }
  if (!failed.empty()) {
    ep->close();
    throw PdFailure("connect", "UCX connect to " + peer + ": " + failed);
  }
  co_return ep;
}

void UcxPullClient::give_back(const std::string& host, std::uint16_t port, std::shared_ptr<UcxEndpoint> ep) {
  if (!ep || ep->broken()) return;
  std::lock_guard lock(mu_);
  auto& idle = idle_[host + ":" + std::to_string(port)];
  if (idle.size() < kIdlePerPeer) idle.push_back(std::move(ep));
}

}  // namespace kvfleet::pd
