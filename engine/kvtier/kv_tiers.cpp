#include "engine/kvtier/kv_tiers.h"

#include "engine/kvtier/tier_identity.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace kvfleet {

const char* to_string(KvMedium medium) {
  switch (medium) {
    case KvMedium::device: return "device";
    case KvMedium::host: return "host";
    case KvMedium::disk: return "disk";
    case KvMedium::shared: return "shared";
  }
  return "unknown";
}

const char* to_string(KvTierError error) {
  switch (error) {
    case KvTierError::truncated: return "truncated";
    case KvTierError::corrupt: return "corrupt";
    case KvTierError::foreign: return "foreign";
    case KvTierError::io: return "io";
  }
  return "unknown";
}

}  // namespace kvfleet

namespace kvfleet::kvtier {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
std::uint64_t unix_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

// Waiting sequences looked at per step: admission takes them in order, so only the first few can be next.
constexpr std::size_t kLookahead = 4;
// Block bytes waiting for the I/O threads at most: beyond, committed blocks are not written (a burst of
// prefills faster than the files can take does not grow memory without bound).
constexpr std::uint64_t kMaxQueuedWriteBytes = 256ull << 20;

}  // namespace

KvTiers::KvTiers(const KvTierConfig& config, std::uint64_t compat, Scheduler& scheduler, Backend& backend)
    : scheduler_(scheduler),
      kv_(scheduler.kv()),
      backend_(backend),
      block_bytes_(backend.kv_block_bytes() * static_cast<std::size_t>(backend.kv_cache_shape().num_layers)),
      buffers_(BlockBuffers::make(block_bytes_)) {
  const BlockFileFormat format{compat, kv_.block_size(), block_bytes_};
  if (config.host_bytes > 0) host_ = std::make_unique<HostTier>(static_cast<std::uint64_t>(config.host_bytes));
  if (!config.disk_dir.empty()) {
    if (config.disk_bytes <= 0) throw std::invalid_argument("the disk KV tier needs a size (kv_disk_gib)");
    disk_ = std::make_unique<FileTier>(KvMedium::disk, config.disk_dir, format, static_cast<std::uint64_t>(config.disk_bytes));
  }
  if (!config.shared_dir.empty()) {
    shared_ = std::make_unique<FileTier>(KvMedium::shared, config.shared_dir, format, 0,
                                         static_cast<std::size_t>(config.shared_index_blocks));
    stats_.shared_tier_id = folder_identity(shared_->folder());
  }
  io_threads_ = std::max(1, config.io_threads);
  if (disk_ || shared_) io_ = std::make_unique<IoPool>(io_threads_);
  stats_.enabled = true;
  if (disk_) {
    stat(KvMedium::disk).blocks = disk_->blocks();
    stat(KvMedium::disk).bytes = disk_->bytes();
  }
  KvBlockHooks hooks;
  if (host_) hooks.on_evict = [this](BlockId b, BlockHash h, BlockHash p, std::span<const TokenId> t) { on_evict(b, h, p, t); };
  if (io_) hooks.on_commit = [this](BlockId b, BlockHash h, BlockHash p, std::span<const TokenId> t) { on_commit(b, h, p, t); };
  kv_.set_block_hooks(std::move(hooks));
}

KvTiers::~KvTiers() {
  {
    std::lock_guard lock(wake_mu_);
    wake_ = nullptr;  // the writes finished below report to nobody
  }
  kv_.set_block_hooks({});
  io_.reset();  // every queued write finishes (renamed into place or not at all)
}

StoredBlockPtr KvTiers::read_block(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens) {
  auto stored = std::make_shared<StoredBlock>();
  stored->hash = hash;
  stored->parent = parent;
  stored->tokens.assign(tokens.begin(), tokens.end());
  stored->bytes = buffers_->take();
  const std::int32_t ids[] = {block};
  backend_.read_kv_blocks(ids, stored->bytes.data());
  return stored;
}

