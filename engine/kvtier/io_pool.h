// IoPool: a few threads that run the KV tiers' file writes and reads, so that no engine step waits on a
// disk. Two queues: tasks submitted with submit_first (reads a waiting request needs) are taken before any
// submitted with submit (writes), each queue in order. The destructor finishes every task already queued (a
// block being written is renamed into place or not at all) and joins.
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

  void submit(std::function<void()> task) { push(later_, std::move(task)); }
  void submit_first(std::function<void()> task) { push(first_, std::move(task)); }

 private:
  void push(std::deque<std::function<void()>>& queue, std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      queue.push_back(std::move(task));
    }
    wake_.notify_one();
  }
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return stop_ || !first_.empty() || !later_.empty(); });
        auto& queue = !first_.empty() ? first_ : later_;
        if (queue.empty()) return;  // stopping and drained
        task = std::move(queue.front());
        queue.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> first_, later_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvfleet::kvtier
