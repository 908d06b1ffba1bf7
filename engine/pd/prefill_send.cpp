// PrefillService's sending of a pull's block frames (prefill_service.h): from the cache memory itself on a
// CPU replica, through engine-thread copies where the io thread cannot read the cache (CUDA).
#include <algorithm>
#include <array>
#include <cstring>

#include "engine/pd/prefill_service.h"

namespace kvfleet::pd {
using boost::asio::awaitable;

std::unique_ptr<char[]> PrefillService::BufferPool::take() {
  {
    std::lock_guard lock(mu);
    if (!spare.empty()) {
      auto b = std::move(spare.back());
      spare.pop_back();
      return b;
    }
  }
  return std::make_unique_for_overwrite<char[]>(bytes);
}

void PrefillService::BufferPool::give_back(std::unique_ptr<char[]> buffer) {
  std::lock_guard lock(mu);
  if (buffer && spare.size() < kSpare) spare.push_back(std::move(buffer));
}

awaitable<bool> PrefillService::send_error(PullSink& w, ErrorCode code, std::string message) {
  ErrorFrame e{code, std::move(message)};
  const std::string bytes = encode(e);
  const bool written = co_await w.write(bytes);  // (not `if (co_await ...) co_await`: GCC 12)
  if (written) co_await w.finish();
  co_return false;
}

// Per frame: its header (put_block_header), one piece per layer straight from the cache, its checksum
// (one XXH3 pass over those pieces) as the trailer; per_send_ frames (about 1 MiB) go out as one chunk in
// one gathered write, so the kernel's copy reads the bytes the checksum pass just brought into L2. The
// pull's copy of the lease holds the stream pin: nothing frees or reuses these blocks before it is done.
awaitable<bool> PrefillService::send_from_cache(PullSink& w, std::uint64_t id, const Lease& lease,
                                                std::uint32_t at, const Ready& ready, End& end) {
  const auto layers = static_cast<std::size_t>(layout_.num_layers);
  const std::size_t layer_bytes = layout_.block_bytes() / layers;
  std::vector<std::array<char, kBlockPayloadOffset>> heads(per_send_);
  std::vector<std::array<char, kFrameTrailerBytes>> tails(per_send_);
  std::vector<std::string_view> pieces;
  const auto total = static_cast<std::uint32_t>(ready.blocks.size());
  std::uint32_t done = 0;
  while (done < total) {
    const std::uint32_t n = std::min(per_send_, total - done);
    if (!touch(id)) break;  // the lease ended (the pull's hold keeps the memory valid anyway)
    pieces.clear();
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint32_t index = at + done + i;
      const std::size_t frame_start = pieces.size();
      put_block_header(heads[i].data(), index, lease.hashes[index - lease.first], 0,
                       static_cast<std::uint16_t>(layout_.num_layers), layout_.block_bytes());
      pieces.emplace_back(heads[i].data(), heads[i].size());
      for (std::size_t l = 0; l < layers; ++l) pieces.emplace_back(ready.layers[std::size_t{done + i} * layers + l], layer_bytes);
      const std::uint64_t sum = frame_checksum(std::span(pieces).subspan(frame_start));
      std::memcpy(tails[i].data(), &sum, sizeof sum);
      pieces.emplace_back(tails[i].data(), tails[i].size());
    }
    const bool sent = co_await w.write_pieces(pieces);  // one chunk, one gathered write
    if (!sent) co_return false;
    end.payload_bytes += std::uint64_t{n} * block_frame_bytes(layout_.block_bytes());
    end.num_blocks += n;
    done += n;
  }
  if (done == total && touch(id)) co_return true;
  const bool ok = co_await send_error(w, ErrorCode::lease_expired, "the transfer's lease expired; its blocks are freed");
  co_return ok;
}

std::shared_ptr<PrefillService::Batches> PrefillService::start_read(boost::asio::any_io_executor ex,
                                                                    std::vector<BlockId> blocks) {
  auto out = std::make_shared<Batches>(std::move(ex));
  const std::size_t stride = block_frame_bytes(layout_.block_bytes());
  // Copies on the engine thread (the stream pin holds the blocks), straight into the payloads of a batch of
  // block frames (one backend call: the CUDA backend stages it through pinned memory); the io thread writes
  // the frames' headers and checksums.
  engine_.run_kv_task([out, pool = buffers_, blocks = std::move(blocks), stride](Scheduler&, Backend& b) {
    Batch batch;
    batch.bytes = pool->take();  // blocks.size() <= per_read_
    batch.size = stride * blocks.size();
    b.read_kv_blocks(blocks, batch.bytes.get() + kBlockPayloadOffset, stride);
    out->push(std::move(batch));
  });
  return out;
}

// Batches of about 8 MiB; the next batch is copied on the engine thread while this one is sent.
awaitable<bool> PrefillService::send_copied(PullSink& w, std::uint64_t id, const Lease& lease,
                                            std::uint32_t at, const Ready& ready, End& end) {
  const auto total = static_cast<std::uint32_t>(ready.blocks.size());
  const auto ex = co_await boost::asio::this_coro::executor;
  const auto batch_of = [&](std::uint32_t done) {
    const auto begin = ready.blocks.begin() + done;
    return std::vector<BlockId>(begin, begin + std::min(per_read_, total - done));
  };
  std::shared_ptr<Batches> pending = start_read(ex, batch_of(0));
  const std::size_t stride = block_frame_bytes(layout_.block_bytes());
  std::uint32_t done = 0;
  while (done < total) {
    const std::uint32_t n = std::min(per_read_, total - done);
    std::optional<Batch> batch = co_await pending->pop();
    pending.reset();
    if (!batch || !touch(id)) break;
    if (done + n < total) pending = start_read(ex, batch_of(done + n));
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint32_t index = at + done + i;
      char* frame = batch->bytes.get() + i * stride;
      put_block_header(frame, index, lease.hashes[index - lease.first], 0, static_cast<std::uint16_t>(layout_.num_layers),
                       layout_.block_bytes());
      seal_frame(frame, stride);
    }
    const bool sent = co_await w.write(std::string_view(batch->bytes.get(), batch->size));  // one chunk, one write
    buffers_->give_back(std::move(batch->bytes));
    if (!sent) co_return false;
    end.payload_bytes += batch->size;
    end.num_blocks += n;
    done += n;
  }
  if (done == total && touch(id)) co_return true;
  const bool ok = co_await send_error(w, ErrorCode::lease_expired, "the transfer's lease expired; its blocks are freed");
  co_return ok;
}

}  // namespace kvfleet::pd
