// A proxy in front of a real prefill replica, run by the test process, that misbehaves on cue in the
// block stream (what a real P cannot be made to do at a chosen byte): flip a byte, stall, die mid-frame,
// or hold a pull back until P's lease has run out. The handshake and releases pass through untouched.
// With `ucx` (P speaks ucx), the proxy also listens for UCX pulls and rewrites the accept's UCX port to
// its own, so the same faults hit the ucx transport; `ucx_port_override` sends D to another port instead
// (a dead one: D's UCX connect is refused).
#pragma once

#include <doctest/doctest.h>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "engine/pd/ucx/transport.h"
#include "engine/pd/wire.h"
#include "kvfleet/http/client.h"
#include "kvfleet/http/server.h"

namespace kvfleet::test {

enum class Fault { none, corrupt, stall, die, delay_pull };

class FaultyPrefillProxy {
 public:
  std::atomic<Fault> fault{Fault::none};
  std::chrono::milliseconds pause{3000};  // stall: how long after the first piece; delay_pull: before the pull

  std::atomic<std::uint16_t> ucx_port_override{0};

  explicit FaultyPrefillProxy(std::uint16_t upstream_port, bool ucx = false) : upstream_(upstream_port) {
    if (ucx) start_ucx();
    http::HttpRouter r;
    r.post("/internal/prefill", [this](const http::Request& q, http::ResponseWriter& w) { return pass(q, w); });
    r.post("/internal/prefill/release", [this](const http::Request& q, http::ResponseWriter& w) { return pass(q, w); });
    r.get("/internal/prefill/blocks", [this](const http::Request& q, http::ResponseWriter& w) { return pull(q, w); });
    http::HttpServerConfig c;
    c.port = 0;
    c.io_threads = 1;
    server_ = std::make_unique<http::HttpServer>(c, std::move(r));
    server_->start();
  }
  ~FaultyPrefillProxy() {
    server_->stop(std::chrono::milliseconds(0));
    ucx_server_.reset();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  int pulls() const { return pulls_; }

 private:
  boost::asio::awaitable<void> sleep(std::chrono::milliseconds d) {
    boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
    t.expires_after(d);
    co_await t.async_wait(boost::asio::use_awaitable);
  }

  boost::asio::awaitable<void> pass(const http::Request& q, http::ResponseWriter& w) {
    http::HttpClient c(co_await boost::asio::this_coro::executor);
    co_await c.connect("127.0.0.1", upstream_);
    http::Response r = co_await c.request(q);
    if (r.status == 200 && q.target == "/internal/prefill") r.body = rewrite_accept(r.body);
    r.headers.erase("Content-Length");
    r.headers.erase("Connection");
    co_await w.send(std::move(r));
  }

  boost::asio::awaitable<void> pull(const http::Request& q, http::ResponseWriter& w) {
    ++pulls_;
    const Fault f = fault;
    if (f == Fault::delay_pull) co_await sleep(pause);
    http::HttpClient c(co_await boost::asio::this_coro::executor);
    co_await c.connect("127.0.0.1", upstream_);
    co_await c.send(q);
    const http::ResponseHead head = co_await c.read_head();
    if (head.status != 200) {
      http::Response r;
      r.status = head.status;
      r.headers.set("Content-Type", "application/json");
      r.body = co_await c.read_body();
      co_await w.send(std::move(r));
      co_return;
    }
    http::Headers h{{"Content-Type", "application/octet-stream"}};
    co_await w.begin_stream(200, std::move(h));
    std::string all;
    while (auto piece = co_await c.read_some()) all += *piece;  // the whole pull from P, then the fault
    if (f == Fault::corrupt) all[all.size() / 2] = static_cast<char>(all[all.size() / 2] ^ 0x01);
    if (f == Fault::die) {
      co_await w.write(std::string_view(all).substr(0, all.size() / 2));
      throw std::runtime_error("the stand-in dies mid-frame");  // the server drops the connection
    }
    if (f == Fault::stall) {
      co_await w.write(std::string_view(all).substr(0, 100));
      co_await sleep(pause);
      co_await w.write(std::string_view(all).substr(100));
    } else {
      co_await w.write(all);
    }
    co_await w.finish();
  }

  // ucx: the accept names this proxy's UCP listener (or the override) instead of P's, whose port is kept.
  std::string rewrite_accept(const std::string& body) {
    pd::Frame f = pd::decode_one(body);
    auto* a = std::get_if<pd::Accept>(&f);
    if (!a || a->transport != "ucx") return body;
    upstream_ucx_ = a->transport_port;
    a->transport_port = ucx_port_override ? ucx_port_override.load() : (ucx_server_ ? ucx_server_->port() : a->transport_port);
    return pd::encode(f);
  }

  void start_ucx() {
    std::string why;
    auto worker = pd::UcxWorker::create(why);
    REQUIRE_MESSAGE(worker, why);
    ucx_client_ = std::make_unique<pd::UcxPullClient>(worker);
    auto handler = [this](const pd::UcxPullRequest& req, pd::PullSink& sink) { return ucx_pull(req, sink); };
    ucx_server_ = std::make_unique<pd::UcxPullServer>(worker, "127.0.0.1", 0, std::chrono::milliseconds(10000), handler);
  }

  // The UCX twin of pull(): the whole answer from P over UCX, then the fault. Throwing drops D's endpoint.
  boost::asio::awaitable<void> ucx_pull(pd::UcxPullRequest req, pd::PullSink& sink) {
    ++pulls_;
    const Fault f = fault;
    if (f == Fault::delay_pull) co_await sleep(pause);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto ep = co_await ucx_client_->acquire("127.0.0.1", upstream_ucx_, deadline);
    co_await pd::send_pull_request(*ep, req, deadline);
    pd::UcxPullSource source(*ep, std::chrono::milliseconds(10000));
    std::string all;
    char piece[1 << 16];
    for (;;) {
      const std::size_t n = co_await source.read_some_into(piece);
      if (n == 0) break;
      all.append(piece, n);
    }
    ucx_client_->give_back("127.0.0.1", upstream_ucx_, std::move(ep));
    if (f == Fault::corrupt) all[all.size() / 2] = static_cast<char>(all[all.size() / 2] ^ 0x01);
    if (f == Fault::die) {
      co_await sink.write(std::string_view(all).substr(0, all.size() / 2));
      throw std::runtime_error("the stand-in dies mid-frame");  // the server closes D's endpoint
    }
    if (f == Fault::stall) {
      co_await sink.write(std::string_view(all).substr(0, 100));
      co_await sleep(pause);
      co_await sink.write(std::string_view(all).substr(100));
    } else {
      co_await sink.write(all);
    }
    co_await sink.finish();
  }

  std::uint16_t upstream_;
  std::atomic<std::uint16_t> upstream_ucx_{0};
  std::unique_ptr<pd::UcxPullClient> ucx_client_;
  std::unique_ptr<pd::UcxPullServer> ucx_server_;
  std::unique_ptr<http::HttpServer> server_;
  std::atomic<int> pulls_{0};
};

}  // namespace kvfleet::test