// A cached block is about to be overwritten: its K/V is still intact, so this is the last chance to keep it.
void KvTiers::on_evict(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens) {
  if (host_->find(hash, tokens)) return;  // came up from the host and is still there: nothing to copy
  const auto t0 = Clock::now();
  std::vector<BlockHash> dropped;
  if (!host_->insert(read_block(block, hash, parent, tokens), dropped)) return;
  const auto events = kv_.events();
  if (!dropped.empty()) events->publish(KvEvent::Type::removed, dropped, 0, -1, KvMedium::host);
  events->publish(KvEvent::Type::stored, {hash}, parent, -1, KvMedium::host);
  std::lock_guard lock(mu_);
  auto& s = stat(KvMedium::host);
  s.offload_bytes += block_bytes_;
  s.offload_seconds += seconds_since(t0);
  s.blocks = host_->size();
  s.bytes = host_->bytes();
}

// A block was computed and committed: the file tiers get a copy (write-through), written off the engine thread.
void KvTiers::on_commit(BlockId block, BlockHash hash, BlockHash parent, std::span<const TokenId> tokens) {
  StoredBlockPtr copy;
  for (FileTier* tier : {disk_.get(), shared_.get()}) {
    std::vector<BlockHash> doomed;
    if (tier == nullptr || !tier->want_write(hash, doomed)) continue;
    if (queued_bytes_.load() + block_bytes_ > kMaxQueuedWriteBytes) {  // the files cannot keep up: skip this one
      tier->forget(hash);
      continue;
    }
    queued_bytes_ += block_bytes_;
    if (!copy) copy = read_block(block, hash, parent, tokens);
    const KvMedium m = tier->medium();
    const std::filesystem::path folder = tier->folder();
    const BlockFileFormat format = tier->format();
    io_->submit([this, m, folder, format, copy, doomed] {
      std::error_code ec;
      for (const BlockHash h : doomed) std::filesystem::remove(block_file(folder, h), ec);
      const auto t0 = Clock::now();
      Done d;
      d.medium = m;
      d.block = copy;
      // Shared: another replica may have written it already (same hash, same bytes).
      d.ok = m == KvMedium::shared && std::filesystem::exists(block_file(folder, copy->hash), ec);
      if (!d.ok) {
        std::string error = write_block_file(folder, format, *copy);
        if (!error.empty() && !std::filesystem::is_directory(folder, ec)) {  // the directory was deleted: once more
          std::filesystem::create_directories(folder, ec);
          error = write_block_file(folder, format, *copy);
        }
        d.ok = error.empty();
        if (!d.ok) d.errors.emplace_back(m, KvTierError::io);
      }
      d.seconds = seconds_since(t0);
      queued_bytes_ -= block_bytes_;
      finished(std::move(d));
    });
    if (!doomed.empty()) kv_.events()->publish(KvEvent::Type::removed, doomed, 0, -1, m);
  }
}

void KvTiers::finished(Done d) {
  {
    std::lock_guard lock(mu_);
    done_.push_back(std::move(d));
  }
  if (wake_pending_.exchange(true)) return;
  std::lock_guard lock(wake_mu_);
  if (wake_) wake_();
}

void KvTiers::take_done() {
  wake_pending_ = false;  // a report from now on wakes the engine again
  std::vector<Done> done;
  {
    std::lock_guard lock(mu_);
    done.swap(done_);
  }
  for (Done& d : done) d.load ? apply_load(d) : apply_write(d);
  std::lock_guard lock(mu_);
  for (const Done& d : done)
    for (const auto& [m, e] : d.errors) ++stat(m).errors[static_cast<std::size_t>(e)];
  for (FileTier* tier : {disk_.get(), shared_.get()}) {
    if (tier == nullptr) continue;
    stat(tier->medium()).blocks = tier->blocks();
    stat(tier->medium()).bytes = tier->bytes();
  }
}

void KvTiers::apply_write(Done& d) {
  file_tier(d.medium)->wrote(d.block->hash, d.ok);
  if (!d.ok) return;
  kv_.events()->publish(KvEvent::Type::stored, {d.block->hash}, d.block->parent, -1, d.medium);
  std::lock_guard lock(mu_);
  stat(d.medium).offload_bytes += block_bytes_;
  stat(d.medium).offload_seconds += d.seconds;
}

