// bench_pd_transfer: KV transfer throughput over TCP (engine/pd: a prefill replica's block stream, read
// and checked frame by frame as a decode replica does) next to a plain loopback TCP copy of the same bytes
// in the same run (issue 17's goal: at least 0.7 of it).
//   build/bin/bench_pd_transfer [--tokens 1024] [--reps 5]
// The prefill itself is outside the timing: each repetition's handshake first, then the timed pull of
// every block (P copies them on its engine thread, frames and checksums them; this side decodes and checks
// checksum, index and hash). The model is random with a KV block of 512 KiB (8 layers, 8 KV heads, head dim
// 64, fp32), so a 1024-token prompt ships 32 MiB.
#include <boost/asio.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "engine/pd/wire.h"
#include "engine/server/replica.h"
#include "kvfleet/http/client.h"
#include "kvfleet/make_model.h"

using namespace kvfleet;
using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

// One pull of every block, read as the decode replica reads it (1 MiB pieces, frames decoded and checked as
// they arrive). Returns the payload bytes, or 0 on any mismatch; `wire` gets the bytes on the wire.
std::size_t pull(std::uint16_t port, const std::string& target, const pd::KvLayout& layout,
                 const std::vector<BlockHash>& hashes, std::size_t& wire) {
  asio::io_context io;
  std::size_t bytes = 0, blocks = 0;
  wire = 0;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    http::HttpClientConfig cc;
    cc.piece_size = 1 << 20;
    http::HttpClient c(co_await asio::this_coro::executor, cc);
    co_await c.connect("127.0.0.1", port);
    http::Request get;
    get.method = "GET";
    get.target = target;
    co_await c.send(get);
    co_await c.read_head();
    pd::FrameDecoder decoder(layout.block_bytes() + 4096);
    while (auto piece = co_await c.read_some()) {
      wire += piece->size();
      decoder.feed(*piece);
      while (auto f = decoder.next()) {
        const auto* b = std::get_if<pd::BlockFrame>(&*f);
        if (!b) continue;
        if (b->index != blocks || b->hash != hashes[blocks] || b->payload.size() != layout.block_bytes()) co_return;
        bytes += b->payload.size();
        ++blocks;
      }
    }
  }, asio::detached);
  io.run();
  return blocks == hashes.size() ? bytes : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 1024, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tokens") == 0) tokens = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
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
  server::Replica p(c);
  p.start();

  pd::Hello hello;
  hello.layout = {"bench-model", "llama", DType::f32, DType::f32, 8, 8, 64, 16, block_hash_root("bench-model")};
  hello.compat_hash = pd::compat_hash(hello.layout);
  for (int i = 0; i < tokens; ++i) hello.tokens.push_back(100 + (i * 7919) % 5000);
  const auto hashes = block_hashes(hello.layout.root, hello.tokens, 16);
  const http::Headers binary{{"Content-Type", "application/octet-stream"}};
  std::vector<double> pd_s, tcp_s;
  std::size_t payload = 0, wire = 0;
  for (int r = 0; r < reps; ++r) {
    const auto ok = http::http_request("127.0.0.1", p.port(), "POST", "/internal/prefill", pd::encode(hello), binary,
                                       std::chrono::seconds(120));
    const auto accept = std::get<pd::Accept>(pd::decode_one(ok.body));
    const std::string target = "/internal/prefill/blocks?transfer=" + std::to_string(accept.transfer_id) +
                               "&from=0&count=" + std::to_string(accept.num_blocks);
    const auto start = Clock::now();
    payload = pull(p.port(), target, hello.layout, hashes, wire);
    pd_s.push_back(seconds_since(start));
    if (payload == 0) {
      std::fprintf(stderr, "bench_pd_transfer: the pull did not deliver every block intact\n");
      return 1;
    }
    tcp_s.push_back(tcp_copy(wire));
  }
  const double pd_gbs = static_cast<double>(payload) / median(pd_s) / 1e9;
  const double tcp_gbs = static_cast<double>(wire) / median(tcp_s) / 1e9;
  std::printf("{\"tokens\": %d, \"blocks\": %zu, \"payload_bytes\": %zu, \"reps\": %d, \"pd_pull_gbps\": %.3f, "
              "\"tcp_copy_gbps\": %.3f, \"ratio\": %.3f}\n",
              tokens, hashes.size(), payload, reps, pd_gbs, tcp_gbs, pd_gbs / tcp_gbs);
  std::filesystem::remove_all(dir);
  return 0;
}
