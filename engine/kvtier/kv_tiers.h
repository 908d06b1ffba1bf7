// KvTiers: the KV cache's tiers below the device pool, and the one call the engine loop makes to them.
//
// Contract (docs/architecture.md, "KV cache tiers"):
// - Every tier is content-addressed by the block's chained hash (Contract 1: it already holds the model
//   name and the cache salt, so tenants never share an entry) and keeps the block's tokens, which must equal
//   the prompt's on a hit (the prefix cache's collision guard). Files also carry a compatibility hash
//   (block_file.h): a replica never reads another model's, dtype's or backend's blocks.
// - host (`host_bytes`): write-back. A block goes down when the device pool evicts it (a block that is never
//   evicted is never copied, so a replica with room to spare pays nothing) and stays when it comes back up.
//   Byte bound, LRU.
// - disk (`disk_dir`, `disk_bytes`) and shared (`shared_dir`): write-through. A block is copied out when it
//   is committed (its K/V computed), written by the I/O threads, so that it outlives the process and other
//   replicas find it while this one still holds it. Disk: byte bound, LRU, rebuilt from the directory at
//   start. Shared: no replica deletes from it. At most 256 MiB of writes wait for the I/O threads; a block
//   committed beyond that is not written.
// - Up: before each schedule(), for the first waiting sequences, the prefix is looked up block after block
//   past what the device pool holds: host, then disk, then shared. Host blocks are copied into free device
//   blocks at once and entered in the prefix cache (as a KV transfer's import is), so that admission in the
//   same schedule() finds them as ordinary device hits: cached_tokens counts them and the prefill continues
//   after them. File blocks are read and verified on the I/O threads while the sequence waits
//   (Sequence::kv_loading: admission passes over it; other sequences keep stepping); the step after they are
//   read, they land the same way. Blocks land only when the whole sequence would then fit the free blocks,
//   so a sequence that cannot be admitted yet does not churn the pool. Each landing is noted on the sequence
//   (Sequence::tier_loads: medium, blocks, from the read's or copy's start to the landing) for its trace.
// - Failure is a miss: a file that is missing, truncated, corrupt or foreign is not used (counted by reason
//   in the stats) and forgotten; a write that fails (a full disk, a deleted directory) is counted and the
//   block simply is not in that tier. No request fails because of a tier.
// - Outputs do not change: the bytes that come back are the bytes that went down, and the engine is batch
//   invariant (a sequence's logits do not depend on where its prefix's K/V came from).
// - KV events (Contract 2): blocks entering or leaving a lower tier are published with their medium. The
//   shared tier's identity (tier_identity.h, in stats().shared_tier_id) goes in the replica's config event, so
//   that routers know which replicas read the same shared blocks.
// Engine thread only (construction included), except stats(), which copies figures under a lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kvtier/file_tier.h"
#include "engine/kvtier/host_tier.h"
#include "engine/kvtier/io_pool.h"
#include "kvfleet/backend.h"
#include "kvfleet/kv_tier_config.h"
#include "kvfleet/scheduler.h"

namespace kvfleet::kvtier {

class KvTiers {
 public:
  // `compat`: the compatibility hash of this engine's blocks (block_file.h). Installs the KV cache manager's
  // block hooks; the scheduler and the backend must outlive this object. Throws std::runtime_error when a
  // tier's directory cannot be created.
  KvTiers(const KvTierConfig& config, std::uint64_t compat, Scheduler& scheduler, Backend& backend);
  ~KvTiers();  // finishes the queued writes
  KvTiers(const KvTiers&) = delete;
  KvTiers& operator=(const KvTiers&) = delete;

  // Before each Scheduler::schedule(): takes in what the I/O threads finished, then lands the lower tiers'
  // blocks of the first waiting sequences' prefixes in the device pool, or starts reading them.
  void before_schedule();

  // The figures as of the last before_schedule() or collect().
  KvTierStats stats() const;

  // `wake` is called (from an I/O thread, at most once until the next collect() or before_schedule()) when
  // I/O finished, so that an idle engine runs collect() on its thread: the KV events of blocks written while
  // it idles go out at once, not at its next step. Set once, before any I/O.
  void set_wake(std::function<void()> wake) {
    std::lock_guard lock(wake_mu_);
    wake_ = std::move(wake);
  }
  // Takes in what the I/O threads finished (their blocks' KV events, counts).
  void collect() { if (io_) take_done(); }

  // Appends what the tiers hold to a prefix cache snapshot (KV events, Contract 2): host blocks with their
  // parents, then the disk tier's files and the shared files this replica wrote or read, with parent 0.
  void add_to_snapshot(KvSnapshot& snapshot) const;

 private:
  struct Found {
    StoredBlockPtr block;
    KvMedium from;
    std::uint64_t asked_ns = 0;  // when it was asked for (unix nanoseconds): a file read's start, a host copy's
  };
  // What an I/O thread hands back to the engine thread.
  struct Done {
    bool load = false;  // else a write
    KvMedium medium = KvMedium::disk;
    StoredBlockPtr block;  // a write's block
    bool ok = false;
    SeqId seq = 0;             // a load's sequence
    std::vector<Found> found;  // a load's blocks, a chain, in order
    std::vector<std::pair<KvMedium, KvTierError>> errors;
    std::vector<std::pair<KvMedium, BlockHash>> missing;  // files gone or unusable: forget them
    double seconds = 0.0;
  };

  void on_evict(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens);
  void on_commit(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens);
  void take_done();
  void finished(Done d);  // an I/O thread's report
  void apply_write(Done& d);
  void apply_load(Done& d);
  void onload_prefix(Sequence& seq);
  void start_load(Sequence& seq, std::vector<std::pair<BlockHash, KvMedium>> files, std::size_t first);
  // Copies `blocks` (a chain continuing the device prefix `device`) into device blocks entered in the prefix
  // cache; returns how many landed (fewer when the pool runs out of free blocks).
  std::size_t land(std::span<const BlockId> device, std::span<const Found> blocks);
  // Notes on `seq` the first `landed` blocks of `run`, by medium, for its trace.
  static void note_landed(Sequence& seq, std::span<const Found> run, std::size_t landed);
  StoredBlockPtr read_block(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens);
  // Its folder and format are constant: the I/O threads read them too.
  FileTier* file_tier(KvMedium m) const { return m == KvMedium::disk ? disk_.get() : shared_.get(); }
  KvTierMediumStats& stat(KvMedium m) { return stats_.media[static_cast<std::size_t>(m)]; }

  Scheduler& scheduler_;
  KvCacheManager& kv_;
  Backend& backend_;
  std::size_t block_bytes_;  // all layers
  std::shared_ptr<BlockBuffers> buffers_;  // every StoredBlock's bytes
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<FileTier> disk_, shared_;
  std::int32_t io_threads_ = 1;
  // Blocks read from files for sequences about to be admitted: landed, or dropped, by the same before_schedule.
  std::unordered_map<BlockHash, Found> staged_;
  mutable std::mutex mu_;
  KvTierStats stats_;      // guarded by mu_
  std::vector<Done> done_;  // guarded by mu_
  std::atomic<std::uint64_t> queued_bytes_{0};  // bytes of writes submitted and not finished
  std::function<void()> wake_;
  std::mutex wake_mu_;                     // wake_ is called under it; the destructor clears it under it
  std::atomic<bool> wake_pending_{false};  // woken, and no collect() since
  std::unique_ptr<IoPool> io_;  // last: destroyed (its queue finished) before what its tasks report to
};

}  // namespace kvfleet::kvtier
