// bench_pd_transfer: KV transfer throughput of engine/pd's transports (a prefill replica's block stream, read
// and checked frame by frame by the decode replica's own code) next to a plain loopback TCP copy of the same
// bytes, measured rep by rep in the same run (the goal: at least 0.7 of it).
//   build/bin/bench_pd_transfer [--tokens 1024] [--prompts 4 | --mib 128] [--reps 7] [--warmup 1]
//                               [--pull-blocks 32] [--transport tcp|ucx|all] [--profile] [--receive-buffer]
// Each rep is, for each transport asked for (all: tcp then ucx): the timed transfers of --prompts prompts
// of --tokens tokens (each as D does it: its own connection or pooled endpoint, pulls of --pull-blocks
// blocks), each followed at once by a plain TCP copy of the same wire bytes (so the two halves of a pair
// are never more than one 32 MiB transfer apart, and the load of other processes hits both alike); the
// rep's ratio (pull GB/s over copy GB/s, each summed over its 4 halves) is what is reported (median, min,
// max over the reps after the --warmup ones, which are dropped). (--transport ucx: the pulls go over the ucx KV transport,
// pd_transfer_ucx.h; the plain copy stays TCP.) One JSON line per transport.
// The prefill itself is outside the timing: P computes each prompt once, untimed; each rep's handshakes
// are untimed too, and the timing starts once P's engine is idle (`p_engine_steps_timed` in the JSON says
// how many engine steps P still ran during the timed parts: 0). In the timed pull P sends every block from
// its cache with frames and checksums; this side reads them as a CPU D does (pd::read_pull_into: each
// payload straight into its place in a cache-sized buffer, checked there: checksum, index, hash, layers,
// size; D then enters the blocks in its prefix cache, not timed here), or with --receive-buffer as a CUDA
// D does, and ucx always (pd::read_pull(_frames) into a receive buffer, then every payload copied once into
// the cache-sized buffer on another thread, as D's import does, overlapped with the next pull). The
// model is random with a KV block of 512 KiB (8 layers, 8 KV heads, head dim 64, fp32), so a 1024-token
// prompt ships 32 MiB and a rep of 4 prompts 128 MiB (100 ms or more on the 2-core VM). Several prompts
// rather than one long one: P's prefill grows with the square of the prompt (4096 tokens took 55 s here).
#include <sys/resource.h>

#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "engine/pd/pull_reader.h"
#include "engine/pd/wire.h"
#include "engine/server/replica.h"
#include "kvfleet/http/client.h"
#include "kvfleet/make_model.h"
#include "pd_transfer_ucx.h"

using namespace kvfleet;
using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// CPU seconds (user + system) of this process so far: P, D and the TCP copy all run in it, so the CPU
// time per byte says how much work a transfer costs even when other processes load the machine.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// --profile: CPU ticks of each thread of this process (from /proc/self/task/*/stat), to see where a
// transfer's CPU goes (engine thread, P's io threads, this reader).
std::map<std::string, long> thread_ticks() {
  std::map<std::string, long> out;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(t.path() / "stat");
    std::string line;
    std::getline(in, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stol(field);
      if (i == 15) stime = std::stol(field);
    }
    out[t.path().filename().string()] = utime + stime;
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds to push `bytes` through a loopback TCP connection in 1 MiB writes.
double tcp_copy(std::size_t bytes) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  const auto port = acceptor.local_endpoint().port();
  std::thread writer([&] {
    asio::io_context wio;
    asio::ip::tcp::socket s(wio);
    s.connect({asio::ip::make_address("127.0.0.1"), port});
    std::string chunk(1 << 20, 'x');
    for (std::size_t sent = 0; sent < bytes; sent += chunk.size())
      asio::write(s, asio::buffer(chunk.data(), std::min(chunk.size(), bytes - sent)));
  });
  asio::ip::tcp::socket s = acceptor.accept();
  const auto start = Clock::now();
  std::vector<char> buf(1 << 20);
  std::size_t got = 0;
  while (got < bytes) got += s.read_some(asio::buffer(buf));
  const double t = seconds_since(start);
  writer.join();
  return t;
}

