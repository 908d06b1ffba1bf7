// Expert parallelism over separate processes (Gloo on loopback): `kvfleet logits` and `kvfleet generate`
// with --ep-rank R --ep-master print exactly what one engine prints, and a rank killed or frozen mid-run
// makes the others fail with a clear error within the timeout instead of hanging; an idle group of
// generate ranks sleeps.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "kvfleet/block_hash.h"
#include "kvfleet/communicator.h"
#include "support/process.h"
#include "support/temp_dir.h"

using namespace kvfleet;
using namespace std::chrono_literals;

namespace {

std::string free_master() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return "127.0.0.1:" + std::to_string(a.local_endpoint().port());
}

std::vector<std::string> lines_of(const std::string& out) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < out.size()) {
    const auto end = out.find('\n', start);
    lines.push_back(out.substr(start, end - start));
    start = end == std::string::npos ? out.size() : end + 1;
  }
  return lines;
}

// The rank `kvfleet generate --ep-size` sends a prompt to (cmd_generate.cpp's rank_for, block size 16).
int rank_of(const std::vector<TokenId>& prompt, int ranks) {
  const std::span<const TokenId> first(prompt.data(), std::min<std::size_t>(prompt.size(), 16));
  return static_cast<int>(block_hash_next(block_hash_root("ep"), first) % static_cast<std::uint64_t>(ranks));
}

struct Ranks {
  std::vector<std::unique_ptr<test::ChildProcess>> procs;
  // Starts `n` ranks of `cmd` (a shell command line; stderr joins stdout).
  Ranks(const std::string& cmd, int n, const std::string& extra = "") {
    const std::string master = free_master();
    for (int r = 0; r < n; ++r)
      procs.push_back(std::make_unique<test::ChildProcess>(std::vector<std::string>{
          "/bin/sh", "-c", "exec " + cmd + " --ep-size " + std::to_string(n) + " --ep-rank " + std::to_string(r) +
                               " --ep-master " + master + " " + extra + " 2>&1"}));
  }
  // Every rank's output lines (until EOF) and exit status.
  std::vector<std::pair<int, std::vector<std::string>>> finish(std::chrono::milliseconds timeout) {
    std::vector<std::pair<int, std::vector<std::string>>> out;
    for (auto& p : procs) {
      std::vector<std::string> lines;
      while (auto l = p->read_line(timeout)) lines.push_back(*l);
      out.emplace_back(p->wait(timeout), std::move(lines));
    }
    return out;
  }
};

}  // namespace

TEST_CASE("kvfleet logits and generate over 2 and 4 Gloo processes print what one engine prints") {
  if (!gloo_available()) {
    MESSAGE("SKIP: built without Gloo");
    return;
  }
  test::TempDir dir;
  const std::string bin = test::bin_dir() + "/kvfleet ";
  const std::string model = (dir / "moe").string();
  REQUIRE(test::run_command(bin + "make-model --arch qwen2_moe --experts 8 --experts-per-tok 2 --packed-experts "
                                  "--mlp-only-layers 0 --vocab 128 --out " + model).status == 0);
  const std::string logits = bin + "logits --backend cpu --threads 1 --model " + model + " --ids 5,9,2,77,31,8,64,1,3";
  const auto one = test::run_command(logits);
  REQUIRE(one.status == 0);
  for (int n : {2, 4}) {
    CAPTURE(n);
    Ranks ranks(logits, n);
    const auto results = ranks.finish(60s);
    CHECK(results[0].first == 0);
    CHECK(results[0].second == lines_of(one.out));
    for (int r = 1; r < n; ++r) {
      CHECK(results[static_cast<std::size_t>(r)].first == 0);
      CHECK(results[static_cast<std::size_t>(r)].second.empty());  // only rank 0 prints
    }
  }

  // 10 prompts (greedy and seeded, lengths 5..95, chunked by a small token budget): uneven per rank.
  {
    std::ofstream f(dir / "p.jsonl");
    for (int i = 0; i < 10; ++i) {
      f << "{\"id\": " << i << ", \"prompt_ids\": [";
      for (int t = 0; t < 5 + 10 * i; ++t) f << (t ? "," : "") << (t * 7 + i * 3) % 128;
      f << "], \"max_tokens\": " << 2 + i << (i % 2 ? ", \"temperature\": 0.8, \"seed\": 5" : "") << "}\n";
    }
  }
  const std::string gen = bin + "generate --backend cpu --threads 1 --ignore-eos --max-batched-tokens 32 --model " +
                          model + " --prompts " + (dir / "p.jsonl").string();
  const auto single = test::run_command(gen);
  REQUIRE(single.status == 0);
  auto want = lines_of(single.out);
  std::sort(want.begin(), want.end());
  REQUIRE(want.size() == 10);
  for (int n : {2, 4}) {
    CAPTURE(n);
    Ranks ranks(gen, n);
    std::vector<std::string> got;
    std::size_t busiest = 0;
    for (const auto& [status, lines] : ranks.finish(60s)) {
      CHECK(status == 0);
      got.insert(got.end(), lines.begin(), lines.end());
      busiest = std::max(busiest, lines.size());
    }
    std::sort(got.begin(), got.end());
    CHECK(got == want);
    CHECK(busiest > 10 / static_cast<std::size_t>(n));  // the load was uneven: some rank ran more than its share
  }
}

