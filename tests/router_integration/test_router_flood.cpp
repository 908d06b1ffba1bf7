// A kvfleet-router process under the floods that real attack tools make (bench/attack.sh): one address
// holding thousands of half-requests (slowloris), and a router saturated by slow completions with a full
// waiting room and every connection slot taken. Other clients and the probes must still be answered at
// once. The second client is another loopback address (127.0.0.2), so the router sees two peers.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "hardening_support.h"

using namespace kvfleet;
using namespace kvfleet::test;
using namespace kvfleet::test::hardening;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
namespace json = boost::json;

namespace {

// A connected socket from loopback address `from` to the router; -1 when the connect failed.
int connect_from(const char* from, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &local.sin_addr);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// Everything until the peer closes or `timeout` passes without input.
std::string read_until_close(int fd, milliseconds timeout) {
  std::string out;
  char buf[8192];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// True when the router has closed `fd` (EOF or reset waiting), without waiting.
bool closed_by_router(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
}

struct Timed {
  int status = 0;
  milliseconds took{0};
};

// One request on a new connection from `from` (Connection: close): its status and how long it took.
Timed timed_request(const char* from, std::uint16_t port, const std::string& method, const std::string& target,
                    const std::string& body = "") {
  const auto start = Clock::now();
  Timed t;
  const int fd = connect_from(from, port);
  if (fd < 0) return t;
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  if (!body.empty())
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  const std::string out = send_all(fd, req) ? read_until_close(fd, milliseconds(5000)) : std::string();
  ::close(fd);
  t.took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  if (out.rfind("HTTP/1.1 ", 0) == 0 && out.size() >= 12) t.status = std::stoi(out.substr(9, 3));
  return t;
}

// Raises this process's descriptor limit toward `want` (the router, a child, inherits it); the limit got.
rlim_t raise_nofile(rlim_t want) {
  rlimit limit{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
  if (limit.rlim_cur < want) {
    limit.rlim_cur = std::min(want, limit.rlim_max);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &limit) == 0);
  }
  return limit.rlim_cur;
}

struct Fds {
  std::vector<int> fds;
  ~Fds() {
    for (int fd : fds) ::close(fd);
  }
};

}  // namespace

