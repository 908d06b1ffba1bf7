// Streaming: SSE relayed piece by piece, client disconnects, many streams at once, graceful stop,
// and AsyncQueue carrying items from a non-io thread into a handler.
#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <boost/asio/steady_timer.hpp>
#include <thread>

#include "http_test_util.h"
#include "kvfleet/http/async_queue.h"
#include "kvfleet/http/client.h"
#include "kvfleet/http/sse.h"

using namespace kvfleet::http;
using namespace kvfleet::http::test;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

const Headers kSseHeaders{{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}};

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor, d);
  co_await timer.async_wait(asio::use_awaitable);
}

// GET /events?n=N&gap_ms=G: N events "i", G ms apart; counts what it wrote and how it ended.
struct StreamStats {
  std::atomic<int> written{0};
  std::atomic<int> finished{0};
  std::atomic<int> saw_disconnect{0};
};

HttpRouter stream_router(StreamStats& stats) {
  HttpRouter router;
  router.get("/events", [&stats](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
    int n = std::stoi(request.query_param("n").value_or("100"));
    int gap = std::stoi(request.query_param("gap_ms").value_or("0"));
    co_await writer.begin_stream(200, kSseHeaders);
    for (int i = 0; i < n; ++i) {
      if (gap > 0) co_await sleep_for(std::chrono::milliseconds{gap});
      if (!co_await writer.write(sse_format(std::to_string(i)))) break;
      ++stats.written;
    }
    if (writer.client_gone()) ++stats.saw_disconnect;
    co_await writer.finish();
    ++stats.finished;
  });
  return router;
}

// Reads a whole SSE response piece by piece; returns the event data in order.
asio::awaitable<std::vector<std::string>> read_events(uint16_t port, std::string target,
                                                      size_t* pieces = nullptr) {
  auto executor = co_await asio::this_coro::executor;
    HttpClient client(executor);
  co_await client.connect("127.0.0.1", port);
  Request request{"GET", std::move(target), {}, {}};  // named: see test_server.cpp
  co_await client.send(request);
  ResponseHead head = co_await client.read_head();
  CHECK(head.status == 200);
  CHECK(head.chunked);
  SseParser parser;
  std::vector<std::string> events;
  while (std::optional<std::string> piece = co_await client.read_some()) {
    if (pieces) ++*pieces;
    for (SseEvent& e : parser.feed(*piece)) events.push_back(std::move(e.data));
  }
  co_return events;
}

std::vector<std::string> numbers(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(std::to_string(i));
  return out;
}

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace

TEST_CASE("an SSE stream of 100 events arrives piece by piece") {
  StreamStats stats;
  TestServer t(stream_router(stats));
  size_t pieces = 0;
  auto events = run_sync(read_events(t.port(), "/events?n=100&gap_ms=1", &pieces));
  CHECK(events == numbers(100));
  CHECK(pieces >= 50);  // a piece per event or close to it: nothing waited for the whole body
  CHECK(stats.written == 100);

  // The raw bytes, re-fed to the parser in 3-byte pieces, give the same events.
  Response whole = http_request("127.0.0.1", t.port(), "GET", "/events?n=100");
  CHECK(*whole.headers.find("content-type") == "text/event-stream");
  SseParser parser;
  std::vector<std::string> again;
  for (size_t at = 0; at < whole.body.size(); at += 3) {
    for (SseEvent& e : parser.feed(std::string_view(whole.body).substr(at, 3))) again.push_back(e.data);
  }
  CHECK(again == numbers(100));
}

TEST_CASE("a client that disconnects mid-stream stops the handler") {
  StreamStats stats;
  TestServer t(stream_router(stats));
  auto read_five_and_leave = [&]() -> asio::awaitable<int> {
    auto executor = co_await asio::this_coro::executor;
    HttpClient client(executor);
    co_await client.connect("127.0.0.1", t.port());
    Request request{"GET", "/events?n=1000&gap_ms=5", {}, {}};
    co_await client.send(request);
    co_await client.read_head();
    SseParser parser;
    int seen = 0;
    while (seen < 5) {
      auto piece = co_await client.read_some();
      REQUIRE(piece);
      seen += static_cast<int>(parser.feed(*piece).size());
    }
    client.close();
    co_return seen;
  };
  int seen = run_sync(read_five_and_leave());
  CHECK(seen >= 5);
  REQUIRE(wait_until([&] { return stats.finished == 1; }, 3000ms));
  CHECK(stats.saw_disconnect == 1);
  CHECK(stats.written >= seen);
  CHECK(stats.written < seen + 10);  // stopped within a couple of 5 ms ticks, not 1000 events
  CHECK(wait_until([&] { return t.server.connection_count() == 0; }, 2000ms));
}

TEST_CASE("64 concurrent streaming clients each get their whole stream") {
  StreamStats stats;
  TestServer t(stream_router(stats));
  asio::io_context ioc;
  std::vector<std::vector<std::string>> results(64);
  std::atomic<int> failures{0};
  for (size_t i = 0; i < results.size(); ++i) {
    asio::co_spawn(ioc, read_events(t.port(), "/events?n=20&gap_ms=2"),
                   [&, i](std::exception_ptr e, std::vector<std::string> events) {
                     if (e) ++failures;
                     results[i] = std::move(events);
                   });
  }
  ioc.run();
  CHECK(failures == 0);
  for (const auto& events : results) CHECK(events == numbers(20));
  CHECK(stats.written == 64 * 20);
}

