// D's reading of one pull (GET /internal/prefill/blocks): the response body lands straight in one buffer
// sized for the pull, every frame is checked where it lies (checksum, index, Contract 1 hash, layer range,
// size) and the block payloads are handed on in place, so the import copies each byte once into the cache.
// Shared by DecodeFetcher and bench_pd_transfer (the bench measures exactly what D does).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/pd/layout.h"
#include "engine/pd/transport.h"
#include "engine/pd/wire.h"
#include "kvfleet/http/client.h"

namespace kvfleet::pd {

// Why a transfer stopped (a fallback reason of pd_metrics.h, and a detail for the log).
struct PdFailure : std::runtime_error {
  PdFailure(std::string reason_, const std::string& detail) : std::runtime_error(detail), reason(std::move(reason_)) {}
  std::string reason;
};

// The blocks of one pull as received: `blocks[i].payload` points into `bytes`. Its buffer goes back to a
// small process-wide pool when it is destroyed, and read_pull takes from there: fresh memory costs a page
// fault per 4 KiB (a third of a transfer's CPU in the profile), pooled memory was touched already.
struct ReceivedPull {
  ReceivedPull() = default;
  ReceivedPull(const ReceivedPull&) = delete;
  ReceivedPull& operator=(const ReceivedPull&) = delete;
  ~ReceivedPull();
  std::unique_ptr<char[]> bytes;
  std::size_t capacity = 0;
  std::vector<BlockView> blocks;
};

// A receive buffer sized for a pull of `count` blocks, as read_pull_frames fills it: `reuse` when it is big
// enough, else one from the spare pool (or fresh). read_pull_frames does this itself; a transport that
// receives ahead of the reader into the buffer (ucx, UcxPullSource) takes it first and passes it as `reuse`.
std::shared_ptr<ReceivedPull> pull_buffer(const KvLayout& layout, std::uint32_t count,
                                          std::shared_ptr<ReceivedPull> reuse = nullptr);

// After the GET was sent: reads the answer, block frames for exactly [from, from + count) then an end
// frame. `hashes` are D's own hashes of every wanted block (index = block index). Throws PdFailure, or
// WireError (checksum, malformed), or system_error (I/O, timeout). `reuse`, when given and big enough, is
// filled instead of a new buffer (fresh memory costs a page fault per 4 KiB, which showed in the profile);
// nothing may read it meanwhile.
boost::asio::awaitable<std::shared_ptr<ReceivedPull>> read_pull(http::HttpClient& c, const KvLayout& layout,
                                                                std::span<const BlockHash> hashes, std::uint32_t from,
                                                                std::uint32_t count,
                                                                std::chrono::steady_clock::time_point deadline,
                                                                std::shared_ptr<ReceivedPull> reuse = nullptr);

// The same reading and checking of one pull's frames from any transport (the HTTP body above, or a UCX
// stream): what read_pull does after the response head. Throws as read_pull.
boost::asio::awaitable<std::shared_ptr<ReceivedPull>> read_pull_frames(ByteSource& in, const KvLayout& layout,
                                                                       std::span<const BlockHash> hashes,
                                                                       std::uint32_t from, std::uint32_t count,
                                                                       std::chrono::steady_clock::time_point deadline,
                                                                       std::shared_ptr<ReceivedPull> reuse = nullptr);

// D's pull without a receive buffer (the CPU backend: the cache is host memory): the block frames'
// payloads are read from `in` straight into `dst`, layer l of the pull's k-th block at dst[k * layers + l]
// (layout.block_bytes() / layers bytes each: D's landing blocks, KvCacheManager::reserve_block), the
// frame headers and trailers into small buffers; each frame is checked (XXH3 over its header and those
// bytes, index, Contract 1 hash, layer range, size) once its bytes are in, while they are still in cache.
// Throws as read_pull; the bytes at dst are then unspecified (the blocks were never entered in the
// prefix cache). Any ByteSource, so both transports may use it.
boost::asio::awaitable<void> read_pull_frames_into(ByteSource& in, const KvLayout& layout, std::span<const BlockHash> hashes,
                                                   std::uint32_t from, std::uint32_t count,
                                                   std::chrono::steady_clock::time_point deadline,
                                                   std::span<char* const> dst);
// The HTTP pull's answer (after the GET was sent) read as read_pull_frames_into does.
boost::asio::awaitable<void> read_pull_into(http::HttpClient& c, const KvLayout& layout, std::span<const BlockHash> hashes,
                                            std::uint32_t from, std::uint32_t count,
                                            std::chrono::steady_clock::time_point deadline, std::span<char* const> dst);

// The error object's code of a non-200 answer from P ("" when there is none).
std::string error_code_of(const std::string& body);

}  // namespace kvfleet::pd