TEST_CASE("slowloris: one address holding 6,000 half-requests; another address is served within 1 s") {
  // 6,000 sockets here, the router's share of them (2,592: half its 5,184 slots) there, plus spare. A CI
  // whose hard limit is lower runs the largest attack that fits, still well past the per-address cap.
  const rlim_t limit = raise_nofile(16384);
  const int attack = static_cast<int>(std::min<rlim_t>(6000, limit > 3500 ? limit - 500 : 0));
  REQUIRE_MESSAGE(attack > 2592 + 200, "RLIMIT_NOFILE " << limit << " is too low for the attack");
  if (attack < 6000) MESSAGE("RLIMIT_NOFILE " << limit << ": " << attack << " half-requests instead of 6,000");
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  RouterProcess router({}, standin_flags({&up}, {}));  // default caps: 5,184 slots, 2,592 per address

  Fds slowloris;
  const auto attack_start = Clock::now();
  for (int i = 0; i < attack; ++i) {
    const int fd = connect_from("127.0.0.1", router.port());
    REQUIRE(fd >= 0);
    slowloris.fds.push_back(fd);
    send_all(fd, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-a: b\r\n");  // never finished
  }
  // The attack is in place once the router has accepted every connection: it then holds its share.
  auto closed_count = [&] {
    int closed = 0;
    for (int fd : slowloris.fds) closed += closed_by_router(fd);
    return closed;
  };
  CHECK(wait_until([&] { return closed_count() >= attack - 2592; }, std::chrono::seconds(30)));
  MESSAGE(attack << " half-requests open after "
                 << std::chrono::duration_cast<milliseconds>(Clock::now() - attack_start).count() << " ms");
  // Another client, a request at a time, each on a new connection while the slowloris holds on.
  for (int i = 0; i < 20; ++i) {
    const Timed models = timed_request("127.0.0.2", router.port(), "GET", "/v1/models");
    CHECK(models.status == 200);
    CHECK(models.took < milliseconds(1000));
    const Timed completion = timed_request("127.0.0.2", router.port(), "POST", "/v1/completions", kBody);
    CHECK(completion.status == 200);
    CHECK(completion.took < milliseconds(1000));
  }
  // The router closed the slowloris's oldest half-requests to admit its newer ones: the address holds its
  // share, no more, and what it holds is the newest.
  const int closed = closed_count();
  CHECK(closed >= attack - 2592);
  CHECK(closed <= attack - 2592 + 64);
  CHECK(closed_by_router(slowloris.fds.front()));
  CHECK(!closed_by_router(slowloris.fds.back()));
}

TEST_CASE("saturated router: slow completions, a full waiting room, every slot taken; /health answers in < 200 ms") {
  raise_nofile(4096);
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  up.hang_ms = 8000;  // each forwarded completion holds its slot this long
  TempDir dir;
  {
    std::ofstream yaml(dir / "router.yaml");
    // 4 forwarded + 8 waiting + 64 = 76 connection slots, 38 per address.
    yaml << "max_concurrency: 4\nmax_queue: 8\nqueue_timeout_ms: 60000\nupstream_timeout_ms: 60000\n";
  }
  RouterProcess router({}, standin_flags({&up}, {"--config", (dir / "router.yaml").string()}));
  const std::string completion = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 "Content-Length: " + std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
  Fds flood;
  for (int i = 0; i < 12; ++i) {  // 4 forwarded, 8 waiting
    const int fd = connect_from("127.0.0.1", router.port());
    REQUIRE(fd >= 0);
    flood.fds.push_back(fd);
    REQUIRE(send_all(fd, completion));
  }
  REQUIRE(wait_until([&] { return up.in_flight.load() == 4; }, std::chrono::seconds(10)));
  REQUIRE(wait_until(
      [&] { return json::parse(router.get("/admin/replicas").body).at("queued").as_int64() == 8; },
      std::chrono::seconds(10)));
  // The waiting room is full: one more completion is refused.
  CHECK(timed_request("127.0.0.3", router.port(), "POST", "/v1/completions", kBody).status == 429);
  // The rest of the slots: requests whose bodies never come (being read: never closed for a newcomer),
  // from two addresses, each within its 38.
  const std::string slow_body = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: 1000\r\n\r\n{\"prompt\":";
  for (int i = 0; i < 64; ++i) {
    const int fd = connect_from(i < 26 ? "127.0.0.1" : "127.0.0.3", router.port());
    REQUIRE(fd >= 0);
    flood.fds.push_back(fd);
    REQUIRE(send_all(fd, slow_body));
  }
  std::this_thread::sleep_for(milliseconds(100));  // every head read: all 76 slots are busy
  // Work beyond the slots is turned away at once, not queued behind them.
  const Timed refused = timed_request("127.0.0.2", router.port(), "GET", "/v1/models");
  CHECK(refused.status == 503);
  CHECK(refused.took < milliseconds(200));
  for (const char* probe : {"/health", "/readiness", "/liveness", "/metrics", "/admin/replicas"}) {
    for (int i = 0; i < 5; ++i) {
      const Timed t = timed_request("127.0.0.2", router.port(), "GET", probe);
      CHECK_MESSAGE(t.status == 200, probe);
      CHECK_MESSAGE(t.took < milliseconds(200), probe << " took " << t.took.count() << " ms");
    }
  }
  CHECK(up.in_flight.load() == 4);  // nothing above was forwarded
}

namespace {

// Keep-alive connections from 127.0.0.1 that send `GET /v1/models` in pipelined batches and read the
// answers, each connection sending its next batch when the last one is answered: the io threads always
// have work, as under `wrk -c N` (bench/attack.sh flood). Runs on a thread of its own until stopped.
class KeepAliveFlood {
 public:
  KeepAliveFlood(std::uint16_t port, int connections, int batch) : batch_(batch) {
    for (int i = 0; i < connections; ++i) {
      const int fd = connect_from("127.0.0.1", port);
      REQUIRE(fd >= 0);
      fds_.fds.push_back(fd);
    }
    std::string one = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < batch; ++i) requests_ += one;
    thread_ = std::thread([this] { run(); });
  }
  ~KeepAliveFlood() {
    stop_ = true;
    thread_.join();
  }
  std::int64_t answered() const { return answered_; }

 private:
  void run() {
    const std::size_t n = fds_.fds.size();
    std::vector<int> owed(n, 0);  // answers still to come of each connection's batch
    std::vector<std::string> tail(n);  // the end of a head split over reads
    std::vector<pollfd> polls(n);
    for (std::size_t i = 0; i < n; ++i) polls[i] = {fds_.fds[i], POLLIN, 0};
    char buf[65536];
    while (!stop_) {
      for (std::size_t i = 0; i < n; ++i)
        if (owed[i] == 0 && send_all(fds_.fds[i], requests_)) owed[i] = batch_;
      if (::poll(polls.data(), polls.size(), 100) <= 0) continue;
      for (std::size_t i = 0; i < n; ++i) {
        if (!(polls[i].revents & POLLIN)) continue;
        const ssize_t got = ::recv(fds_.fds[i], buf, sizeof buf, MSG_DONTWAIT);
        if (got <= 0) continue;
        // One answer per head's end (the /v1/models body has no blank line).
        const std::string text = tail[i] + std::string(buf, static_cast<std::size_t>(got));
        std::size_t after = 0;
        for (std::size_t at = text.find("\r\n\r\n"); at != std::string::npos; at = text.find("\r\n\r\n", after)) {
          after = at + 4;
          owed[i] = std::max(owed[i] - 1, 0);
          ++answered_;
        }
        tail[i] = text.substr(std::max(after, text.size() >= 3 ? text.size() - 3 : 0));
      }
    }
  }

  Fds fds_;
  const int batch_;
  std::string requests_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> answered_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("flood: io threads kept busy by thousands of keep-alive connections; /health on a new connection answers at once") {
  const rlim_t limit = raise_nofile(8192);
  const int connections = static_cast<int>(std::min<rlim_t>(3000, limit > 200 ? (limit - 200) / 2 : 0));
  REQUIRE(connections >= 1000);
  StandinUpstream up;
  up.set_kv_script(config_event(0, 1));
  RouterProcess router({}, standin_flags({&up}, {"--max-connections-per-peer", "0"}));
  KeepAliveFlood flood(router.port(), connections, 8);
  REQUIRE(wait_until([&] { return flood.answered() > 20 * connections; }, std::chrono::seconds(60)));
  const auto before = flood.answered();
  std::vector<milliseconds> probes;
  for (int i = 0; i < 10; ++i) {
    const Timed t = timed_request("127.0.0.2", router.port(), "GET", "/health");
    CHECK(t.status == 200);
    probes.push_back(t.took);
    std::this_thread::sleep_for(milliseconds(100));
  }
  // Other work from a new connection waits its turn behind the flood, as it should.
  const Timed models = timed_request("127.0.0.2", router.port(), "GET", "/v1/models");
  CHECK(models.status == 200);
  CHECK(flood.answered() > before);  // the flood went on throughout
  std::sort(probes.begin(), probes.end());
  MESSAGE("flood of " << connections << " connections: /health p50 " << probes[5].count() << " ms, max "
                      << probes.back().count() << " ms; a new connection's /v1/models " << models.took.count() << " ms");
  CHECK(probes[5] < milliseconds(100));
  CHECK(probes.back() < milliseconds(500));
}
