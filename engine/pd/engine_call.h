// Awaitable access to the engine thread for KV transfer code running on HTTP io threads: the engine
// thread owns the KV cache and the backend, so block reads, writes, pins and imports run there
// (Engine::run_kv_task) and their results come back through an AsyncQueue on the caller's executor.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/this_coro.hpp>
#include <memory>
#include <stdexcept>
#include <type_traits>

#include "kvfleet/engine.h"
#include "kvfleet/http/async_queue.h"

namespace kvfleet::pd {

using PinId = KvCacheManager::PinId;

// Queues f(scheduler, backend) on the engine thread now; its result arrives in the returned queue (on
// `ex`), so the caller can do other work before awaiting it (D imports one pull while reading the next).
template <typename F>
auto start_on_engine_thread(Engine& engine, boost::asio::any_io_executor ex, F f)
    -> std::shared_ptr<http::AsyncQueue<std::invoke_result_t<F&, Scheduler&, Backend&>>> {
  using T = std::invoke_result_t<F&, Scheduler&, Backend&>;
  auto queue = std::make_shared<http::AsyncQueue<T>>(std::move(ex));
  engine.run_kv_task([queue, f = std::move(f)](Scheduler& s, Backend& b) mutable { queue->push(f(s, b)); });
  return queue;
}

// The result of a start_on_engine_thread call.
template <typename T>
boost::asio::awaitable<T> engine_result(std::shared_ptr<http::AsyncQueue<T>> queue) {
  std::optional<T> out = co_await queue->pop();
  if (!out) throw std::runtime_error("the engine did not answer");
  co_return std::move(*out);
}

// Runs f(scheduler, backend) on the engine thread and returns its result. f must not throw.
template <typename F>
auto on_engine_thread(Engine& engine, F f) -> boost::asio::awaitable<std::invoke_result_t<F&, Scheduler&, Backend&>> {
  auto queue = start_on_engine_thread(engine, co_await boost::asio::this_coro::executor, std::move(f));
  co_return co_await engine_result(std::move(queue));
}

// Releases a pin on the engine thread when it goes out of scope (or on release()).
class EnginePin {
 public:
  EnginePin() = default;
  EnginePin(Engine& engine, PinId id) : engine_(&engine), id_(id) {}
  EnginePin(EnginePin&& o) noexcept : engine_(o.engine_), id_(o.id_) { o.id_ = 0; }
  EnginePin& operator=(EnginePin&& o) noexcept {
    if (this != &o) {
      release();
      engine_ = o.engine_;
      id_ = o.id_;
      o.id_ = 0;
    }
    return *this;
  }
  ~EnginePin() { release(); }
  void release() {
    if (id_ == 0) return;
    engine_->run_kv_task([id = id_](Scheduler& s, Backend&) { s.kv().unpin(id); });
    id_ = 0;
  }
  PinId id() const { return id_; }

 private:
  Engine* engine_ = nullptr;
  PinId id_ = 0;
};

}  // namespace kvfleet::pd
