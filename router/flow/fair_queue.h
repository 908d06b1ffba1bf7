// The router's waiting room: requests waiting for a forwarding slot, ordered by priority band and shared
// fairly between tenants.
//
// Order of service (pop):
//   - Bands in strict order: a lower `priority` first (vLLM's convention, default 0); every waiter of a
//     band is served before any waiter of a later band.
//   - Within a band, tenants by weight (stride scheduling): each tenant carries a virtual time `pass`; the
//     waiting tenant with the smallest pass is served next and its pass grows by 1/weight. A tenant that
//     starts waiting again enters at the band's current virtual time, so time spent idle banks no credit.
//     Ties go to the tenant that has waited longest. Within one tenant and band: first come, first served.
// Bound (push):
//   - At most `capacity` waiters in all; while there is room, anyone may wait. A tenant's share of the room
//     is capacity * its weight / the sum of the weights of the tenants waiting (itself counted). When the
//     room is full, a newcomer whose tenant already holds its share is refused, and a newcomer within its
//     share takes the place of the newest waiter of the tenant furthest over its share (that waiter is
//     handed back: the caller answers it 429). So a tenant that floods is refused and pushed out; a tenant
//     within its share is not.
// Not thread-safe: the gateway calls it under its mutex.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

namespace kvfleet::router {

template <typename T>
class FairQueue {
 public:
  struct Pushed {
    bool admitted = false;
    std::optional<T> evicted;  // admitted in its place: the caller refuses this one
  };

  explicit FairQueue(std::size_t capacity = 4096) : capacity_(capacity) {}

