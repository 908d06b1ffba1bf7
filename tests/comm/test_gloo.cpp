// The Gloo communicator and its rendezvous store, with ranks as threads of this process talking over
// loopback TCP (the same code as separate processes; tests/ep/test_ep_processes.cpp runs those).
#include <doctest/doctest.h>

#include <boost/asio.hpp>
#include <chrono>
#include <csignal>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>

#include "engine/comm/tcp_store.h"
#include "kvfleet/communicator.h"

using namespace kvfleet;
using namespace std::chrono_literals;

namespace {

unsigned short free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

// Runs `body(comm)` on `n` Gloo ranks (threads); returns each rank's exception message ("" if none).
template <class F>
std::vector<std::string> on_gloo_ranks(int n, std::chrono::milliseconds timeout, F body) {
  const std::string master = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooOptions o;
        o.rank = r;
        o.size = n;
        o.master = master;
        o.timeout = timeout;
        auto comm = make_gloo_communicator(o);
        body(*comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("TCP store: set/get across clients, a missing key times out, an absent master fails in time") {
  comm::TcpStoreServer server("127.0.0.1", 0);
  comm::TcpStoreClient a("127.0.0.1", server.port(), 2000ms), b("127.0.0.1", server.port(), 2000ms);
  auto later = std::async(std::launch::async, [&] { return b.get("k"); });  // waits for the key
  std::this_thread::sleep_for(50ms);
  a.set("k", {'h', 'i', '\0', 'x'});
  CHECK(later.get() == std::vector<char>{'h', 'i', '\0', 'x'});
  a.set("empty", {});
  CHECK(b.get("empty").empty());

  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(b.wait({"never"}, 300ms), CommunicatorError);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);

  const auto t1 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(comm::TcpStoreClient("127.0.0.1", free_port(), 300ms), CommunicatorError);
  CHECK(std::chrono::steady_clock::now() - t1 < 2s);

  comm::TcpStoreServer named("localhost", 0);  // a host name, not only a numeric address
  comm::TcpStoreClient c("localhost", named.port(), 2000ms);
  c.set("x", {'1'});
  CHECK(c.get("x") == std::vector<char>{'1'});

  CHECK_THROWS_AS(comm::parse_host_port("nohost"), std::invalid_argument);
  CHECK_THROWS_AS(comm::parse_host_port("h:70000"), std::invalid_argument);
  CHECK(comm::parse_host_port("10.0.0.1:29500") == std::pair<std::string, unsigned short>{"10.0.0.1", 29500});
}

TEST_CASE("Gloo communicator: all_to_all_v with uneven and empty pieces, all_gather, barrier (2 and 4 ranks)") {
  if (!gloo_available()) {
    MESSAGE("SKIP: built without Gloo");
    return;
  }
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<std::vector<std::uint8_t>> got(static_cast<std::size_t>(n));
    std::vector<std::vector<std::size_t>> got_sizes(static_cast<std::size_t>(n));
    std::vector<std::vector<std::int32_t>> gathered(static_cast<std::size_t>(n));
    const auto errors = on_gloo_ranks(n, 10000ms, [&](Communicator& c) {
      const int me = c.rank();
      // Piece for rank d: (me + d) % 3 bytes, each 16 * me + d; every rank to rank 0 sends nothing when me odd.
      for (int round = 0; round < 3; ++round) {
        std::vector<std::uint8_t> send;
        std::vector<std::size_t> sizes;
        for (int d = 0; d < c.size(); ++d) {
          std::size_t k = static_cast<std::size_t>((me + d + round) % 3);
          if (round == 2) k = 0;  // every piece empty
          sizes.push_back(k);
          send.insert(send.end(), k, static_cast<std::uint8_t>(16 * me + d));
        }
        std::vector<std::size_t> recv_sizes;
        auto recv = c.all_to_all_v(send.data(), sizes, recv_sizes);
        if (round == 0) {
          got[static_cast<std::size_t>(me)] = std::move(recv);
          got_sizes[static_cast<std::size_t>(me)] = recv_sizes;
        } else if (round == 2) {
          CHECK(recv.empty());
        }
      }
      const std::int32_t mine[2] = {me, 100 + me};
      gathered[static_cast<std::size_t>(me)].resize(static_cast<std::size_t>(2 * c.size()));
      c.all_gather(mine, sizeof mine, gathered[static_cast<std::size_t>(me)].data());
      c.barrier();
    });
    for (const auto& e : errors) CHECK(e == "");
    for (int me = 0; me < n; ++me) {
      std::vector<std::uint8_t> want;
      std::vector<std::size_t> want_sizes;
      for (int src = 0; src < n; ++src) {
        const auto k = static_cast<std::size_t>((src + me) % 3);
        want_sizes.push_back(k);
        want.insert(want.end(), k, static_cast<std::uint8_t>(16 * src + me));
      }
      CHECK(got[static_cast<std::size_t>(me)] == want);
      CHECK(got_sizes[static_cast<std::size_t>(me)] == want_sizes);
      for (int src = 0; src < n; ++src) {
        CHECK(gathered[static_cast<std::size_t>(me)][static_cast<std::size_t>(2 * src)] == src);
        CHECK(gathered[static_cast<std::size_t>(me)][static_cast<std::size_t>(2 * src + 1)] == 100 + src);
      }
    }
  }
}

TEST_CASE("Gloo communicator: a rank that leaves fails the others' next collective with a clear error, in time") {
  if (!gloo_available()) {
    MESSAGE("SKIP: built without Gloo");
    return;
  }
  std::vector<double> seconds(3, 0.0);
  std::vector<std::string> second_errors(3);
  const auto errors = on_gloo_ranks(3, 2000ms, [&](Communicator& c) {
    c.barrier();
    if (c.rank() == 2) return;  // its communicator closes: the peers see the connection go
    const auto t0 = std::chrono::steady_clock::now();
    try {
      std::int32_t x = c.rank(), all[3];
      c.all_gather(&x, sizeof x, all);
    } catch (const CommunicatorError& e) {
      seconds[static_cast<std::size_t>(c.rank())] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      try {
        c.barrier();  // broken from now on: fails at once
      } catch (const CommunicatorError& again) {
        second_errors[static_cast<std::size_t>(c.rank())] = again.what();
      }
      throw;
    }
  });
  for (int r : {0, 1}) {
    CAPTURE(r);
    CHECK(errors[static_cast<std::size_t>(r)].find("expert-parallel rank " + std::to_string(r) + " of 3: all_gather failed") !=
          std::string::npos);
    CHECK(seconds[static_cast<std::size_t>(r)] < 5.0);
    CHECK(second_errors[static_cast<std::size_t>(r)] == errors[static_cast<std::size_t>(r)]);
  }
  CHECK(errors[2] == "");
}

TEST_CASE("Gloo communicator: a rank that never joins fails the rendezvous after the timeout") {
  if (!gloo_available()) {
    MESSAGE("SKIP: built without Gloo");
    return;
  }
  GlooOptions o;
  o.rank = 0;
  o.size = 2;
  o.master = "127.0.0.1:" + std::to_string(free_port());
  o.timeout = 500ms;
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    make_gloo_communicator(o);
  } catch (const CommunicatorError& e) {
    error = e.what();
  }
  CHECK(error.find("rendezvous") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  o.rank = 2;
  CHECK_THROWS_AS(make_gloo_communicator(o), std::invalid_argument);
}

// Gloo writes with writev: a write to a peer that has gone raises SIGPIPE, whose default action kills the
// process (it killed this test binary once, in CI) before Gloo can report the lost peer.
TEST_CASE("Gloo communicator: SIGPIPE is ignored once a communicator exists, so a lost peer is an error, not a kill") {
  if (!gloo_available()) {
    MESSAGE("SKIP: built without Gloo");
    return;
  }
  std::signal(SIGPIPE, SIG_DFL);
  const auto errors = on_gloo_ranks(1, 2000ms, [](Communicator& c) { c.barrier(); });
  CHECK(errors[0] == "");
  struct sigaction now {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK((now.sa_handler == SIG_IGN));
  // A handler of the process's own is left alone.
  std::signal(SIGPIPE, +[](int) {});
  on_gloo_ranks(1, 2000ms, [](Communicator& c) { c.barrier(); });
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK((now.sa_handler != SIG_IGN && now.sa_handler != SIG_DFL));
  std::signal(SIGPIPE, SIG_IGN);
}