void KvTiers::apply_load(Done& d) {
  for (const auto& [m, hash] : d.missing) file_tier(m)->forget(hash);
  for (Found& f : d.found) staged_.emplace(f.block->hash, f);
  for (Sequence* seq : scheduler_.waiting())
    if (seq->id == d.seq) seq->kv_loading = false;
  std::lock_guard lock(mu_);
  for (const Found& f : d.found) stat(f.from).onload_seconds += d.seconds / static_cast<double>(d.found.size());
}

void KvTiers::before_schedule() {
  if (io_) take_done();
  std::size_t looked = 0;
  for (Sequence* seq : scheduler_.waiting()) {
    if (looked++ == kLookahead) break;
    if (!seq->kv_loading) onload_prefix(*seq);
  }
  staged_.clear();
}

void KvTiers::onload_prefix(Sequence& seq) {
  const std::vector<BlockId> device = kv_.find_cached_prefix(seq);  // extends seq.block_hashes
  const std::uint64_t now_ns = unix_ns();
  const auto bs = static_cast<std::size_t>(kv_.block_size());
  const auto max_blocks = static_cast<std::size_t>((seq.num_tokens() - 1) / kv_.block_size());
  const std::span<const TokenId> tokens(seq.tokens);
  std::vector<Found> run;                                 // in memory: lands now
  std::vector<std::pair<BlockHash, KvMedium>> files;  // after the run: read on the I/O threads first
  for (std::size_t i = device.size(); i < max_blocks; ++i) {
    const BlockHash hash = seq.block_hashes[i];
    const auto want = tokens.subspan(i * bs, bs);
    if (files.empty()) {
      if (StoredBlockPtr b = host_ ? host_->find(hash, want) : nullptr) {
        run.push_back({std::move(b), KvMedium::host, now_ns});
        continue;
      }
      if (const auto it = staged_.find(hash); it != staged_.end() && it->second.block->holds(want)) {
        run.push_back(it->second);
        continue;
      }
    }
    if (disk_ && disk_->may_hold(hash)) {
      files.emplace_back(hash, KvMedium::disk);
    } else if (shared_ && shared_->may_hold(hash)) {
      files.emplace_back(hash, KvMedium::shared);
    } else {
      break;
    }
  }
  if (run.empty() && files.empty()) return;
  // Only what admission could then take whole: the sequence's blocks beyond its device prefix.
  const auto free_in_prefix = std::count_if(device.begin(), device.end(), [&](BlockId b) { return kv_.pool().is_free(b); });
  const std::int32_t need = kv_.blocks_for(seq.num_tokens()) - static_cast<std::int32_t>(device.size());
  if (need > kv_.pool().num_free() - static_cast<std::int32_t>(free_in_prefix)) return;
  if (!files.empty()) start_load(seq, std::move(files), device.size() + run.size());
  if (run.empty()) return;
  const auto t0 = Clock::now();
  const std::size_t landed = land(device, run);
  const double seconds = seconds_since(t0);
  note_landed(seq, run, landed);
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < landed; ++i) {
    auto& s = stat(run[i].from);
    s.hit_tokens += bs;
    s.onload_bytes += block_bytes_;
    s.onload_seconds += seconds / static_cast<double>(landed);
  }
}

