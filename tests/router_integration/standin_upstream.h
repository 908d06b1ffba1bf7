// A scripted stand-in replica on a loopback port, run by the test process itself, for what real
// replicas cannot be made to do on cue: answer 503/429/500, or drop a kept-alive connection just as
// a request arrives. It counts the connections that carried completions, which shows whether the
// router reused them. GET /health always answers 200 (the router's active checks), and so does GET
// /v1/models (with max_model_len 2048: the router reads it once). Neither counts as a completion. GET /v1/kv_events
// answers a scripted SSE stream (kv_script), then sends heartbeats (or nothing, kv_heartbeat_ms = 0) until the
// router closes it (or closes at once with kv_close), recording each since= asked for.
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>
#include <tuple>
#include <thread>

namespace kvfleet::test {

class StandinUpstream {
 public:
  // Status of every completion answer (200, 503, 429, 500, ...); may change while running.
  std::atomic<int> status{200};
  // True: the second and later requests on a connection are read and then the connection is closed
  // unanswered, like a replica whose keep-alive timeout hit just as the request came.
  std::atomic<bool> drop_reused{false};
  // Above 0: completions answer 200 with a chunked SSE stream of this many events, one every
  // event_gap (a replica generating tokens).
  std::atomic<int> stream_events{0};
  std::chrono::milliseconds event_gap{1};
  // Above 0: completions first wait this long without answering (a replica hung before the first byte).
  std::atomic<int> hang_ms{0};
  // Above 0: a streamed completion closes the connection after this many events (died mid-stream).
  std::atomic<int> die_after_events{0};
  // True: a streamed completion sends malformed chunk framing after its first event.
  std::atomic<bool> malformed_stream{false};
  std::atomic<bool> kv_close{false};
  // After the script, `: ping` every this many ms, as a real replica's idle stream sends (Contract 2), so
  // that the router keeps it; 0: silent (the router times the stream out and reconnects).
  std::atomic<int> kv_heartbeat_ms{1000};
  // Bytes of padding in each streamed event (a big stream that backs up behind a slow client).
  std::atomic<int> event_padding{0};
  // Completions being answered now, and the most at once.
  std::atomic<int> in_flight{0}, max_in_flight{0};
  // Above 0: completions are held (before hang_ms) until this many are in flight at once, then all go on
  // together; or, when fewer ever arrive, after crowd_wait. A barrier, not a pause: it proves that the
  // router held them all at once however slowly the machine let them arrive. Set before the requests.
  std::atomic<int> crowd{0};
  std::chrono::milliseconds crowd_wait{60'000};

  void set_kv_script(std::string script) {
    std::lock_guard lock(mutex_);
    kv_script_ = std::move(script);
  }
  std::vector<std::string> kv_targets() const {
    std::lock_guard lock(mutex_);
    return kv_targets_;
  }
  std::string last_authorization() const {  // of the last completion ("<none>" without the header)
    std::lock_guard lock(mutex_);
    return last_authorization_;
  }
  // The bodies of the completions, in the order they arrived.
  std::vector<std::string> completion_bodies() const {
    std::lock_guard lock(mutex_);
    return completion_bodies_;
  }
  std::string kv_authorization() const {
    std::lock_guard lock(mutex_);
    return kv_authorization_;
  }

  // On another loopback address and a given port (discovery tests: several 127.0.0.x, one port).
  explicit StandinUpstream(const std::string& host = "127.0.0.1", std::uint16_t port = 0)
      : acceptor_(io_, {boost::asio::ip::make_address(host), port}), host_(host) {
    boost::asio::co_spawn(io_, accept_loop(), boost::asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~StandinUpstream() {
    io_.stop();
    thread_.join();
  }
  StandinUpstream(const StandinUpstream&) = delete;
  StandinUpstream& operator=(const StandinUpstream&) = delete;

  std::string url() const { return "http://" + host_ + ":" + std::to_string(port()); }
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  int completion_connections() const { return completion_connections_; }
  int completion_requests() const { return completion_requests_; }

 private:
  using Stream = boost::beast::tcp_stream;

  boost::asio::awaitable<void> accept_loop() {
    for (;;) {
      // No structured bindings of co_await results (GCC 12, see kvfleet/http/client.h).
      auto accepted = co_await acceptor_.async_accept(boost::asio::as_tuple(boost::asio::use_awaitable));
      if (std::get<0>(accepted)) co_return;
      boost::asio::co_spawn(io_, serve(Stream(std::move(std::get<1>(accepted)))), boost::asio::detached);
    }
  }

  boost::asio::awaitable<void> serve(Stream stream) {
    namespace http = boost::beast::http;
    constexpr auto tuple = boost::asio::as_tuple(boost::asio::use_awaitable);
    boost::beast::flat_buffer buffer;
    int served_here = 0;
    bool counted = false;
    for (;;) {
      http::request<http::string_body> request;
      auto read = co_await http::async_read(stream, buffer, request, tuple);
      if (std::get<0>(read)) co_return;
      if (request.target().starts_with("/v1/kv_events")) {
        co_await serve_kv_events(stream, request);
        co_return;
      }
      const bool models = request.target() == "/v1/models";
      const bool completion = request.target() != "/health" && !models;
      if (completion) {
        {
          std::lock_guard lock(mutex_);
          const auto auth = request.find(http::field::authorization);
          last_authorization_ = auth == request.end() ? "<none>" : std::string(auth->value());
          completion_bodies_.push_back(request.body());
        }
        const int now = ++in_flight;
        for (int seen = max_in_flight; now > seen && !max_in_flight.compare_exchange_weak(seen, now);) {
        }
        struct Leave {
          std::atomic<int>& n;
          ~Leave() { --n; }
        } leave{in_flight};
        if (crowd > 0) co_await join_crowd(now);
        if (hang_ms > 0) {
          boost::asio::steady_timer timer(stream.get_executor());
          timer.expires_after(std::chrono::milliseconds(hang_ms.load()));
          co_await timer.async_wait(tuple);
        }
        ++completion_requests_;
        if (!counted) ++completion_connections_;
        counted = true;
        if (drop_reused && served_here > 0) co_return;  // closes unanswered
      }
      ++served_here;
      if (completion && stream_events > 0) {
        if (!co_await send_stream(stream)) co_return;
        continue;
      }
      http::response<http::string_body> response{http::status(completion ? status.load() : 200), 11};
      response.set(http::field::content_type, "application/json");
      if (completion && response.result_int() == 503) response.set(http::field::retry_after, "1");
      response.body() = completion && response.result_int() != 200 ? R"({"error":{"message":"standin"}})"
                        : models ? R"({"object":"list","data":[{"id":"standin","max_model_len":2048}]})"
                                 : R"({"ok":true})";
      response.keep_alive(request.keep_alive());
      response.prepare_payload();
      auto written = co_await http::async_write(stream, response, tuple);
      if (std::get<0>(written) || !request.keep_alive()) co_return;
    }
  }

  // On the io thread only (as every coroutine here): crowd_timer_'s waiters are the held completions; the
  // one that makes the crowd complete, or the deadline, releases them all.
  boost::asio::awaitable<void> join_crowd(int now) {
    if (crowd_open_) co_return;
    if (now >= crowd) {
      crowd_open_ = true;
      crowd_timer_.cancel();
      co_return;
    }
    if (!crowd_armed_) {
      crowd_armed_ = true;
      crowd_timer_.expires_after(crowd_wait);
    }
    co_await crowd_timer_.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    crowd_open_ = true;
  }

  // Chunked SSE, written as raw bytes; false when the router closed the connection.
  boost::asio::awaitable<bool> send_stream(Stream& stream) {
    constexpr auto tuple = boost::asio::as_tuple(boost::asio::use_awaitable);
    std::string out =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    boost::asio::steady_timer timer(stream.get_executor());
    const int events = stream_events;
    for (int i = 0; i <= events; ++i) {
      const std::string pad(static_cast<std::size_t>(event_padding.load()), 'p');
      const std::string event = i < events ? "data: {\"choices\":[{\"text\":\"t" + std::to_string(i) + pad + "\"}]}\n\n"
                                           : "data: [DONE]\n\n";
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", event.size());
      out += size + event + "\r\n";
      if (i == events) out += "0\r\n\r\n";
      if (die_after_events > 0 && i == die_after_events) co_return false;  // closes mid-stream
      if (malformed_stream && i == 1) out = "zz-not-a-chunk-size\r\n";
      auto written = co_await boost::asio::async_write(stream.socket(), boost::asio::buffer(out), tuple);
      if (std::get<0>(written)) co_return false;
      if (malformed_stream && i == 1) co_return false;
      out.clear();
      timer.expires_after(event_gap);
      co_await timer.async_wait(tuple);
    }
    co_return true;
  }

  template <typename Request>
  boost::asio::awaitable<void> serve_kv_events(Stream& stream, const Request& request) {
    namespace http = boost::beast::http;
    constexpr auto tuple = boost::asio::as_tuple(boost::asio::use_awaitable);
    std::string script;
    {
      std::lock_guard lock(mutex_);
      kv_targets_.emplace_back(request.target());
      const auto auth = request.find(http::field::authorization);
      kv_authorization_ = auth == request.end() ? "<none>" : std::string(auth->value());
      script = kv_script_;
    }
    std::string out = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    if (!script.empty()) {
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", script.size());
      out += size + script + "\r\n";
    }
    auto written = co_await boost::asio::async_write(stream.socket(), boost::asio::buffer(out), tuple);
    if (std::get<0>(written) || kv_close) co_return;
    if (kv_heartbeat_ms > 0) {  // until a write fails: the router closed the stream
      boost::asio::steady_timer timer(stream.get_executor());
      static const std::string ping = "8\r\n: ping\n\n\r\n";  // one chunk
      for (;;) {
        timer.expires_after(std::chrono::milliseconds(kv_heartbeat_ms.load()));
        co_await timer.async_wait(tuple);
        auto sent = co_await boost::asio::async_write(stream.socket(), boost::asio::buffer(ping), tuple);
        if (std::get<0>(sent)) co_return;
      }
    }
    char sink[256];  // silent from here on: wait for the router to close
    for (;;) {
      auto read = co_await stream.socket().async_read_some(boost::asio::buffer(sink), tuple);
      if (std::get<0>(read)) co_return;
    }
  }

  mutable std::mutex mutex_;
  std::string kv_script_;
  std::vector<std::string> kv_targets_;
  std::vector<std::string> completion_bodies_;
  std::string last_authorization_, kv_authorization_;
  boost::asio::io_context io_;
  boost::asio::steady_timer crowd_timer_{io_};
  bool crowd_armed_ = false, crowd_open_ = false;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::string host_;
  std::thread thread_;
  std::atomic<int> completion_connections_{0};
  std::atomic<int> completion_requests_{0};
};

}  // namespace kvfleet::test
