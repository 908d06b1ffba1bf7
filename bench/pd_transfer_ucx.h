// bench_pd_transfer --transport ucx: the same pulls as pull() in pd_transfer.cpp, carried by the ucx KV
// transport (engine/pd/ucx/transport.h) instead of HTTP: a pooled UCP endpoint to P's listener, the pull
// request, and the answer read and checked by the decode replica's own code (pd::read_pull_frames), each
// verified payload copied once into a cache-sized buffer on a second thread while the next pull is read.
// Kept apart from pd_transfer.cpp so that the TCP bench's code stays as it is.
#pragma once

#include <boost/asio.hpp>
#include <cstdio>
#include <cstring>
#include <future>
#include <vector>

#include "engine/pd/pull_reader.h"
#include "engine/pd/ucx/transport.h"

namespace kvfleet::bench {

inline std::size_t pull_ucx(pd::UcxPullClient& client, std::uint16_t ucx_port, std::uint64_t transfer,
                            const pd::KvLayout& layout, const std::vector<BlockHash>& hashes, std::uint32_t pull_blocks,
                            std::vector<char>& cache, std::size_t& wire) {
  namespace asio = boost::asio;
  using Clock = std::chrono::steady_clock;
  asio::io_context io;
  std::size_t bytes = 0;
  wire = 0;
  const auto total = static_cast<std::uint32_t>(hashes.size());
  const std::size_t block_bytes = layout.block_bytes();
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    auto ep = co_await client.acquire("127.0.0.1", ucx_port, Clock::now() + std::chrono::seconds(5));
    std::future<void> importing;
    std::shared_ptr<pd::ReceivedPull> buffers[2];  // in turn, as D's
    std::size_t turn = 0;
    for (std::uint32_t at = 0; at < total;) {
      const std::uint32_t n = std::min(pull_blocks, total - at);
      pd::UcxPullRequest req;
      req.transfer = transfer, req.from = at, req.count = n;
      co_await pd::send_pull_request(*ep, req, Clock::now() + std::chrono::seconds(5));
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      std::shared_ptr<pd::ReceivedPull>& buffer = buffers[turn++ % 2];
      buffer = pd::pull_buffer(layout, n, std::move(buffer));
      pd::UcxPullSource source(*ep, std::chrono::milliseconds(5000), buffer);  // as D's: received ahead into it
      buffer = co_await pd::read_pull_frames(source, layout, hashes, at, n, deadline, std::move(buffer));
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
    client.give_back("127.0.0.1", ucx_port, std::move(ep));
  }, [&](std::exception_ptr e) {
    if (!e) return;
    bytes = 0;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      std::fprintf(stderr, "bench_pd_transfer: ucx: %s\n", x.what());
    }
  });
  io.run();
  return bytes;
}

}  // namespace kvfleet::bench
