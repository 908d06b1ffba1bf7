#include "router/tier_index.h"

#include <algorithm>
#include <bit>

namespace kvfleet::router {

const char* to_string(Medium m) {
  switch (m) {
    case Medium::device: return "device";
    case Medium::host: return "host";
    case Medium::disk: return "disk";
    case Medium::shared: return "shared";
  }
  return "device";
}

std::optional<Medium> medium_from_string(std::string_view s) {
  for (std::size_t i = 0; i < kNumMedia; ++i)
    if (s == to_string(static_cast<Medium>(i))) return static_cast<Medium>(i);
  return std::nullopt;
}

std::uint32_t TierMatch::reachable(ReplicaId r) const {
  std::uint32_t n = 0;
  for (std::size_t m = 0; m < kNumMedia; ++m) n += r < kMaxReplicas ? blocks[r][m] : 0;
  return n;
}

bool TierIndex::set_shared(ReplicaId r, std::uint64_t shared_id) {
  if (r >= kMaxReplicas) return false;
  if (const auto g = group_of_[r]) members_[*g] &= ~(ReplicaMask{1} << r);
  group_of_[r].reset();
  if (shared_id == 0) return true;
  auto it = std::find(group_ids_.begin(), group_ids_.end(), shared_id);
  if (it == group_ids_.end()) {
    if (group_ids_.size() >= members_.size()) return false;
    group_ids_.push_back(shared_id);
    it = group_ids_.end() - 1;
  }
  const auto g = static_cast<std::uint32_t>(it - group_ids_.begin());
  group_of_[r] = g;
  members_[g] |= ReplicaMask{1} << r;
  return true;
}

std::uint64_t TierIndex::shared_id(ReplicaId r) const {
  return r < kMaxReplicas && group_of_[r] ? group_ids_[*group_of_[r]] : 0;
}

TierIndex::Entry& TierIndex::entry(BlockHash h, Tick now) {
  Entry& e = entries_[h];
  e.stored = now;
  return e;
}

void TierIndex::set_bit(Entry& e, Medium m, ReplicaId r) {
  ReplicaMask& f = field(e, m);
  const ReplicaMask bit = ReplicaMask{1} << r;
  counts_[r][m == Medium::disk] += (f & bit) == 0;
  f |= bit;
}

void TierIndex::clear_bit(Entry& e, Medium m, ReplicaId r) {
  ReplicaMask& f = field(e, m);
  const ReplicaMask bit = ReplicaMask{1} << r;
  counts_[r][m == Medium::disk] -= (f & bit) != 0;
  f &= ~bit;
}

void TierIndex::uncount(const Entry& e) {
  for (ReplicaMask a = e.host; a != 0; a &= a - 1) counts_[static_cast<std::size_t>(std::countr_zero(a))][0] -= 1;
  for (ReplicaMask a = e.disk; a != 0; a &= a - 1) counts_[static_cast<std::size_t>(std::countr_zero(a))][1] -= 1;
  for (std::uint64_t g = e.groups; g != 0; g &= g - 1) group_counts_[static_cast<std::size_t>(std::countr_zero(g))] -= 1;
}

void TierIndex::stored(ReplicaId r, Medium m, std::span<const BlockHash> hashes, Tick now) {
  if (r >= kMaxReplicas || (m != Medium::host && m != Medium::disk)) return;
  for (const BlockHash h : hashes) set_bit(entry(h, now), m, r);
  maybe_evict();
}

void TierIndex::removed(ReplicaId r, Medium m, std::span<const BlockHash> hashes) {
  if (r >= kMaxReplicas || (m != Medium::host && m != Medium::disk)) return;
  for (const BlockHash h : hashes) {
    const auto it = entries_.find(h);
    if (it == entries_.end()) continue;
    clear_bit(it->second, m, r);
    if (it->second.empty()) entries_.erase(it);
  }
}

void TierIndex::stored_shared(ReplicaId r, std::span<const BlockHash> hashes, Tick now) {
  if (r >= kMaxReplicas || !group_of_[r]) return;
  const std::uint64_t bit = std::uint64_t{1} << *group_of_[r];
  for (const BlockHash h : hashes) {
    Entry& e = entry(h, now);
    group_counts_[*group_of_[r]] += (e.groups & bit) == 0;
    e.groups |= bit;
  }
  maybe_evict();
}

void TierIndex::clear_replica(ReplicaId r) {
  if (r >= kMaxReplicas) return;
  if (counts_[r][0] == 0 && counts_[r][1] == 0) return;
  for (auto it = entries_.begin(); it != entries_.end();) {
    clear_bit(it->second, Medium::host, r);
    clear_bit(it->second, Medium::disk, r);
    it = it->second.empty() ? entries_.erase(it) : std::next(it);
  }
}

void TierIndex::remove_replica(ReplicaId r) {
  clear_replica(r);
  set_shared(r, 0);
}

// Evicts the oldest entries by their stored tick, exactly down to evict_to * max_blocks.
void TierIndex::maybe_evict() {
  if (config_.max_blocks == 0 || entries_.size() <= config_.max_blocks) return;
  const auto target = static_cast<std::size_t>(static_cast<double>(config_.max_blocks) * config_.evict_to);
  std::vector<std::pair<Tick, BlockHash>> by_age;
  by_age.reserve(entries_.size());
  for (const auto& [h, e] : entries_) by_age.emplace_back(e.stored, h);
  const std::size_t drop = entries_.size() - target;
  std::nth_element(by_age.begin(), by_age.begin() + static_cast<std::ptrdiff_t>(drop), by_age.end());
  for (std::size_t i = 0; i < drop; ++i) {
    const auto it = entries_.find(by_age[i].second);
    uncount(it->second);
    entries_.erase(it);
  }
  evicted_ += drop;
}

ReplicaMask TierIndex::shared_holders(std::uint64_t groups) const {
  ReplicaMask out = 0;
  for (; groups != 0; groups &= groups - 1) out |= members_[static_cast<std::size_t>(std::countr_zero(groups))];
  return out;
}

TierMatch TierIndex::match(std::span<const BlockHash> hashes, const MatchResult& device) const {
  TierMatch out;
  ReplicaMask alive = 0;      // replicas whose walk has not missed yet: those with something to walk
  ReplicaMask on_device = 0;  // alive replicas still inside their device prefix
  for (ReplicaId r = 0; r < kMaxReplicas; ++r) {
    out.blocks[r][0] = device.blocks[r];
    const ReplicaMask bit = ReplicaMask{1} << r;
    if (device.blocks[r] > 0) on_device |= bit;
    if (counts_[r][0] + counts_[r][1] > 0 || (group_of_[r] && group_counts_[*group_of_[r]] > 0)) alive |= bit;
  }
  if (entries_.empty()) return out;
  alive |= on_device;
  for (std::size_t i = 0; i < hashes.size() && alive != 0; ++i) {
    for (ReplicaMask d = on_device; d != 0; d &= d - 1) {  // device prefixes that end here
      const auto r = static_cast<ReplicaId>(std::countr_zero(d));
      if (device.blocks[r] <= i) on_device &= ~(ReplicaMask{1} << r);
    }
    const ReplicaMask past = alive & ~on_device;  // only these need the tiers (device blocks count above)
    if (past == 0) continue;
    const auto it = entries_.find(hashes[i]);
    if (it == entries_.end()) {
      alive &= on_device;
      continue;
    }
    const Entry& e = it->second;
    const ReplicaMask held = past & (e.host | e.disk | shared_holders(e.groups));
    alive = on_device | held;
    for (ReplicaMask a = held; a != 0; a &= a - 1) {
      const auto r = static_cast<ReplicaId>(std::countr_zero(a));
      const ReplicaMask bit = ReplicaMask{1} << r;
      const Medium m = (e.host & bit) ? Medium::host : (e.disk & bit) ? Medium::disk : Medium::shared;
      out.blocks[r][static_cast<std::size_t>(m)] += 1;
    }
  }
  return out;
}

std::size_t TierIndex::count(ReplicaId r, Medium m) const {
  if (r >= kMaxReplicas) return 0;
  if (m == Medium::shared) return group_of_[r] ? group_counts_[*group_of_[r]] : 0;
  return m == Medium::device ? 0 : counts_[r][m == Medium::disk];
}

}  // namespace kvfleet::router
