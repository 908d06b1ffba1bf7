#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "kvfleet/kv_events.h"

using namespace kvfleet;
using namespace std::chrono_literals;

namespace {
std::vector<std::uint64_t> seqs(const KvReplay& r) {
  std::vector<std::uint64_t> out;
  for (const auto& e : r.events) out.push_back(e.seq);
  return out;
}
using Seqs = std::vector<std::uint64_t>;
}  // namespace

TEST_CASE("events get increasing seq numbers and replay from any seq still in the ring") {
  KvEventRing ring(4, 16, 42);
  CHECK(ring.last_seq() == 0);
  CHECK(ring.since(0).events.empty());
  CHECK_FALSE(ring.since(0).fell_behind);
  CHECK(ring.publish(KvEvent::Type::stored, {1, 2}, 42) == 1);
  CHECK(ring.publish(KvEvent::Type::removed, {2}) == 2);
  CHECK(ring.publish(KvEvent::Type::cleared) == 3);
  CHECK(seqs(ring.since(0)) == Seqs{1, 2, 3});
  CHECK(seqs(ring.since(2)) == Seqs{3});
  const KvReplay none = ring.since(3);
  CHECK(none.events.empty());
  CHECK_FALSE(none.fell_behind);
  CHECK(none.last_seq == 3);
  const KvEvent first = ring.since(0).events[0];
  CHECK(first.block_hashes == std::vector<BlockHash>{1, 2});
  CHECK(first.parent == 42);
  CHECK(std::string(to_string(ring.since(1).events[0].type)) == "removed");
  CHECK(ring.root() == 42);
  CHECK(ring.block_size() == 16);
}

TEST_CASE("a reader that fell behind the ring, or is ahead of it, is told so") {
  KvEventRing ring(2, 16, 0);
  for (int i = 0; i < 5; ++i) ring.publish(KvEvent::Type::removed, {static_cast<BlockHash>(i)});
  CHECK(seqs(ring.since(3)) == Seqs{4, 5});
  CHECK(ring.since(2).fell_behind);  // event 3 is gone
  CHECK(ring.since(2).events.empty());
  CHECK(ring.since(0).fell_behind);
  CHECK(ring.since(6).fell_behind);  // from the future: this replica restarted
  CHECK(ring.since(6).last_seq == 5);
}

TEST_CASE("readers on other threads always see a gap-free suffix") {
  KvEventRing ring(64, 16, 0);
  std::atomic<bool> done{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    std::uint64_t seen = 0;
    while (!done.load()) {
      const KvReplay r = ring.since(seen);
      if (r.fell_behind) {
        seen = r.last_seq;
        continue;
      }
      for (const auto& e : r.events) bad += e.seq != ++seen;
    }
  });
  for (int i = 0; i < 20000; ++i) ring.publish(KvEvent::Type::removed, {static_cast<BlockHash>(i)});
  done = true;
  reader.join();
  CHECK(bad.load() == 0);
  CHECK(ring.last_seq() == 20000);
}

TEST_CASE("listeners hear every publish while subscribed; each ring has its own instance id") {
  KvEventRing ring(8, 16, 1);
  std::atomic<int> heard{0};
  {
    const std::shared_ptr<void> handle = ring.subscribe([&] { heard += 1; });
    ring.publish(KvEvent::Type::stored, {1}, 1);
    ring.publish(KvEvent::Type::removed, {1});
    CHECK(heard == 2);
  }
  ring.publish(KvEvent::Type::cleared);
  CHECK(heard == 2);  // unsubscribed when the handle went
  KvEventRing other(8, 16, 1);
  CHECK(ring.instance() != 0);
  CHECK(ring.instance() != other.instance());
}
