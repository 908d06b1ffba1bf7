// The ucx KV transport (engine/pd/ucx/): UCP endpoints in process (the READY exchange, a large piece
// byte for byte, a refused connect, a deadline), the negotiation between real replica processes (each
// side with or without ucx), and a refused UCX connect ending in a tcp pull with the right answer. The
// fault and identical-output cases of test_pd_processes.cpp run over ucx as ctest's pd_ucx.
#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <thread>

#include "engine/pd/pull_reader.h"
#include "engine/pd/transport.h"
#include "engine/pd/ucx/transport.h"
#include "pd/faulty_prefill_proxy.h"
#include "pd/pd_test_util.h"
#include "server/replica_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;
using Clock = std::chrono::steady_clock;

TEST_CASE("transport names: parsing, the build's list, P's pick in D's order") {
  const std::vector<std::string> both{"ucx", "tcp"};
  CHECK(pd::parse_transports("ucx,tcp", both) == both);
  CHECK(pd::parse_transports("tcp", both) == std::vector<std::string>{"tcp"});
  CHECK_THROWS_WITH_AS(pd::parse_transports("tcp,rdma", both), doctest::Contains("unknown KV transport 'rdma'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pd::parse_transports("tcp,tcp", both), doctest::Contains("given twice"), std::invalid_argument);
  CHECK_THROWS_AS(pd::parse_transports("", both), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pd::parse_transports("ucx", {"tcp"}), doctest::Contains("not in this build"), std::invalid_argument);
  CHECK(pd::pick_transport({"ucx", "tcp"}, {"tcp"}) == "tcp");
  CHECK(pd::pick_transport({"ucx", "tcp"}, {"ucx", "tcp"}) == "ucx");
  CHECK(pd::pick_transport({"tcp", "ucx"}, {"ucx", "tcp"}) == "tcp");
  CHECK(pd::pick_transport({"ucx"}, {"tcp"}).empty());
#if KVFLEET_UCX
  CHECK(pd::built_transports() == both);
#endif
}

TEST_CASE("accept frames carry the UCX port after the hashes; an accept without it decodes as before") {
  pd::Accept a;
  a.layout = {"m", "llama", DType::f32, DType::f32, 2, 2, 16, 16, 7};
  a.transfer_id = 9;
  a.hashes = {1, 2, 3};
  const std::string plain = pd::encode(a);
  a.transport = "ucx", a.transport_port = 40123;
  const auto got = std::get<pd::Accept>(pd::decode_one(pd::encode(a)));
  CHECK(got.transport == "ucx");
  CHECK(got.transport_port == 40123);
  CHECK(got.transport_host.empty());
  CHECK(got.hashes == a.hashes);
  CHECK(std::get<pd::Accept>(pd::decode_one(plain)).transport_port == 0);
}

#if KVFLEET_UCX

namespace {

// Runs a coroutine to its end on a fresh io_context with one thread (the test's own).
template <typename F>
auto run_coro(boost::asio::io_context& io, F f) {
  auto fut = boost::asio::co_spawn(io, f(), boost::asio::use_future);
  io.restart();
  io.run();
  return fut.get();
}

}  // namespace

TEST_CASE("UCX settings: our tcp segment defaults reach UCX's tcp transport (UCX names none it could not apply)") {
  // UCX prints "invalid configuration(s): NAME=VALUE" (to stdout, its log) for a ucp_config_modify name that no
  // transport took: so our defaults went nowhere when they were spelled TCP_TX_SEG_SIZE. Captured here.
  std::fflush(stdout);
  char path[] = "/tmp/kvfleet-ucx-log-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = ::dup(1);
  ::dup2(fd, 1);
  {
    std::string why;
    auto worker = pd::UcxWorker::create(why);
    REQUIRE_MESSAGE(worker, why);
    auto handler = [](const pd::UcxPullRequest&, pd::PullSink& sink) -> boost::asio::awaitable<void> { co_await sink.finish(); };
    pd::UcxPullServer server(worker, "127.0.0.1", 0, std::chrono::milliseconds(5000), handler);
    pd::UcxPullClient client(worker);
    boost::asio::io_context io;
    auto fut = boost::asio::co_spawn(io, client.acquire("127.0.0.1", server.port(), Clock::now() + std::chrono::seconds(5)),
                                     boost::asio::use_future);
    io.run();
    CHECK(fut.get() != nullptr);  // a connected endpoint: the tcp transport's lanes are set up
  }
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  CHECK_MESSAGE(log.find("invalid configuration") == std::string::npos, log);
}

TEST_CASE("UCX endpoints: READY exchange, a 24 MiB answer byte for byte, a refused connect, a deadline") {
  std::string why;
  auto worker = pd::UcxWorker::create(why);
  REQUIRE_MESSAGE(worker, why);
  std::string big(24u << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::atomic<int> requests{0};
  // A server that answers every pull request with `big` in 8 MiB pieces, or stalls when count == 0.
  auto handler = [&](const pd::UcxPullRequest& req, pd::PullSink& sink) -> boost::asio::awaitable<void> {
    ++requests;
    CHECK(req.key == "k");
    if (req.count == 0) {
      boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
      t.expires_after(std::chrono::milliseconds(1500));
      co_await t.async_wait(boost::asio::use_awaitable);
      co_return;
    }
    for (std::size_t at = 0; at < big.size(); at += 8u << 20) co_await sink.write(std::string_view(big).substr(at, 8u << 20));
    co_await sink.finish();
  };
  pd::UcxPullServer server(worker, "127.0.0.1", 0, std::chrono::milliseconds(5000), handler);
  REQUIRE(server.port() != 0);
  pd::UcxPullClient client(worker);
  boost::asio::io_context io;

  // Two pulls on one pooled endpoint, each byte-identical.
  const auto got = run_coro(io, [&]() -> boost::asio::awaitable<std::vector<std::string>> {
    std::vector<std::string> out;
    for (int i = 0; i < 2; ++i) {
      auto ep = co_await client.acquire("127.0.0.1", server.port(), Clock::now() + std::chrono::seconds(5));
      pd::UcxPullRequest req;
      req.transfer = 1, req.from = 0, req.count = 1, req.key = "k";
      co_await pd::send_pull_request(*ep, req, Clock::now() + std::chrono::seconds(5));
      pd::UcxPullSource source(*ep, std::chrono::milliseconds(5000));
      std::string all(big.size() + 16, '\0');
      std::size_t filled = 0;
      for (;;) {
        const std::size_t n = co_await source.read_some_into(std::span<char>(all.data() + filled, all.size() - filled));
        if (n == 0) break;
        filled += n;
      }
      all.resize(filled);
      out.push_back(std::move(all));
      client.give_back("127.0.0.1", server.port(), std::move(ep));
    }
    co_return out;
  });
  REQUIRE(got.size() == 2);
  CHECK(got[0] == big);
  CHECK(got[1] == big);
  CHECK(requests == 2);

  // Nobody listening: acquire fails as a connect failure, well before its deadline.
  const auto start = Clock::now();
  const std::string refused = run_coro(io, [&]() -> boost::asio::awaitable<std::string> {
    std::string reason;
    try {
      co_await client.acquire("127.0.0.1", 1, Clock::now() + std::chrono::seconds(3));
    } catch (const pd::PdFailure& e) {
      reason = e.reason;
    }
    co_return reason;
  });
  CHECK(refused == "connect");
  CHECK(Clock::now() - start < std::chrono::milliseconds(2900));

  // A stalled answer: the receive gives up at its deadline (timeout) and the endpoint is not reused.
  const auto stalled_at = Clock::now();
  const std::string stalled = run_coro(io, [&]() -> boost::asio::awaitable<std::string> {
    auto ep = co_await client.acquire("127.0.0.1", server.port(), Clock::now() + std::chrono::seconds(5));
    pd::UcxPullRequest req;
    req.key = "k";  // count 0: the handler stalls
    co_await pd::send_pull_request(*ep, req, Clock::now() + std::chrono::seconds(5));
    pd::UcxPullSource source(*ep, std::chrono::milliseconds(300));
    char buf[64];
    std::string reason;
    try {
      co_await source.read_some_into(buf);
    } catch (const pd::PdFailure& e) {
      reason = e.reason;
    }
    CHECK(ep->broken());
    co_return reason;
  });
  CHECK(stalled == "timeout");
  const auto waited = Clock::now() - stalled_at;
  CHECK(waited >= std::chrono::milliseconds(300));
  CHECK(waited < std::chrono::milliseconds(1400));
}

namespace {

// A pull buffer as pull_buffer() hands out, of `bytes`.
std::shared_ptr<pd::ReceivedPull> target_of(std::size_t bytes) {
  auto t = std::make_shared<pd::ReceivedPull>();
  t->bytes = std::make_unique<char[]>(bytes);
  t->capacity = bytes;
  return t;
}

// Reads a whole answer as read_pull_frames does (spans from the target's start on), into the target.
boost::asio::awaitable<std::size_t> read_all_into(pd::UcxPullSource& source, pd::ReceivedPull& target) {
  std::size_t filled = 0;
  for (;;) {
    const std::size_t n = co_await source.read_some_into(std::span<char>(target.bytes.get() + filled, target.capacity - filled));
    if (n == 0) break;
    filled += n;
  }
  co_return filled;
}

}  // namespace

TEST_CASE("UCX receive ahead: pieces land in the pull's buffer in place; a piece too big, a stall, a reader that leaves") {
  std::string why;
  auto d_worker = pd::UcxWorker::create(why);
  REQUIRE_MESSAGE(d_worker, why);
  auto p_worker = pd::UcxWorker::create(why);
  REQUIRE_MESSAGE(p_worker, why);
  std::string big(12u << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 11);
  // count selects P's answer: 1 big in 1 MiB pieces; 2 big in pieces of 1 byte, 3 bytes, 64 KiB + 1 and
  // the rest (piece boundaries anywhere); 3 big as one piece; 4 one piece of 100 bytes, then a 1.5 s stall.
  auto handler = [&](const pd::UcxPullRequest& req, pd::PullSink& sink) -> boost::asio::awaitable<void> {
    const std::string_view all(big);
    if (req.count == 1)
      for (std::size_t at = 0; at < all.size(); at += 1u << 20) co_await sink.write(all.substr(at, 1u << 20));
    if (req.count == 2) {
      const std::size_t cuts[] = {0, 1, 4, 4 + 65537, all.size()};
      for (int i = 0; i + 1 < 5; ++i) co_await sink.write(all.substr(cuts[i], cuts[i + 1] - cuts[i]));
    }
    if (req.count == 3) co_await sink.write(all);
    if (req.count == 4) {
      co_await sink.write(all.substr(0, 100));
      boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
      t.expires_after(std::chrono::milliseconds(1500));
      co_await t.async_wait(boost::asio::use_awaitable);
    }
    co_await sink.finish();
  };
  pd::UcxPullServer server(p_worker, "127.0.0.1", 0, std::chrono::milliseconds(5000), handler);
  pd::UcxPullClient client(d_worker);
  boost::asio::io_context io;
  const auto request = [&](std::uint32_t count) -> boost::asio::awaitable<std::shared_ptr<pd::UcxEndpoint>> {
    auto ep = co_await client.acquire("127.0.0.1", server.port(), Clock::now() + std::chrono::seconds(5));
    pd::UcxPullRequest req;
    req.count = count;
    co_await pd::send_pull_request(*ep, req, Clock::now() + std::chrono::seconds(5));
    co_return ep;
  };

  // Both piece patterns, twice each on pooled endpoints: every byte in place, the stream in step after.
  for (const std::uint32_t count : {1u, 2u, 1u, 2u}) {
    CAPTURE(count);
    auto target = target_of(big.size() + 4096);
    const std::size_t got = run_coro(io, [&]() -> boost::asio::awaitable<std::size_t> {
      auto ep = co_await request(count);
      std::size_t n = 0;
      {
        pd::UcxPullSource source(*ep, std::chrono::milliseconds(5000), target);
        n = co_await read_all_into(source, *target);
      }
      CHECK_FALSE(ep->broken());
      client.give_back("127.0.0.1", server.port(), std::move(ep));
      co_return n;
    });
    REQUIRE(got == big.size());
    CHECK(std::memcmp(target->bytes.get(), big.data(), big.size()) == 0);
    CHECK(target.use_count() == 1);  // nothing else holds the buffer after a clean pull
  }

  // A piece larger than the buffer: malformed, before a byte of it lands; the endpoint is not reused.
  {
    auto target = target_of(1u << 20);
    const std::string reason = run_coro(io, [&]() -> boost::asio::awaitable<std::string> {
      auto ep = co_await request(3);
      std::string r;
      {
        pd::UcxPullSource source(*ep, std::chrono::milliseconds(5000), target);
        try {
          co_await read_all_into(source, *target);
        } catch (const pd::PdFailure& e) {
          r = e.reason;
        }
      }
      CHECK(ep->broken());
      co_return r;
    });
    CHECK(reason == "malformed");
  }

  // P stalls mid-answer: the wait gives up at io_timeout (timeout), having handed on the 100 bytes.
  {
    auto target = target_of(big.size());
    const auto start = Clock::now();
    std::size_t before_failure = 0;
    const std::string reason = run_coro(io, [&]() -> boost::asio::awaitable<std::string> {
      auto ep = co_await request(4);
      std::string r;
      pd::UcxPullSource source(*ep, std::chrono::milliseconds(300), target);
      try {
        for (;;) {
          const std::size_t n = co_await source.read_some_into(
              std::span<char>(target->bytes.get() + before_failure, target->capacity - before_failure));
          if (n == 0) break;
          before_failure += n;
        }
      } catch (const pd::PdFailure& e) {
        r = e.reason;
      }
      CHECK(ep->broken());
      co_return r;
    });
    CHECK(reason == "timeout");
    CHECK(before_failure == 100);
    const auto waited = Clock::now() - start;
    CHECK(waited >= std::chrono::milliseconds(300));
    CHECK(waited < std::chrono::milliseconds(1400));
  }

  // The reader leaves mid-answer (as after a bad frame): while the receive ahead is posted it holds the
  // buffer; the source's end closes the endpoint, which ends the receive and lets the buffer go.
  {
    auto target = target_of(big.size());
    std::shared_ptr<pd::UcxEndpoint> kept;
    run_coro(io, [&]() -> boost::asio::awaitable<void> {
      kept = co_await request(4);
      pd::UcxPullSource source(*kept, std::chrono::milliseconds(5000), target);
      const std::size_t n = co_await source.read_some_into(std::span<char>(target->bytes.get(), target->capacity));
      CHECK(n == 100);
      CHECK(target.use_count() >= 3);  // this test, the source, and the receive posted for the rest
    });
    CHECK(kept->broken());
    const auto until = Clock::now() + std::chrono::seconds(3);
    while (target.use_count() > 1 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(target.use_count() == 1);  // released by the worker once the forced close ended the receive
  }
}

TEST_CASE("UCX pool: an idle endpoint that P dropped is replaced by one fresh connection, not a failed pull") {
  std::string why;
  auto client_worker = pd::UcxWorker::create(why);
  REQUIRE_MESSAGE(client_worker, why);
  auto p_worker = pd::UcxWorker::create(why);
  REQUIRE_MESSAGE(p_worker, why);
  const std::string answer(3u << 20, 'a');
  std::atomic<int> served{0};
  // P answers, then drops that connection a little later, while D's endpoint sits idle in its pool (as a P
  // that restarted would have: its listener is back, the endpoint D pooled is dead). Throwing out of the
  // handler closes the endpoint by force.
  auto handler = [&](const pd::UcxPullRequest&, pd::PullSink& sink) -> boost::asio::awaitable<void> {
    co_await sink.write(answer);
    co_await sink.finish();
    ++served;
    boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
    t.expires_after(std::chrono::milliseconds(200));
    co_await t.async_wait(boost::asio::use_awaitable);
    throw std::runtime_error("P drops the connection");
  };
  pd::UcxPullServer p(p_worker, "127.0.0.1", 0, std::chrono::milliseconds(5000), handler);
  pd::UcxPullClient client(client_worker);
  boost::asio::io_context io;
  const auto one_pull = [&]() -> boost::asio::awaitable<std::size_t> {
    auto ep = co_await client.acquire("127.0.0.1", p.port(), Clock::now() + std::chrono::seconds(5));
    pd::UcxPullRequest req;
    req.count = 1;
    co_await pd::send_pull_request(*ep, req, Clock::now() + std::chrono::seconds(5));
    pd::UcxPullSource source(*ep, std::chrono::milliseconds(5000));
    std::string all(answer.size() + 16, '\0');
    std::size_t filled = 0;
    for (;;) {
      const std::size_t n = co_await source.read_some_into(std::span<char>(all.data() + filled, all.size() - filled));
      if (n == 0) break;
      filled += n;
    }
    client.give_back("127.0.0.1", p.port(), std::move(ep));
    co_return filled;
  };
  for (int i = 0; i < 3; ++i) {  // each pull finds the endpoint of the one before in the pool, dead
    CAPTURE(i);
    std::size_t got = 0;
    std::string failed;
    try {
      got = run_coro(io, one_pull);
    } catch (const std::exception& e) {
      failed = e.what();
    }
    CHECK_MESSAGE(failed.empty(), failed);
    CHECK(got == answer.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // P drops the endpoint D just pooled
  }
  CHECK(served == 3);
  // The second and third acquire each found the endpoint before dead, either marked broken by UCX's error
  // callback (skipped) or failing the ping (closed, counted here); either way a fresh connection served.
  MESSAGE("pooled endpoints replaced after a failed ping: " << client.replaced());
}

TEST_CASE("negotiation: ucx when both sides speak it, tcp when either lacks it; answers identical") {
  ReplicaProcess p_ucx({"--role", "prefill", "--pd-transports", "ucx,tcp"});
  ReplicaProcess p_tcp({"--role", "prefill", "--pd-transports", "tcp"});
  ReplicaProcess d_ucx({"--role", "decode", "--pd-transports", "ucx,tcp"});
  ReplicaProcess d_tcp({"--role", "decode"});  // the default: tcp
  ReplicaProcess m({"--role", "mixed"});
  struct Case {
    ReplicaProcess* p;
    ReplicaProcess* d;
    const char* transport;
  };
  int seed = 600;
  for (const Case& c : {Case{&p_ucx, &d_ucx, "ucx"}, Case{&p_tcp, &d_ucx, "tcp"}, Case{&p_ucx, &d_tcp, "tcp"}}) {
    CAPTURE(c.transport);
    const double before = metric_value(c.d->port(), pulls_on(c.transport));
    const std::string body = completion_body(prompt_ids(++seed, 90), 4);
    CHECK(answer_of(post(c.d->port(), "/v1/completions", body, c.p->base_url())) == answer_of(post(m.port(), "/v1/completions", body)));
    CHECK(metric_value(c.d->port(), pulls_on(c.transport)) == before + 1);  // 5 blocks: one pull
    check_no_leak(c.p->port());
    check_no_leak(c.d->port());
  }
  CHECK(metric_value(d_ucx.port(), "kvfleet_pd_transfers_total") == 2);
  // Concurrent transfers from one D to one P: each borrows its own endpoint from the pool.
  std::vector<std::string> bodies, want;
  for (int i = 0; i < 4; ++i) {
    bodies.push_back(completion_body(prompt_ids(++seed, 70 + 16 * i), i));
    want.push_back(answer_of(post(m.port(), "/v1/completions", bodies.back())));
  }
  std::vector<std::future<http::Response>> got;
  for (const auto& b : bodies)
    got.push_back(std::async(std::launch::async, [&, b] { return post(d_ucx.port(), "/v1/completions", b, p_ucx.base_url()); }));
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(answer_of(got[i].get()) == want[i]);
  CHECK(metric_value(d_ucx.port(), "kvfleet_pd_transfers_total") == 6);
  CHECK(metric_value(d_ucx.port(), pulls_on("ucx")) == 5);  // the first case's one, then one each
  CHECK(metric_value(d_ucx.port(), "kvfleet_pd_transport_fallbacks_total{reason=\"connect\"}") == 0);
  check_no_leak(p_ucx.port());
  check_no_leak(d_ucx.port());
}

TEST_CASE("UCX connect refused: the pulls go over tcp, the answer is right, the downgrade is counted") {
  ReplicaProcess p({"--role", "prefill", "--pd-transports", "ucx,tcp"});
  ReplicaProcess d({"--role", "decode", "--pd-transports", "ucx,tcp", "--pd-connect-timeout-ms", "1000"});
  ReplicaProcess m({"--role", "mixed"});
  FaultyPrefillProxy proxy(p.port(), true);
  proxy.ucx_port_override = 1;  // the accept sends D to a port where nothing listens
  const std::string body = completion_body(prompt_ids(700, 120), 5);
  CHECK(answer_of(post(d.port(), "/v1/completions", body, proxy.url())) == answer_of(post(m.port(), "/v1/completions", body)));
  CHECK(metric_value(d.port(), "kvfleet_pd_transport_fallbacks_total{reason=\"connect\"}") == 1);
  CHECK(metric_value(d.port(), pulls_on("tcp")) == 1);
  CHECK(metric_value(d.port(), pulls_on("ucx")) == 0);
  CHECK(metric_value(d.port(), "kvfleet_pd_transfers_total") == 1);  // not a local prefill
  CHECK(d.get("/metrics").body.find("kvfleet_pd_fallbacks_total{") == std::string::npos);
  check_no_leak(p.port());
  check_no_leak(d.port());
}

#endif