TEST_CASE("a Gloo rank killed or frozen mid-run fails the other rank with a clear error within the timeout") {
  if (!gloo_available()) {
    MESSAGE("SKIP: built without Gloo");
    return;
  }
  test::TempDir dir;
  const std::string bin = test::bin_dir() + "/kvfleet ";
  const std::string model = (dir / "moe").string();
  REQUIRE(test::run_command(bin + "make-model --arch mixtral --experts 4 --vocab 128 --out " + model).status == 0);
  // Rank 0: a 1-token prompt (its line says the group is running) and a long one; rank 1: a long one.
  std::vector<std::vector<TokenId>> by_rank[2];
  for (int i = 0; by_rank[0].size() < 2 || by_rank[1].empty(); ++i) {
    std::vector<TokenId> p;
    for (int t = 0; t < 20; ++t) p.push_back((t * 5 + i * 11) % 128);
    by_rank[rank_of(p, 2)].push_back(p);
  }
  {
    std::ofstream f(dir / "p.jsonl");
    auto line = [&](const std::vector<TokenId>& p, int max_tokens, const char* id) {
      f << "{\"id\": \"" << id << "\", \"prompt_ids\": [";
      for (std::size_t t = 0; t < p.size(); ++t) f << (t ? "," : "") << p[t];
      f << "], \"max_tokens\": " << max_tokens << "}\n";
    };
    line(by_rank[0][0], 1, "short");
    line(by_rank[0][1], 3000, "long0");
    line(by_rank[1][0], 3000, "long1");
  }
  const std::string gen = bin + "generate --backend cpu --threads 1 --ignore-eos --model " + model + " --prompts " +
                          (dir / "p.jsonl").string();
  for (const int sig : {SIGKILL, SIGSTOP}) {
    CAPTURE(sig);
    Ranks ranks(gen, 2, "--ep-timeout-ms 1500");
    auto first = ranks.procs[0]->read_line(60s);
    REQUIRE(first);
    CHECK(first->find("\"short\"") != std::string::npos);
    ranks.procs[1]->signal(sig);
    const auto t0 = std::chrono::steady_clock::now();
    std::string rest;
    while (auto l = ranks.procs[0]->read_line(20s)) rest += *l + "\n";
    const int status = ranks.procs[0]->wait(20s);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(rest);
    CHECK(status != 0);
    CHECK(status != -1);  // it exited by itself, and did not crash
    CHECK(took < 15.0);
    CHECK(rest.find("expert-parallel rank 0 of 2") != std::string::npos);
    CHECK(rest.find("\"long0\"") != std::string::npos);  // the long request ended with the error, not silently
    if (sig == SIGSTOP) ranks.procs[1]->signal(SIGKILL);
  }
}

namespace {

// What a process did so far: CPU time in clock ticks (user + system, every thread) and wake-ups
// (voluntary context switches, summed over its threads).
struct Activity {
  long ticks = 0, wakeups = 0;
};
Activity activity_of(pid_t pid) {
  Activity a;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream stat(proc + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 15 && rest >> field; ++i)
    if (i == 14 || i == 15) a.ticks += std::stol(field);
  for (const auto& task : std::filesystem::directory_iterator(proc + "/task")) {
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) a.wakeups += std::stol(line.substr(24));
  }
  return a;
}

