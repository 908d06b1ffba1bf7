#include "engine/server/output/relay.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

namespace kvfleet::server {

OutputInbox::OutputInbox(boost::asio::any_io_executor executor) : executor_(executor), wakeup_(std::move(executor), 1) {}

bool OutputInbox::put(std::size_t choice, const RequestOutput& output) {
  std::lock_guard lock(mu_);
  items_.emplace_back(choice, output);
  return !std::exchange(marked_, true);
}

void OutputInbox::wake() { wakeup_.try_send(boost::system::error_code{}); }  // full: a wake-up is pending

boost::asio::awaitable<void> OutputInbox::take(std::vector<Item>& out) {
  out.clear();
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (!items_.empty()) {
        out.swap(items_);
        marked_ = false;  // a later put marks again and owes its own wake-up
        co_return;
      }
    }
    // A put + wake between the check and here leaves a token in the channel: this receive returns at once.
    auto [ec] = co_await wakeup_.async_receive(boost::asio::as_tuple(boost::asio::use_awaitable));
    if (ec) throw boost::system::system_error(ec);
  }
}

OutputCallback OutputRelay::callback(std::shared_ptr<OutputInbox> inbox, std::size_t choice) {
  return [this, inbox = std::move(inbox), choice](const RequestOutput& o) {
    if (inbox->put(choice, o)) mark(inbox);
  };
}

void OutputRelay::mark(const std::shared_ptr<OutputInbox>& inbox) {
  if (immediate_) return inbox->wake();
  std::lock_guard lock(mu_);
  marked_.push_back(inbox);
}

void OutputRelay::flush() {
  std::vector<std::weak_ptr<OutputInbox>> marked;
  {
    std::lock_guard lock(mu_);
    if (marked_.empty()) return;
    marked.swap(marked_);
  }
  // Every inbox lives on the server's one io_context: post to the first live one's executor. The handler
  // holds the inboxes weakly (a job that ended meanwhile has nothing to wake).
  boost::asio::any_io_executor executor;
  for (const auto& w : marked)
    if (const auto inbox = w.lock()) {
      executor = inbox->executor();
      break;
    }
  if (!executor) return;  // every marked job is gone
  auto wake_all = [marked = std::move(marked)] {
    for (const auto& w : marked)
      if (const auto inbox = w.lock()) inbox->wake();
  };
  boost::asio::post(executor, std::move(wake_all));
}

}  // namespace kvfleet::server
