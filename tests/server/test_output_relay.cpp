// OutputRelay / OutputInbox: a job's coroutine is resumed once per engine step with everything the step
// produced for it (all choices, in order), and not before the step's flush; immediate mode (expert-parallel
// groups) wakes at each output; a flush for a job that is gone does nothing.
#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <vector>

#include "engine/server/output/relay.h"

using namespace kvfleet;
using namespace kvfleet::server;
namespace asio = boost::asio;

namespace {

RequestOutput token(TokenId t, bool finished = false) {
  RequestOutput o;
  o.new_tokens = {t};
  o.finished = finished;
  return o;
}

// A job's reader: each resumption's batch of (choice, token), until `finals` choices finished.
struct Reader {
  std::vector<std::vector<std::pair<std::size_t, TokenId>>> batches;
  bool done = false;
  void start(asio::io_context& ioc, std::shared_ptr<OutputInbox> inbox, int finals) {
    auto body = [this, inbox, finals]() -> asio::awaitable<void> {
      std::vector<OutputInbox::Item> items;
      for (int left = finals; left > 0;) {
        co_await inbox->take(items);
        auto& batch = batches.emplace_back();
        for (const auto& [choice, o] : items) {
          batch.emplace_back(choice, o.new_tokens.at(0));
          left -= o.finished ? 1 : 0;
        }
      }
      done = true;
    };
    asio::co_spawn(ioc, std::move(body), asio::detached);
  }
};

using Batch = std::vector<std::pair<std::size_t, TokenId>>;

}  // namespace

TEST_CASE("a job is woken once per flushed step with all its choices' outputs, in order") {
  asio::io_context ioc;
  OutputRelay relay(/*immediate=*/false);
  auto inbox = std::make_shared<OutputInbox>(ioc.get_executor());
  Reader reader;
  reader.start(ioc, inbox, 2);
  ioc.poll();  // the reader waits
  const OutputCallback c0 = relay.callback(inbox, 0), c1 = relay.callback(inbox, 1);
  c0(token(10));  // step 1
  c1(token(20));
  ioc.poll();
  CHECK(reader.batches.empty());  // nothing wakes the job before the step's flush
  relay.flush();
  ioc.poll();
  REQUIRE(reader.batches.size() == 1);
  CHECK(reader.batches[0] == Batch{{0, 10}, {1, 20}});
  c1(token(21));  // step 2
  c0(token(11, true));
  relay.flush();
  relay.flush();  // nothing new: no second wake-up
  c1(token(22, true));  // step 3, flushed before the reader ran: one resumption takes both steps
  relay.flush();
  ioc.poll();
  REQUIRE(reader.batches.size() == 2);
  CHECK(reader.batches[1] == Batch{{1, 21}, {0, 11}, {1, 22}});
  CHECK(reader.done);
}

TEST_CASE("an immediate relay wakes the job at each output; a flush for a job that is gone does nothing") {
  asio::io_context ioc;
  {
    OutputRelay relay(/*immediate=*/true);
    auto inbox = std::make_shared<OutputInbox>(ioc.get_executor());
    Reader reader;
    reader.start(ioc, inbox, 1);
    ioc.poll();
    relay.callback(inbox, 0)(token(5));
    ioc.poll();
    REQUIRE(reader.batches.size() == 1);
    relay.callback(inbox, 0)(token(6, true));
    ioc.poll();
    CHECK(reader.batches.size() == 2);
    CHECK(reader.done);
  }
  OutputRelay relay(/*immediate=*/false);
  {
    auto inbox = std::make_shared<OutputInbox>(ioc.get_executor());
    relay.callback(inbox, 0)(token(1));  // the callback (and its hold on the inbox) ends here, as the job does
  }
  relay.flush();
  ioc.restart();
  CHECK(ioc.poll() == 0);  // nothing posted: no live inbox to wake
}
