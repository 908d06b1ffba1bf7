// The two Locksteps (engine/runtime/lockstep.h): a plain engine's, and an expert-parallel rank's, which votes
// with the group every turn so that the ranks step, idle and stop together.
#include "engine/runtime/lockstep.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvfleet/communicator.h"

namespace kvfleet {

namespace {

class SoloLockstep final : public Lockstep {
 public:
  bool wait(std::unique_lock<std::mutex>& lock, std::condition_variable& wake, const std::function<bool()>& ready,
            const bool& stop) override {
    wake.wait(lock, ready);
    return !stop;
  }
  Turn turn(bool has_work, bool /*stopping*/) override { return has_work ? Turn::step : Turn::idle; }
  bool forward_when_idle() const override { return false; }
  void failed(std::string why) override { failure_ = std::move(why); }
  const std::string& failure() const override { return failure_; }
  void wake_peers() override {}
  bool leave() override { return false; }

 private:
  std::string failure_;
};

// Every turn each rank votes {has work, stopping, leaving}: all stop together when one stops, leave together
// when all asked to and none has work, idle together when none has work, and otherwise step together.
class GroupLockstep final : public Lockstep {
 public:
  GroupLockstep(Communicator& comm, std::mutex& mu, std::condition_variable& wake) : comm_(comm), mu_(mu) {
    if (comm_.can_ring()) {
      comm_.set_ring_handler([this, &wake] {
        {
          std::lock_guard lock(mu_);
          peer_rang_ = true;
        }
        wake.notify_one();
      });
    }
  }
  ~GroupLockstep() override { comm_.set_ring_handler(nullptr); }

  bool wait(std::unique_lock<std::mutex>& lock, std::condition_variable& wake, const std::function<bool()>& ready,
            const bool& stop) override {
    if (broken()) {
      wake.wait(lock, [&] { return ready() || leaving_; });
    } else if (group_idle_ && comm_.can_ring()) {
      // The whole group is idle: sleep until this rank has something or another rank rang. A ring for a vote
      // this rank has already taken (a ticket that came while it was on its way to that vote) is not a reason
      // to vote again: rank 0 would not come, and the group would wait forever.
      wake.wait(lock, [&] { return ready() || leave_unannounced_ || (peer_rang_ && comm_.vote_requested()); });
      ring_before_vote_ = ready() || leave_unannounced_;  // this rank's news: the others must come to the vote
      leave_unannounced_ = false;
    } else {
      // A vote that cannot be rung about (Gloo: other processes) is polled: every millisecond while the group
      // works, backing off to 8 ms while it stays idle (at most that much latency for a request that arrives
      // at an idle group).
      wake.wait_for(lock, std::chrono::milliseconds(group_idle_ ? idle_poll_ms_ : 1), ready);
      idle_poll_ms_ = group_idle_ ? std::min(2 * idle_poll_ms_, 8) : 1;
    }
    peer_rang_ = false;
    return !(broken() && (stop || leaving_));  // a broken group has nobody to wait for
  }

  Turn turn(bool has_work, bool stopping) override {
    if (broken()) return Turn::broken;
    if (std::exchange(ring_before_vote_, false)) comm_.ring();
    bool leaving = false;
    {
      std::lock_guard lock(mu_);
      leaving = leaving_;
    }
    const std::int32_t mine[3] = {has_work ? 1 : 0, stopping ? 1 : 0, leaving ? 1 : 0};
    const auto n = static_cast<std::size_t>(comm_.size());
    std::vector<std::int32_t> votes(3 * n);
    comm_.all_gather(mine, sizeof mine, votes.data());
    bool any_work = false, all_leave = true;
    for (std::size_t r = 0; r < n; ++r) {
      if (votes[3 * r + 1]) return Turn::exit;
      any_work = any_work || votes[3 * r];
      all_leave = all_leave && votes[3 * r + 2];
    }
    if (all_leave && !any_work) return Turn::exit;
    group_idle_ = !any_work;
    if (has_work) return Turn::step;
    return any_work ? Turn::serve_peers : Turn::idle;
  }

  bool forward_when_idle() const override { return !broken(); }
  void failed(std::string why) override { failure_ = std::move(why); }
  const std::string& failure() const override { return failure_; }
  void wake_peers() override { comm_.ring(); }

  bool leave() override {
    {
      std::lock_guard lock(mu_);
      leaving_ = true;
      leave_unannounced_ = true;
    }
    comm_.ring();
    return true;
  }

 private:
  bool broken() const { return !failure_.empty(); }

  Communicator& comm_;
  std::mutex& mu_;
  // Guarded by mu_ (set from other threads).
  bool peer_rang_ = false;          // another rank rang: it has work, or is stopping
  bool leaving_ = false;            // leave() was called: stop once every rank asked to and none has work
  bool leave_unannounced_ = false;  // leaving_ was set and the idle group has not been told yet
  // Engine thread only.
  bool ring_before_vote_ = false;  // this rank woke with news while the group slept: ring the others first
  bool group_idle_ = false;        // the last vote found no work on any rank
  int idle_poll_ms_ = 1;           // without ring(): the idle group's vote interval
  std::string failure_;            // a collective failed; why
};

}  // namespace

std::unique_ptr<Lockstep> make_lockstep(Communicator* ep, std::mutex& mu, std::condition_variable& wake) {
  if (!ep) return std::make_unique<SoloLockstep>();
  return std::make_unique<GroupLockstep>(*ep, mu, wake);
}

}  // namespace kvfleet