// Every block pulled exactly as the decode replica pulls it (engine/pd/pull_reader.h: pulls of
// `pull_blocks` on one connection, the body read straight into the pull's buffer, each frame checked in
// place), and each verified payload copied once into a cache-sized buffer on a second thread while the next
// pull is read (D's import on its engine thread). Returns the payload bytes, 0 on any failure; `wire` gets
// the bytes on the wire.
std::size_t pull(std::uint16_t port, std::uint64_t transfer, const pd::KvLayout& layout,
                 const std::vector<BlockHash>& hashes, std::uint32_t pull_blocks, std::vector<char>& cache,
                 std::size_t& wire, bool landing) {
  asio::io_context io;
  std::size_t bytes = 0;
  wire = 0;
  const auto total = static_cast<std::uint32_t>(hashes.size());
  const std::size_t block_bytes = layout.block_bytes();
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    http::HttpClientConfig cc;
    cc.piece_size = 1 << 20;  // as D's
    http::HttpClient c(co_await asio::this_coro::executor, cc);
    co_await c.connect("127.0.0.1", port);
    std::future<void> importing;
    std::shared_ptr<pd::ReceivedPull> buffers[2];  // in turn, as D's
    std::size_t turn = 0;
    for (std::uint32_t at = 0; at < total;) {
      const std::uint32_t n = std::min(pull_blocks, total - at);
      http::Request get;
      get.method = "GET";
      get.target = "/internal/prefill/blocks?transfer=" + std::to_string(transfer) + "&from=" + std::to_string(at) +
                   "&count=" + std::to_string(n);
      co_await c.send(get);
      const auto deadline = Clock::now() + std::chrono::seconds(300);
      if (landing) {  // D on a CPU backend: the payloads land in the cache blocks themselves, no import copy
        const std::size_t layers = layout.num_layers, layer_bytes = block_bytes / layers;
        std::vector<char*> dst;
        for (std::uint32_t i = at; i < at + n; ++i)
          for (std::size_t l = 0; l < layers; ++l) dst.push_back(cache.data() + std::size_t{i} * block_bytes + l * layer_bytes);
        co_await pd::read_pull_into(c, layout, hashes, at, n, deadline, dst);
        bytes += std::size_t{n} * block_bytes;
        wire += std::size_t{n} * pd::block_frame_bytes(block_bytes) + 32;
        at += n;
        continue;
      }
      std::shared_ptr<pd::ReceivedPull>& buffer = buffers[turn++ % 2];
      buffer = co_await pd::read_pull(c, layout, hashes, at, n, deadline, std::move(buffer));
      std::shared_ptr<pd::ReceivedPull> got = buffer;
      if (importing.valid()) importing.get();
      importing = std::async(std::launch::async, [&cache, got, block_bytes] {
        for (const pd::BlockView& b : got->blocks)
          std::memcpy(cache.data() + std::size_t{b.index} * block_bytes, b.payload.data(), block_bytes);
      });
      bytes += std::size_t{n} * block_bytes;
      wire += std::size_t{n} * pd::block_frame_bytes(block_bytes) + 32;  // the frames and the end frame
      at += n;
    }
    if (importing.valid()) importing.get();
  }, [&](std::exception_ptr e) {
    if (!e) return;
    bytes = 0;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      std::fprintf(stderr, "bench_pd_transfer: %s\n", x.what());
    }
  });
  io.run();
  return bytes;
}


// What one transport's reps measured (after the warm-up ones).
struct Series {
  std::string transport;
  std::vector<double> pd_s, tcp_s, ratio, pd_cpu, tcp_cpu;
  std::uint64_t p_steps = 0;  // P's engine steps during the timed parts of these reps
};

double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

std::string joined(const std::vector<double>& v) {
  std::string out;
  char buf[32];
  for (const double x : v) {
    std::snprintf(buf, sizeof buf, "%s%.3f", out.empty() ? "" : ", ", x);
    out += buf;
  }
  return "[" + out + "]";
}