// Reads the files of `files` (a chain starting at block `first` of seq) on the I/O threads, ahead of their
// writes, in one contiguous piece per thread; the sequence waits until all are in. The chain stops at the first
// file missing or unusable: the sequence computes the rest.
void KvTiers::start_load(Sequence& seq, std::vector<std::pair<BlockHash, KvMedium>> files, std::size_t first) {
  struct Load {
    SeqId seq = 0;
    std::vector<std::pair<BlockHash, KvMedium>> files;
    std::vector<TokenId> want;
    std::vector<BlockFileRead> reads;
    std::atomic<std::size_t> pieces_left{0};
    Clock::time_point start;
    std::uint64_t start_ns = 0;
  };
  const auto bs = static_cast<std::size_t>(kv_.block_size());
  auto load = std::make_shared<Load>();
  load->seq = seq.id;
  load->want.assign(seq.tokens.begin() + static_cast<std::ptrdiff_t>(first * bs),
                    seq.tokens.begin() + static_cast<std::ptrdiff_t>((first + files.size()) * bs));
  load->files = std::move(files);
  load->reads.resize(load->files.size());
  load->start = Clock::now();
  load->start_ns = unix_ns();
  seq.kv_loading = true;
  const std::size_t n = load->files.size();
  const std::size_t pieces = std::min(n, static_cast<std::size_t>(io_threads_));
  load->pieces_left = pieces;
  for (std::size_t p = 0; p < pieces; ++p) {
    const std::size_t begin = n * p / pieces, end = n * (p + 1) / pieces;
    io_->submit_first([this, load, begin, end, bs] {
      for (std::size_t i = begin; i < end; ++i) {
        const auto [hash, m] = load->files[i];
        const FileTier* tier = file_tier(m);
        BlockFileRead r = read_block_file(tier->folder(), tier->format(), hash, buffers_.get());
        // A 64-bit collision: another prompt's block.
        if (r.block && !r.block->holds(std::span<const TokenId>(load->want).subspan(i * bs, bs))) r.block = nullptr;
        load->reads[i] = std::move(r);
      }
      if (--load->pieces_left > 0) return;  // the last piece to finish reports the whole chain
      Done d;
      d.load = true;
      d.seq = load->seq;
      for (std::size_t i = 0; i < load->files.size(); ++i) {
        const auto [hash, m] = load->files[i];
        BlockFileRead& r = load->reads[i];
        if (!r.block) {
          if (r.error) d.errors.emplace_back(m, *r.error);
          d.missing.emplace_back(m, hash);
          break;
        }
        d.found.push_back({std::move(r.block), m, load->start_ns});
      }
      d.seconds = seconds_since(load->start);
      finished(std::move(d));
    });
  }
}

std::size_t KvTiers::land(std::span<const BlockId> device, std::span<const Found> blocks) {
  // The device prefix is held while the new blocks are taken, so that taking them cannot evict it.
  const auto pin = kv_.pin(device);
  const std::size_t first = device.size();
  std::size_t landed = 0;
  for (const Found& f : blocks) {
    const BlockId block = kv_.reserve_block(pin);
    if (block == kNoBlock) break;
    const std::int32_t ids[] = {block};
    backend_.write_kv_blocks(ids, f.block->bytes.data());
    // A chain's first block names the namespace root, as commit() does in its events.
    const BlockHash parent = first + landed == 0 ? kv_.cache().root() : f.block->parent;
    if (!kv_.enter_block(block, f.block->hash, parent, f.block->tokens)) break;
    ++landed;
  }
  kv_.unpin(pin);
  return landed;
}

void KvTiers::note_landed(Sequence& seq, std::span<const Found> run, std::size_t landed) {
  const std::uint64_t now = unix_ns();
  for (std::size_t i = 0; i < landed; ++i) {
    const Found& f = run[i];
    if (seq.tier_loads.empty() || seq.tier_loads.back().medium != f.from || seq.tier_loads.back().end_ns != now)
      seq.tier_loads.push_back({f.from, 0, f.asked_ns, now});
    KvTierLoad& l = seq.tier_loads.back();
    l.blocks += 1;
    l.start_ns = std::min(l.start_ns, f.asked_ns);
  }
}

void KvTiers::add_to_snapshot(KvSnapshot& snapshot) const {
  if (host_)
    for (const auto& [hash, parent] : host_->held()) snapshot.blocks.push_back({hash, parent, KvMedium::host});
  for (const FileTier* tier : {disk_.get(), shared_.get()}) {
    if (!tier) continue;
    for (const BlockHash hash : tier->held()) snapshot.blocks.push_back({hash, 0, tier->medium()});
  }
}

KvTierStats KvTiers::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace kvfleet::kvtier
