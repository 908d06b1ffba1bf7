// IoPool: a few threads that run the KV tiers' file writes and reads, so that no engine step waits on a
// disk. Tasks run in submission order per thread, in any order across threads; the destructor finishes every
// task already queued (a block being written is renamed into place or not at all) and joins.
// Thread-safety: submit() from any thread; tasks report back through their own thread-safe channel.
#pragma once

#include <condition_variable>
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvfleet::kvtier {

class IoPool {
 public:
  explicit IoPool(std::int32_t threads) {
    for (std::int32_t i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { run(); });
  }
  ~IoPool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  void submit(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      tasks_.push_back(std::move(task));
    }
    wake_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping and drained
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvfleet::kvtier