  void set_capacity(std::size_t capacity) { capacity_ = capacity; }
  // Weights of named tenants (others weigh `default_weight`); a weight must be > 0.
  void set_weights(std::unordered_map<std::string, double> weights, double default_weight = 1.0) {
    weights_ = std::move(weights);
    default_weight_ = default_weight;
    weight_sum_ = 0;  // of the tenants waiting, at their new weights
    for (const auto& [tenant, n] : waiting_) weight_sum_ += weight(tenant);
  }
  double weight(const std::string& tenant) const {
    auto it = weights_.find(tenant);
    return it == weights_.end() ? default_weight_ : it->second;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::size_t waiting(const std::string& tenant) const {
    auto it = waiting_.find(tenant);
    return it == waiting_.end() ? 0 : it->second;
  }
  // The tenant's share of the room if it waited now (at least 1).
  std::size_t share(const std::string& tenant) const {
    double sum = weight_sum_ + (waiting(tenant) == 0 ? weight(tenant) : 0.0);
    auto s = static_cast<std::size_t>(std::floor(static_cast<double>(capacity_) * weight(tenant) / sum));
    return s == 0 ? 1 : s;
  }

  Pushed push(const std::string& tenant, std::int64_t priority, T item) {
    Pushed out;
    if (capacity_ == 0) return out;
    if (size_ >= capacity_) {
      if (waiting(tenant) >= share(tenant)) return out;
      std::optional<T> victim = evict_most_over_share(tenant);
      if (!victim) return out;
      out.evicted = std::move(victim);
    }
    Band& band = bands_[priority];
    auto [it, fresh] = band.tenants.try_emplace(tenant);
    Lane& lane = it->second;
    if (lane.items.empty()) {
      lane.pass = std::max(lane.pass, band.vtime);
      lane.since = ++clock_;
    }
    lane.items.push_back(std::move(item));
    count_in(tenant);
    out.admitted = true;
    return out;
  }

  // A grant that did not wait (a slot was free): the tenant pays for it as for one served from the room.
  void charge(const std::string& tenant, std::int64_t priority) {
    Band& band = bands_[priority];
    Lane& lane = band.tenants[tenant];
    lane.pass = std::max(lane.pass, band.vtime) + 1.0 / weight(tenant);
    prune(band);
    if (bands_.size() > 64)  // bands nobody waits in carry only history: bounded
      std::erase_if(bands_, [](const auto& b) {
        for (const auto& [t, l] : b.second.tenants)
          if (!l.items.empty()) return false;
        return true;
      });
  }

  // The next waiter to serve, with its tenant; nullopt when none waits. With `eligible`, only waiters of
  // tenants it accepts are considered (the others keep their places).
  template <typename Eligible>
  std::optional<std::pair<std::string, T>> pop(const Eligible& eligible) {
    for (auto bit = bands_.begin(); bit != bands_.end();) {
      Band& band = bit->second;
      auto best = band.tenants.end();
      bool any = false;
      for (auto it = band.tenants.begin(); it != band.tenants.end(); ++it) {
        if (it->second.items.empty()) continue;
        any = true;
        if (!eligible(it->first)) continue;
        if (best == band.tenants.end() || it->second.pass < best->second.pass ||
            (it->second.pass == best->second.pass && it->second.since < best->second.since))
          best = it;
      }
      if (best == band.tenants.end()) {
        bit = any ? std::next(bit) : bands_.erase(bit);
        continue;
      }
      Lane& lane = best->second;
      std::pair<std::string, T> out{best->first, std::move(lane.items.front())};
      lane.items.pop_front();
      band.vtime = lane.pass;
      lane.pass += 1.0 / weight(best->first);
      if (!lane.items.empty()) lane.since = ++clock_;
      count_out(out.first);
      prune(band);
      return out;
    }
    return std::nullopt;
  }
  std::optional<std::pair<std::string, T>> pop() {
    return pop([](const std::string&) { return true; });
  }

  // Takes a waiter out (it timed out or its client left); false if it was not waiting.
  bool erase(const std::string& tenant, std::int64_t priority, const T& item) {
    auto bit = bands_.find(priority);
    if (bit == bands_.end()) return false;
    auto lit = bit->second.tenants.find(tenant);
    if (lit == bit->second.tenants.end()) return false;
    auto& items = lit->second.items;
    for (auto it = items.begin(); it != items.end(); ++it)
      if (*it == item) {
        items.erase(it);
        count_out(tenant);
        return true;
      }
    return false;
  }

 private:
  struct Lane {
    std::deque<T> items;
    double pass = 0;          // virtual time of the tenant's next grant
    std::uint64_t since = 0;  // when its current head started waiting (ties)
  };
  struct Band {
    std::map<std::string, Lane> tenants;
    double vtime = 0;  // the pass of the last grant
  };

  void count_in(const std::string& tenant) {
    if (waiting_[tenant]++ == 0) weight_sum_ += weight(tenant);
    ++size_;
  }
  void count_out(const std::string& tenant) {
    auto it = waiting_.find(tenant);
    if (--it->second == 0) {
      weight_sum_ -= weight(tenant);
      waiting_.erase(it);
      if (waiting_.empty()) weight_sum_ = 0;  // no drift from adding and taking doubles
    }
    --size_;
  }
  // Empty lanes whose pass the band's clock has overtaken carry nothing a fresh lane would not.
  void prune(Band& band) {
    if (band.tenants.size() < 64) return;
    std::erase_if(band.tenants, [&](const auto& kv) { return kv.second.items.empty() && kv.second.pass <= band.vtime; });
  }

  // The newest waiter (latest band, back of its lane) of the tenant furthest over its share, not `newcomer`.
  std::optional<T> evict_most_over_share(const std::string& newcomer) {
    std::string worst;
    double worst_over = 0;
    for (const auto& [tenant, n] : waiting_) {
      if (tenant == newcomer) continue;
      double fair = static_cast<double>(capacity_) * weight(tenant) / (weight_sum_ + weight(newcomer));
      double over = static_cast<double>(n) - fair;
      if (over > worst_over) worst_over = over, worst = tenant;
    }
    if (worst.empty()) return std::nullopt;
    for (auto bit = bands_.rbegin(); bit != bands_.rend(); ++bit) {
      auto lit = bit->second.tenants.find(worst);
      if (lit == bit->second.tenants.end() || lit->second.items.empty()) continue;
      T item = std::move(lit->second.items.back());
      lit->second.items.pop_back();
      count_out(worst);
      return item;
    }
    return std::nullopt;
  }

  std::size_t capacity_;
  std::unordered_map<std::string, double> weights_;
  double default_weight_ = 1.0;
  std::map<std::int64_t, Band> bands_;
  std::unordered_map<std::string, std::size_t> waiting_;
  double weight_sum_ = 0;  // of the tenants waiting
  std::size_t size_ = 0;
  std::uint64_t clock_ = 0;
};

}  // namespace kvfleet::router
