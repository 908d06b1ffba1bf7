// AsyncQueue<T>: hands items from any thread (e.g. the engine thread) to one coroutine on an io
// thread without blocking either side. Unbounded: the producer decides how much it may queue (a
// request's tokens are bounded by max_tokens); size() is there for accounting.
//
// Thread-safety: push(), close(), try_pop(), size() and closed() may be called from any thread.
// pop() must have at most one waiter at a time; it may run on any executor.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>
#include <deque>
#include <mutex>
#include <optional>

namespace kvfleet::http {

template <typename T>
class AsyncQueue {
 public:
  explicit AsyncQueue(boost::asio::any_io_executor executor) : wakeup_(std::move(executor), 1) {}
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;

  // Appends an item; false (and the item is dropped) once the queue is closed.
  bool push(T item) {
    {
      std::lock_guard lock(mutex_);
      if (closed_) return false;
      items_.push_back(std::move(item));
    }
    wake();
    return true;
  }

  // No more pushes; pop() drains what is queued, then returns nullopt.
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    wake();
  }

  // The next item, waiting for one if needed; nullopt when closed and drained. Throws
  // boost::system::system_error(operation_aborted) when the awaiting coroutine is cancelled.
  boost::asio::awaitable<std::optional<T>> pop() {
    for (;;) {
      if (std::optional<T> item = try_pop()) co_return item;
      if (closed()) {
        // close() may race with a last push; drain once more before reporting the end.
        co_return try_pop();
      }
      // The wakeup channel holds at most one token, so a push between try_pop() and here is
      // never lost: it leaves a token that this receive takes at once.
      auto [ec] = co_await wakeup_.async_receive(boost::asio::as_tuple(boost::asio::use_awaitable));
      if (ec) throw boost::system::system_error(ec);
    }
  }

  std::optional<T> try_pop() {
    std::lock_guard lock(mutex_);
    if (items_.empty()) return std::nullopt;
    std::optional<T> item(std::move(items_.front()));
    items_.pop_front();
    return item;
  }

  size_t size() const {
    std::lock_guard lock(mutex_);
    return items_.size();
  }

  bool closed() const {
    std::lock_guard lock(mutex_);
    return closed_;
  }

 private:
  void wake() { wakeup_.try_send(boost::system::error_code{}); }  // full: a wakeup is pending

  mutable std::mutex mutex_;
  std::deque<T> items_;
  bool closed_ = false;
  boost::asio::experimental::concurrent_channel<void(boost::system::error_code)> wakeup_;
};

}  // namespace kvfleet::http