// Waits until a process opened `fifo` for reading (a non-blocking writer's open succeeds only then) and
// returns the writer's end; -1 after `timeout`.
int open_fifo_writer(const std::filesystem::path& fifo, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) return fd;
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

}  // namespace

// The ranks of `kvfleet generate --ep-rank` read their prompts after the group formed; from a FIFO that
// the test writes only later, the group is idle meanwhile and must sleep (no vote every few ms), then
// run the prompts as one engine does.
TEST_CASE("kvfleet generate --ep-rank: an idle group of processes sleeps, then prints one engine's lines") {
  if (!gloo_available()) {
    MESSAGE("SKIP: built without Gloo");
    return;
  }
  test::TempDir dir;
  const std::string bin = test::bin_dir() + "/kvfleet ";
  const std::string model = (dir / "moe").string();
  REQUIRE(test::run_command(bin + "make-model --arch mixtral --experts 4 --vocab 128 --out " + model).status == 0);
  std::ostringstream lines;
  for (int i = 0; i < 6; ++i) {
    lines << "{\"id\": " << i << ", \"prompt_ids\": [";
    for (int t = 0; t < 6 + 7 * i; ++t) lines << (t ? "," : "") << (t * 5 + i * 13) % 128;
    lines << "], \"max_tokens\": " << 3 + i << (i % 2 ? ", \"temperature\": 0.7, \"seed\": 9" : "") << "}\n";
  }
  const std::string prompts = lines.str();
  {
    std::ofstream f(dir / "p.jsonl");
    f << prompts;
  }
  const std::string gen = bin + "generate --backend cpu --threads 1 --ignore-eos --model " + model;
  const auto single = test::run_command(gen + " --prompts " + (dir / "p.jsonl").string());
  REQUIRE(single.status == 0);
  auto want = lines_of(single.out);
  std::sort(want.begin(), want.end());
  REQUIRE(want.size() == 6);

  const int n = 2;
  const std::string master = free_master();
  std::vector<std::unique_ptr<test::ChildProcess>> procs;
  std::vector<std::filesystem::path> fifos;
  for (int r = 0; r < n; ++r) {
    fifos.push_back(dir / (r ? "p1.fifo" : "p0.fifo"));
    REQUIRE(::mkfifo(fifos.back().c_str(), 0600) == 0);
    procs.push_back(std::make_unique<test::ChildProcess>(std::vector<std::string>{
        "/bin/sh", "-c", "exec " + gen + " --prompts " + fifos.back().string() + " --ep-size " + std::to_string(n) +
                             " --ep-rank " + std::to_string(r) + " --ep-master " + master + " 2>&1"}));
  }
  std::vector<int> writers;
  for (int r = 0; r < n; ++r) {
    writers.push_back(open_fifo_writer(fifos[static_cast<std::size_t>(r)], 60s));  // the group formed
    REQUIRE(writers.back() >= 0);
  }
  std::this_thread::sleep_for(200ms);  // the first idle votes back off (or settle asleep)
  std::vector<Activity> before;
  for (auto& p : procs) before.push_back(activity_of(p->pid()));
  std::this_thread::sleep_for(1s);
  const long ticks_per_50ms = std::max(1L, ::sysconf(_SC_CLK_TCK) / 20);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    const Activity now = activity_of(procs[static_cast<std::size_t>(r)]->pid());
    const Activity& was = before[static_cast<std::size_t>(r)];
    CHECK(now.ticks - was.ticks <= ticks_per_50ms);
    // Asleep: Gloo's own event loop (an epoll_wait with a 10 ms timeout: 100 a second, whatever we do),
    // the channel's heartbeats and its reader's 100 ms deadline checks: some 120 a second. A group that
    // polls its votes every 1-8 ms: some 400 a second (measured with the polling build) and ~100 ms of CPU.
    CHECK(now.wakeups - was.wakeups < 200);
  }
  std::signal(SIGPIPE, SIG_IGN);  // a rank that died must fail the write below, not kill this test binary
  for (int w : writers) {
    REQUIRE(::write(w, prompts.data(), prompts.size()) == static_cast<ssize_t>(prompts.size()));
    ::close(w);
  }
  std::vector<std::string> got;
  for (auto& p : procs) {
    while (auto l = p->read_line(60s)) got.push_back(*l);
    CHECK(p->wait(60s) == 0);
  }
  std::sort(got.begin(), got.end());
  CHECK(got == want);
}