// The bench's prefill replica (P in this process, offering ucx too when asked) and the prompts it serves.
struct Bench {
  std::filesystem::path dir;
  std::unique_ptr<server::Replica> p;
  std::unique_ptr<pd::UcxPullClient> ucx;
  std::vector<pd::Hello> hellos;                // one per prompt
  std::vector<std::vector<BlockHash>> hashes;  // of each prompt's blocks
  std::vector<char> cache;                     // D's cache stand-in: one prompt's blocks
  std::uint32_t pull_blocks = 32;
  bool profile = false;
  bool landing = true;  // tcp: read into the cache stand-in as D does (--receive-buffer: the buffered path)
};

pd::Accept open_transfer(Bench& b, std::size_t prompt, bool want_ucx) {
  pd::Hello h = b.hellos[prompt];
  h.transports = want_ucx ? std::vector<std::string>{"ucx", "tcp"} : std::vector<std::string>{"tcp"};
  const http::Headers binary{{"Content-Type", "application/octet-stream"}};
  const auto ok = http::http_request("127.0.0.1", b.p->port(), "POST", "/internal/prefill", pd::encode(h), binary,
                                     std::chrono::seconds(300));
  if (ok.status != 200) throw std::runtime_error("P answered the hello with " + std::to_string(ok.status) + ": " + ok.body);
  auto accept = std::get<pd::Accept>(pd::decode_one(ok.body));
  if (want_ucx && accept.transport != "ucx") throw std::runtime_error("P did not pick ucx");
  return accept;
}

std::size_t pull_over(Bench& b, const std::string& transport, const pd::Accept& accept, std::size_t prompt,
                      std::size_t& wire) {
  const pd::KvLayout& layout = b.hellos[prompt].layout;
  if (transport == "ucx")
    return bench::pull_ucx(*b.ucx, accept.transport_port, accept.transfer_id, layout, b.hashes[prompt], b.pull_blocks,
                           b.cache, wire);
  return pull(b.p->port(), accept.transfer_id, layout, b.hashes[prompt], b.pull_blocks, b.cache, wire, b.landing);
}

// One timed rep over `transport`: the handshakes of every prompt first (untimed), then for each prompt its
// transfer and right after it a plain TCP copy of the same wire bytes, so that the two halves of the pair
// are never more than one transfer apart (the load of other processes changes within a second). Fills
// the sums of both and returns the payload bytes (0: a transfer failed).
struct RepResult {
  std::size_t payload = 0, wire = 0;
  double pd_s = 0, pd_cpu = 0, tcp_s = 0, tcp_cpu = 0;
  std::uint64_t p_steps = 0;  // P's engine steps during the timed part (0: P computed nothing meanwhile)
};