TEST_CASE("graceful stop lets a running stream complete, then refuses new connections") {
  StreamStats stats;
  auto t = std::make_unique<TestServer>(stream_router(stats));
  uint16_t port = t->port();
  std::vector<std::string> events;
  std::thread reader([&] { events = run_sync(read_events(port, "/events?n=20&gap_ms=20")); });
  REQUIRE(wait_until([&] { return stats.written >= 2; }, 3000ms));
  auto start = std::chrono::steady_clock::now();
  CHECK(t->server.stop(5000ms));
  auto took = std::chrono::steady_clock::now() - start;
  reader.join();
  CHECK(events == numbers(20));
  CHECK(stats.finished == 1);
  CHECK(took >= 200ms);  // it waited for the stream (18 more events, 20 ms apart)
  CHECK_THROWS(http_request("127.0.0.1", port, "GET", "/events?n=1", {}, {}, 500ms));
}

TEST_CASE("stop closes idle keep-alive connections at once") {
  StreamStats stats;
  TestServer t(stream_router(stats));
  RawSocket idle(t.port());
  REQUIRE(wait_until([&] { return t.server.connection_count() == 1; }, 2000ms));
  auto start = std::chrono::steady_clock::now();
  CHECK(t.server.stop(3000ms));
  CHECK(std::chrono::steady_clock::now() - start < 1000ms);
  CHECK(idle.poll_input(1000ms) == 0);
}

TEST_CASE("AsyncQueue carries items from another thread in order, then reports the end") {
  asio::io_context ioc;
  AsyncQueue<int> queue(ioc.get_executor());
  constexpr int kItems = 20000;
  std::atomic<int> refused{0};
  std::thread producer([&] {
    for (int i = 0; i < kItems; ++i) {
      if (!queue.push(i)) ++refused;
      if (i % 1000 == 0) std::this_thread::sleep_for(1ms);  // make the consumer wait sometimes
    }
    queue.close();
  });
  auto consume = [&]() -> asio::awaitable<std::pair<int, bool>> {
    int expected = 0;
    bool in_order = true;
    while (std::optional<int> item = co_await queue.pop()) {
      in_order = in_order && *item == expected;
      ++expected;
    }
    co_return std::pair{expected, in_order};
  };
  auto future = asio::co_spawn(ioc, consume(), asio::use_future);
  ioc.run();
  producer.join();
  auto [count, in_order] = future.get();
  CHECK(refused == 0);
  CHECK(count == kItems);
  CHECK(in_order);
  CHECK_FALSE(queue.push(1));  // closed
  CHECK(queue.size() == 0);
}

TEST_CASE("a handler streams what an engine thread pushes, and a disconnect closes its queue") {
  std::atomic<int> queues_closed_by_disconnect{0};
  std::atomic<int> handler_done{0};
  std::mutex producers_mutex;
  std::vector<std::thread> producers;
  HttpRouter router;
  router.get("/tokens", [&](const Request& request, ResponseWriter& writer) -> asio::awaitable<void> {
    auto executor = co_await asio::this_coro::executor;
    auto queue = std::make_shared<AsyncQueue<std::string>>(executor);
    int n = std::stoi(request.query_param("n").value_or("0"));
    writer.on_disconnect([queue, n, &queues_closed_by_disconnect] {
      // The n > 0 client may also leave before this handler returns; count only the silent one.
      if (n == 0) ++queues_closed_by_disconnect;
      queue->close();
    });
    // Stands in for the engine thread; n == 0 means "never produce" (a long prefill, say).
    // Joined before the server goes: a queue must not outlive the io_context (async_queue.h).
    {  // not held across a co_await: the coroutine may resume on another io thread (ThreadSanitizer)
      std::lock_guard lock(producers_mutex);
      producers.emplace_back([queue, n] {
        for (int i = 0; i < n; ++i) queue->push(std::to_string(i));
        if (n > 0) queue->close();
      });
    }
    co_await writer.begin_stream(200, kSseHeaders);
    while (std::optional<std::string> token = co_await queue->pop()) {
      if (!co_await writer.write(sse_format(*token))) break;
    }
    co_await writer.finish();
    ++handler_done;
  });
  TestServer t(std::move(router));
  struct JoinFirst {  // destroyed before `t`, even when a check throws
    std::vector<std::thread>& threads;
    ~JoinFirst() {
      for (std::thread& p : threads) {
        if (p.joinable()) p.join();
      }
    }
  } join_first{producers};
  CHECK(run_sync(read_events(t.port(), "/tokens?n=50")) == numbers(50));
  CHECK(wait_until([&] { return handler_done == 1; }, 2000ms));  // it may still be leaving

  auto connect_and_leave = [&]() -> asio::awaitable<void> {
    auto executor = co_await asio::this_coro::executor;
    HttpClient client(executor);
    co_await client.connect("127.0.0.1", t.port());
    Request request{"GET", "/tokens?n=0", {}, {}};
    co_await client.send(request);
    ResponseHead head = co_await client.read_head();
    CHECK(head.status == 200);
    client.close();
  };
  run_sync(connect_and_leave());
  CHECK(wait_until([&] { return handler_done == 2; }, 3000ms));
  CHECK(queues_closed_by_disconnect == 1);
}
