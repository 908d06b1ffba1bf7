// The engine thread's outputs on their way to the coroutines that send them, with one wake-up per job per
// engine step instead of one per token per choice.
//
// A job (one API request, its n x prompts choices) owns an OutputInbox. The engine's per-request callback
// only appends the output to the job's inbox and, the first time since the job last took its outputs, marks
// the inbox for a wake-up. At the end of each engine step (Engine::set_outputs_done) OutputRelay::flush()
// posts one handler to the io threads, which wakes every marked inbox: the engine thread pays one
// cross-thread post per step, each job's coroutine resumes once per step with everything it has (every
// choice's new tokens, a finish, an error), and the outputs arrive at the end of the step that produced
// them, as before. Outputs keep the engine's order within a job.
//
// Where no step end is signalled (expert-parallel groups, whose remote ranks' outputs arrive on channel
// threads), the relay is `immediate`: each output that marks an inbox wakes it at once.
//
// Thread-safety: OutputRelay::callback's callbacks and flush() may run on any thread (the producers);
// OutputInbox::take on the one coroutine that owns the inbox, which must outlive no io_context: the
// relay holds inboxes weakly, so a posted wake-up never keeps one alive.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kvfleet/engine.h"

namespace kvfleet::server {

class OutputInbox {
 public:
  using Item = std::pair<std::size_t, RequestOutput>;  // the choice, one engine output of it
  explicit OutputInbox(boost::asio::any_io_executor executor);
  OutputInbox(const OutputInbox&) = delete;
  OutputInbox& operator=(const OutputInbox&) = delete;

  // Producer: appends one output. True when this marked the inbox (the caller arranges one wake()).
  bool put(std::size_t choice, const RequestOutput& output);
  // Producer (or an io thread): resumes the waiting take(), or lets the next one return at once.
  void wake();
  // Everything queued since the last take, in order, swapped into `out` (cleared first, its memory reused
  // by the next outputs); waits while there is nothing.
  boost::asio::awaitable<void> take(std::vector<Item>& out);
  boost::asio::any_io_executor executor() const { return executor_; }

 private:
  boost::asio::any_io_executor executor_;
  std::mutex mu_;
  std::vector<Item> items_;  // guarded by mu_
  bool marked_ = false;      // guarded by mu_: a wake-up is owed for items_
  // One slot: a wake() before take() waits leaves a token, so that none is lost.
  boost::asio::experimental::concurrent_channel<void(boost::system::error_code)> wakeup_;
};

class OutputRelay {
 public:
  explicit OutputRelay(bool immediate) : immediate_(immediate) {}
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // The engine callback of one choice: appends to `inbox`, marks it for the step's flush (or, immediate,
  // wakes it now).
  OutputCallback callback(std::shared_ptr<OutputInbox> inbox, std::size_t choice);
  // The end of an engine step: wakes the inboxes marked since the last flush, with one post to the io
  // threads. Cheap when nothing was marked.
  void flush();

 private:
  void mark(const std::shared_ptr<OutputInbox>& inbox);

  const bool immediate_;
  std::mutex mu_;
  std::vector<std::weak_ptr<OutputInbox>> marked_;  // guarded by mu_
};

}  // namespace kvfleet::server