RepResult timed_rep(Bench& b, const std::string& transport) {
  std::vector<pd::Accept> accepts;
  for (std::size_t i = 0; i < b.hellos.size(); ++i) accepts.push_back(open_transfer(b, i, transport == "ucx"));
  // Whatever P's engine still computes for these hellos runs before the timing, not next to the pulls (an
  // older P recomputed each prompt's last block here, a third of the measured CPU).
  for (const auto until = Clock::now() + std::chrono::seconds(60); Clock::now() < until;) {
    const SchedulerStats s = b.p->engine().stats().scheduler;
    if (s.num_running == 0 && s.num_waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  RepResult r;
  const std::uint64_t steps0 = b.p->engine().stats().scheduler.num_steps;
  const auto ticks0 = b.profile ? thread_ticks() : std::map<std::string, long>{};
  for (std::size_t i = 0; i < accepts.size(); ++i) {
    std::size_t w = 0;
    const auto start = Clock::now();
    const double cpu0 = cpu_seconds();
    const std::size_t got = pull_over(b, transport, accepts[i], i, w);
    r.pd_s += seconds_since(start);
    r.pd_cpu += cpu_seconds() - cpu0;
    if (got == 0) return RepResult{};
    r.payload += got, r.wire += w;
    const double cpu1 = cpu_seconds();
    r.tcp_s += tcp_copy(w);
    r.tcp_cpu += cpu_seconds() - cpu1;
  }
  r.p_steps = b.p->engine().stats().scheduler.num_steps - steps0;
  if (b.profile) {
    std::string line = transport + " (and copies) cpu ticks by thread:";
    for (const auto& [tid, t] : thread_ticks()) {
      const long before = ticks0.count(tid) ? ticks0.at(tid) : 0;
      if (t - before > 0) line += " " + tid + "=" + std::to_string(t - before);
    }
    std::fprintf(stderr, "%s (main thread %d)\n", line.c_str(), static_cast<int>(::getpid()));
  }
  return r;
}

void print_series(const Series& s, int tokens, std::size_t prompts, std::size_t blocks, std::size_t payload,
                  std::size_t wire, int warmup, std::uint32_t pull_blocks, const char* import) {
  const double gb = static_cast<double>(payload) / 1e9, wire_gb = static_cast<double>(wire) / 1e9;
  std::printf("{\"transport\": \"%s\", \"tokens\": %d, \"prompts\": %zu, \"blocks\": %zu, \"payload_bytes\": %zu, "
              "\"reps\": %zu, \"warmup\": %d, \"pull_blocks\": %u, \"pd_pull_gbps\": %.3f, \"tcp_copy_gbps\": %.3f, "
              "\"ratio\": %.3f, \"ratio_min\": %.3f, \"ratio_max\": %.3f, \"ratios\": %s, \"pd_cpu_s_per_gb\": %.3f, "
              "\"tcp_cpu_s_per_gb\": %.3f, \"pd_ms_median\": %.1f, \"p_engine_steps_timed\": %llu, \"d_import\": \"%s\"}\n",
              s.transport.c_str(), tokens, prompts, blocks, payload, s.ratio.size(), warmup, pull_blocks,
              gb / median(s.pd_s), wire_gb / median(s.tcp_s), median(s.ratio), min_of(s.ratio), max_of(s.ratio),
              joined(s.ratio).c_str(), median(s.pd_cpu) / gb, median(s.tcp_cpu) / wire_gb, median(s.pd_s) * 1e3,
              static_cast<unsigned long long>(s.p_steps), import);
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 1024, prompts = 4, reps = 7, warmup = 1, pull_blocks = 32;
  Bench b;
  std::string transport = "tcp";
  for (int i = 1; i < argc; ++i) {
    b.profile = b.profile || std::strcmp(argv[i], "--profile") == 0;
    b.landing = b.landing && std::strcmp(argv[i], "--receive-buffer") != 0;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--tokens") == 0) tokens = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--prompts") == 0) prompts = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--warmup") == 0) warmup = std::max(0, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--pull-blocks") == 0) pull_blocks = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--transport") == 0) transport = argv[i + 1];
  }
  tokens = std::max(16, tokens / 16 * 16);
  for (int i = 1; i + 1 < argc; ++i)  // after --tokens: so many prompts that a rep ships at least this much
    if (std::strcmp(argv[i], "--mib") == 0) prompts = std::max(1, (std::atoi(argv[i + 1]) * 32 + tokens - 1) / tokens);
  std::vector<std::string> transports;
  if (transport == "all") transports = {"tcp", "ucx"};
  else if (transport == "tcp" || transport == "ucx") transports = {transport};
  else {
    std::fprintf(stderr, "bench_pd_transfer: --transport tcp|ucx|all\n");
    return 2;
  }
  const bool with_ucx = transport != "tcp";
  b.pull_blocks = static_cast<std::uint32_t>(pull_blocks);
  b.dir = std::filesystem::temp_directory_path() / ("kvfleet-pd-bench-" + std::to_string(::getpid()));
  MakeModelOptions o;
  o.arch = "llama";
  o.layers = 8;
  o.hidden = 128;
  o.intermediate = 256;
  o.heads = 8;
  o.kv_heads = 8;
  o.head_dim = 64;
  o.max_position = tokens + 64;  // the prompt plus the token D would decode
  o.tokenizer = KVFLEET_BENCH_TOKENIZER_DIR;
  make_model(o, b.dir / "bench-model");
  server::ReplicaConfig c;
  c.model = (b.dir / "bench-model").string();
  c.port = 0;
  c.role = "prefill";
  c.engine.backend.kind = "cpu";
  c.engine.num_blocks = prompts * (tokens / 16) + 8;  // every prompt stays in P's prefix cache
  c.engine.scheduler.max_num_batched_tokens = std::min(tokens, 512);
  c.pd.lease = std::chrono::minutes(5);  // the untimed first transfer waits for P's prefill of the whole prompt
  if (with_ucx) c.pd.transports = {"ucx", "tcp"};
  b.p = std::make_unique<server::Replica>(c);
  b.p->start();
  if (with_ucx) {
    std::string why;
    auto worker = pd::UcxWorker::create(why);
    if (!worker) {
      std::fprintf(stderr, "bench_pd_transfer: no UCX: %s\n", why.c_str());
      return 1;
    }
    b.ucx = std::make_unique<pd::UcxPullClient>(std::move(worker));
  }
  for (int k = 0; k < prompts; ++k) {
    pd::Hello h;
    h.layout = {"bench-model", "llama", DType::f32, DType::f32, 8, 8, 64, 16, block_hash_root("bench-model")};
    h.compat_hash = pd::compat_hash(h.layout);
    for (int i = 0; i < tokens; ++i) h.tokens.push_back(100 + (i * 7919 + k * 104729) % 5000);
    b.hashes.push_back(block_hashes(h.layout.root, h.tokens, 16));
    b.hellos.push_back(std::move(h));
  }
  b.cache.resize(static_cast<std::size_t>(tokens / 16) * b.hellos[0].layout.block_bytes());
  std::size_t payload = 0, wire = 0;
  std::vector<Series> series;
  for (const auto& t : transports) series.push_back(Series{t, {}, {}, {}, {}, {}, 0});
  try {
    // P computes each prompt once, untimed (P accepts as soon as the first block is computed and streams the
    // rest as it is computed: timed pulls would include the compute); every rep then reuses P's prefix cache.
    const auto start = Clock::now();
    for (int k = 0; k < prompts; ++k) {
      const pd::Accept accept = open_transfer(b, static_cast<std::size_t>(k), false);
      if (pull_over(b, "tcp", accept, static_cast<std::size_t>(k), wire) == 0) throw std::runtime_error("the first pull failed");
    }
    std::fprintf(stderr, "bench_pd_transfer: P's prefill of %d x %d tokens and the first transfers: %.1f s\n", prompts,
                 tokens, seconds_since(start));
    for (int r = 0; r < warmup + reps; ++r) {
      for (Series& s : series) {
        const RepResult got = timed_rep(b, s.transport);
        if (got.payload == 0) throw std::runtime_error("a " + s.transport + " transfer did not deliver every block intact");
        payload = got.payload, wire = got.wire;
        const double pd_s = got.pd_s, pd_cpu = got.pd_cpu, tcp_s = got.tcp_s, tcp_cpu = got.tcp_cpu;
        if (r < warmup) continue;
        s.pd_s.push_back(pd_s);
        s.tcp_s.push_back(tcp_s);
        s.pd_cpu.push_back(pd_cpu);
        s.tcp_cpu.push_back(tcp_cpu);
        s.p_steps += got.p_steps;
        // pull GB/s over copy GB/s of the same rep: (payload / pd_s) / (wire / tcp_s)
        s.ratio.push_back(static_cast<double>(payload) * tcp_s / (static_cast<double>(wire) * pd_s));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pd_transfer: %s\n", e.what());
    std::filesystem::remove_all(b.dir);
    return 1;
  }
  for (const Series& s : series)
    print_series(s, tokens, b.hellos.size(), b.hashes.size() * b.hashes[0].size(), payload, wire, warmup, b.pull_blocks,
                 s.transport == "tcp" && b.landing ? "landing" : "receive-buffer");
  b.ucx.reset();
  b.p.reset();
  std::filesystem::remove_all(b.dir);
  return 0;
}
