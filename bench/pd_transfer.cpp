// bench_pd_transfer: KV transfer throughput over TCP (engine/pd: a prefill replica's block stream, read
// and checked frame by frame by the decode replica's own code) next to a plain loopback TCP copy of the same
// bytes in the same run (issue 17's goal: at least 0.7 of it).
//   build/bin/bench_pd_transfer [--tokens 1024] [--reps 5] [--pull-blocks 32] [--transport tcp|ucx]
// (--transport ucx: the pulls go over the ucx KV transport, pd_transfer_ucx.h; the plain copy stays TCP.)
// The prefill itself is outside the timing: each repetition's handshake first, then the timed pull of
// every block (P copies them on its engine thread into frames and checksums them; this side reads them with
// pd::read_pull, which checks checksum, index, hash, layers and size, and copies every payload once into a
// cache-sized buffer, as D's import does, overlapped with the next pull). The model is random with a KV block of 512 KiB (8 layers, 8 KV heads, head dim
// 64, fp32), so a 1024-token prompt ships 32 MiB.
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
                 std::size_t& wire) {
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
      const auto deadline = Clock::now() + std::chrono::seconds(60);
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

}  // namespace

int main(int argc, char** argv) {
  int tokens = 1024, reps = 5, pull_blocks = 32;
  bool profile = false;
  std::string transport = "tcp";
  for (int i = 1; i < argc; ++i) profile = profile || std::strcmp(argv[i], "--profile") == 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tokens") == 0) tokens = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--pull-blocks") == 0) pull_blocks = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--transport") == 0) transport = argv[i + 1];
  }
  if (transport != "tcp" && transport != "ucx") {
    std::fprintf(stderr, "bench_pd_transfer: --transport tcp|ucx\n");
    return 2;
  }
  tokens = tokens / 16 * 16;
  const auto dir = std::filesystem::temp_directory_path() / ("kvfleet-pd-bench-" + std::to_string(::getpid()));
  MakeModelOptions o;
  o.arch = "llama";
  o.layers = 8;
  o.hidden = 128;
  o.intermediate = 256;
  o.heads = 8;
  o.kv_heads = 8;
  o.head_dim = 64;
  o.tokenizer = KVFLEET_BENCH_TOKENIZER_DIR;
  make_model(o, dir / "bench-model");
  server::ReplicaConfig c;
  c.model = (dir / "bench-model").string();
  c.port = 0;
  c.role = "prefill";
  c.engine.backend.kind = "cpu";
  c.engine.num_blocks = tokens / 16 + 8;
  c.engine.scheduler.max_num_batched_tokens = tokens;
  if (transport == "ucx") c.pd.transports = {"ucx", "tcp"};
  server::Replica p(c);
  p.start();
  std::unique_ptr<pd::UcxPullClient> ucx;
  if (transport == "ucx") {
    std::string why;
    auto worker = pd::UcxWorker::create(why);
    if (!worker) {
      std::fprintf(stderr, "bench_pd_transfer: no UCX: %s\n", why.c_str());
      return 1;
    }
    ucx = std::make_unique<pd::UcxPullClient>(std::move(worker));
  }

  pd::Hello hello;
  hello.layout = {"bench-model", "llama", DType::f32, DType::f32, 8, 8, 64, 16, block_hash_root("bench-model")};
  hello.compat_hash = pd::compat_hash(hello.layout);
  if (ucx) hello.transports = {"ucx", "tcp"};
  for (int i = 0; i < tokens; ++i) hello.tokens.push_back(100 + (i * 7919) % 5000);
  const auto hashes = block_hashes(hello.layout.root, hello.tokens, 16);
  const http::Headers binary{{"Content-Type", "application/octet-stream"}};
  std::vector<double> pd_s, tcp_s, pd_cpu, tcp_cpu;
  std::size_t payload = 0, wire = 0;
  std::vector<char> cache(static_cast<std::size_t>(tokens / 16) * hello.layout.block_bytes());
  for (int r = 0; r < reps; ++r) {
    const auto ok = http::http_request("127.0.0.1", p.port(), "POST", "/internal/prefill", pd::encode(hello), binary,
                                       std::chrono::seconds(120));
    const auto accept = std::get<pd::Accept>(pd::decode_one(ok.body));
    const auto start = Clock::now();
    const double cpu0 = cpu_seconds();
    const auto ticks0 = profile ? thread_ticks() : std::map<std::string, long>{};
    if (ucx && accept.transport != "ucx") {
      std::fprintf(stderr, "bench_pd_transfer: P did not pick ucx\n");
      return 1;
    }
    payload = ucx ? bench::pull_ucx(*ucx, accept.transport_port, accept.transfer_id, hello.layout, hashes,
                                    static_cast<std::uint32_t>(pull_blocks), cache, wire)
                  : pull(p.port(), accept.transfer_id, hello.layout, hashes, static_cast<std::uint32_t>(pull_blocks), cache, wire);
    pd_s.push_back(seconds_since(start));
    pd_cpu.push_back(cpu_seconds() - cpu0);
    if (profile) {
      std::string line = "pull cpu ticks by thread:";
      for (const auto& [tid, t] : thread_ticks())
        if (t - (ticks0.count(tid) ? ticks0.at(tid) : 0) > 0) line += " " + tid + "=" + std::to_string(t - (ticks0.count(tid) ? ticks0.at(tid) : 0));
      std::fprintf(stderr, "%s (main thread %d)\n", line.c_str(), static_cast<int>(::getpid()));
    }
    if (payload == 0) {
      std::fprintf(stderr, "bench_pd_transfer: the pull did not deliver every block intact\n");
      return 1;
    }
    const double cpu1 = cpu_seconds();
    tcp_s.push_back(tcp_copy(wire));
    tcp_cpu.push_back(cpu_seconds() - cpu1);
  }
  const double pd_gbs = static_cast<double>(payload) / median(pd_s) / 1e9;
  const double tcp_gbs = static_cast<double>(wire) / median(tcp_s) / 1e9;
  std::printf("{\"transport\": \"%s\", \"tokens\": %d, \"blocks\": %zu, \"payload_bytes\": %zu, \"reps\": %d, \"pull_blocks\": %d, "
              "\"pd_pull_gbps\": %.3f, \"tcp_copy_gbps\": %.3f, \"ratio\": %.3f, \"pd_cpu_s_per_gb\": %.3f, "
              "\"tcp_cpu_s_per_gb\": %.3f}\n",
              transport.c_str(), tokens, hashes.size(), payload, reps, pull_blocks, pd_gbs, tcp_gbs, pd_gbs / tcp_gbs,
              median(pd_cpu) / (static_cast<double>(payload) / 1e9), median(tcp_cpu) / (static_cast<double>(wire) / 1e9));
  std::filesystem::remove_all(dir);
  return 0;
}
