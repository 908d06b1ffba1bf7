// DecodeFetcher's engine-thread half (decode_fetcher.h): the landing blocks a tcp pull reads into on a CPU
// replica, and the entering or import of each verified pull's blocks in the prefix cache.
#include "engine/pd/decode_fetcher.h"

namespace kvfleet::pd {
using boost::asio::awaitable;

awaitable<DecodeFetcher::Landing> DecodeFetcher::reserve_landing(std::uint32_t n) {
  struct Reserved {
    PinId pin = 0;
    std::vector<BlockId> blocks;
    std::vector<char*> layers;
  };
  // On the engine thread: n blocks off the free list into a pin of their own, with no prefix-cache entry,
  // so no step can read them while the pulls write them; all or nothing.
  auto reserve = [n](Scheduler& s, Backend& b) {
    Reserved r;
    KvCacheManager& kv = s.kv();
    r.pin = kv.pin({});
    const std::int64_t layers = b.kv_cache_shape().num_layers;
    bool host = true;
    for (std::uint32_t i = 0; host && i < n; ++i) {
      const BlockId block = kv.reserve_block(r.pin);
      if (block == kNoBlock) break;
      r.blocks.push_back(block);
      for (std::int64_t l = 0; host && l < layers; ++l) {
        const void* p = b.kv_host_bytes(l, block);  // the block is this pin's alone: D may write it
        host = p != nullptr;
        r.layers.push_back(static_cast<char*>(const_cast<void*>(p)));
      }
    }
    if (!host || r.blocks.size() < n) {
      kv.unpin(r.pin);  // back to the free list, uncached
      return Reserved{};
    }
    return r;
  };
  Reserved r = co_await on_engine_thread(engine_, std::move(reserve));
  Landing out;
  if (r.pin == 0) co_return out;
  out.pin = EnginePin(engine_, r.pin);
  out.blocks = std::move(r.blocks);
  out.layers = std::move(r.layers);
  co_return out;
}

std::shared_ptr<http::AsyncQueue<std::uint32_t>> DecodeFetcher::start_enter(boost::asio::any_io_executor ex, const Plan& plan,
                                                                             const Landing& landing, std::uint32_t at,
                                                                             std::uint32_t n) {
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const BlockHash root = plan.root;
  const auto first = landing.blocks.begin() + (at - plan.held);
  // Between steps on the engine thread: each verified landing block becomes a prefix-cache entry (KV
  // events report it) held by the request's pin; one computed here meanwhile is kept instead. The landing
  // pin still holds its reference until the transfer ends, and frees whatever was not entered.
  auto task = [pin = plan.pin, blocks = std::vector<BlockId>(first, first + n), at, tokens = plan.tokens,
               hashes = plan.hashes, bs, root](Scheduler& s, Backend&) -> std::uint32_t {
    KvCacheManager& kv = s.kv();
    std::uint32_t done = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const std::size_t index = at + i;
      const auto toks = std::span<const TokenId>(tokens).subspan(index * bs, bs);
      const BlockHash parent = index == 0 ? root : hashes[index - 1];
      BlockId block = kv.cached_block(hashes[index], toks);
      if (block == kNoBlock) {
        if (!kv.enter_block(blocks[i], hashes[index], parent, toks)) break;
        block = blocks[i];
      }
      kv.add_to_pin(pin, block);
      ++done;
    }
    return done;
  };
  return start_on_engine_thread(engine_, std::move(ex), std::move(task));
}

std::shared_ptr<http::AsyncQueue<std::uint32_t>> DecodeFetcher::start_import(boost::asio::any_io_executor ex, const Plan& plan,
                                                                              std::shared_ptr<ReceivedPull> pull) {
  const auto bs = static_cast<std::size_t>(layout_.block_size);
  const BlockHash root = plan.root;
  const std::size_t stride = block_frame_bytes(layout_.block_bytes());
  // Between steps on the engine thread: each block is entered in the prefix cache and its bytes written
  // from the receive buffer in the same task, so no step sees a half-written block. Runs of consecutive
  // new blocks go to the backend in one call (the CUDA backend stages each run through pinned memory).
  auto task = [pin = plan.pin, pull = std::move(pull), tokens = plan.tokens, hashes = plan.hashes, bs, root,
               stride](Scheduler& s, Backend& b) -> std::uint32_t {
    KvCacheManager& kv = s.kv();
    std::vector<BlockId> run;
    const char* run_start = nullptr;
    const auto flush = [&] {
      if (!run.empty()) b.write_kv_blocks(run, run_start, stride);
      run.clear();
    };
    std::uint32_t done = 0;
    for (const BlockView& f : pull->blocks) {
      const auto toks = std::span<const TokenId>(tokens).subspan(std::size_t{f.index} * bs, bs);
      const BlockHash parent = f.index == 0 ? root : hashes[f.index - 1];
      BlockId block = kv.cached_block(f.hash, toks);
      if (block != kNoBlock) {  // computed here meanwhile: keep ours
        flush();
        kv.add_to_pin(pin, block);
      } else {
        block = kv.import_block(pin, f.hash, parent, toks);
        if (block == kNoBlock) break;
        if (run.empty()) run_start = f.payload.data();
        run.push_back(block);
      }
      ++done;
    }
    flush();
    return done;
  };
  return start_on_engine_thread(engine_, std::move(ex), std::move(task));
}

}  // namespace kvfleet::pd
