// Lockstep: how the engine thread waits between turns and whether a turn steps. The engine loop reads
// wait -> take the inbox -> turn -> step; what a group of expert-parallel ranks must agree on (voting,
// empty forwards, waking each other, leaving together) lives behind this interface, in engine/ep/lockstep.cpp.
//
// - Alone (no group): the thread sleeps until there is news, and steps when the scheduler has work.
// - Expert-parallel rank: every turn the ranks vote (has work, stopping, leaving) over the communicator;
//   they step together, a rank without work serving the others' tokens with an empty forward, idle
//   together, and stop together. A collective that fails breaks the group for good: from then on every
//   turn is Turn::broken and the engine fails whatever it holds.
//
// Thread-safety: wait() runs on the engine thread under the engine's inbox lock; turn(), failed() and
// failure() on the engine thread outside it; wake_peers() and leave() on any thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace kvfleet {

class Communicator;

enum class Turn {
  step,         // this rank schedules, runs a forward and samples
  serve_peers,  // no work here, but other ranks step: an empty forward (this rank's experts serve theirs)
  idle,         // nobody has work
  broken,       // the group is broken: fail everything this engine holds
  exit,         // the loop ends
};

class Lockstep {
 public:
  virtual ~Lockstep() = default;
  // Sleeps on `wake` (under `lock`, the engine's inbox lock) until `ready()` or this lockstep's own news.
  // `stop` is the engine's stop flag, read under the lock. False: the loop ends now, without a turn.
  virtual bool wait(std::unique_lock<std::mutex>& lock, std::condition_variable& wake,
                    const std::function<bool()>& ready, const bool& stop) = 0;
  // After the inbox was applied: what this turn does. May throw CommunicatorError (then call failed()).
  virtual Turn turn(bool has_work, bool stopping) = 0;
  // Whether a step that found nothing to run must still run an empty forward (the group's exchanges).
  virtual bool forward_when_idle() const = 0;
  // A collective failed: the group is broken from now on.
  virtual void failed(std::string why) = 0;
  virtual const std::string& failure() const = 0;
  // The inbox changed: other ranks may have to come to a vote.
  virtual void wake_peers() = 0;
  // Ask to leave the group (Engine::leave_group); false when there is no group to leave.
  virtual bool leave() = 0;
};

// The lockstep of a plain engine (ep == nullptr) or of rank ep->rank() of an expert-parallel group. `mu` and
// `wake` are the engine's inbox lock and its condition variable: a ring from another rank sets news under
// `mu` and notifies `wake`.
std::unique_ptr<Lockstep> make_lockstep(Communicator* ep, std::mutex& mu, std::condition_variable& wake);

}  // namespace kvfleet
