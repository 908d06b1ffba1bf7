// A Mooncake trace replayed against a real kvfleet-replica process (a tiny random model): the prompts
// arrive as the token ids the trace's hash ids stand for, and the replica's cached_tokens show exactly
// the reuse the trace has.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "../support/temp_dir.h"
#include "../support/tiny_qwen.h"
#include "bench/kvfleet_bench/fleet.h"
#include "bench/kvfleet_bench/serve.h"

using namespace kvfleet::bench;

TEST_CASE("trace replay against a replica: cached_tokens follow the trace's shared hash ids") {
  kvfleet::test::TempDir dir;
  const auto model = dir / "model";
  kvfleet::test::make_tiny_qwen(model);
  ServerProcess replica({kvfleet::test::bin_dir() + "/kvfleet-replica", "--model", model.string(), "--port", "0",
                         "--cpu-threads", "1", "--block-size", "16", "--num-kv-blocks", "64"},
                        dir / "replica.log", std::chrono::seconds(60));
  // At 16 tokens per trace block: 32, 40 (16 + 16 + 8), 16 and again 40 prompt tokens.
  std::ofstream(dir / "trace.jsonl")
      << R"({"timestamp": 0, "input_length": 1024, "output_length": 3, "hash_ids": [1, 2]})" "\n"
      << R"({"timestamp": 10, "input_length": 1300, "output_length": 3, "hash_ids": [1, 2, 3]})" "\n"
      << R"({"timestamp": 20, "input_length": 512, "output_length": 3, "hash_ids": [4]})" "\n"
      << R"({"timestamp": 30, "input_length": 1300, "output_length": 3, "hash_ids": [1, 2, 3]})" "\n";
  ServeOptions o;
  o.base_url = replica.url();
  o.model = model.string();
  o.workload.dataset = "trace";
  o.workload.trace_file = (dir / "trace.jsonl").string();
  o.workload.trace_block_tokens = 16;
  o.max_concurrency = 1;  // one after another, so each request finds what the ones before it left
  o.progress = false;
  o.metrics_urls = {replica.url()};
  std::ostringstream log;
  const ServeReport report = run_serve(o, log);
  REQUIRE(report.run.results.size() == 4);
  const std::int64_t prompt[] = {32, 40, 16, 40}, cached[] = {0, 32, 0, 32};  // full 16-token blocks only
  for (std::size_t i = 0; i < 4; ++i) {
    const RequestResult& r = report.run.results[i];
    REQUIRE_MESSAGE(r.success, r.error_kind << ": " << r.error);
    CHECK(r.prompt_tokens == prompt[i]);
    CHECK(r.cached_tokens == cached[i]);
    CHECK(r.output_tokens == 3);
  }
  CHECK(*report.result.prompt_hit_ratio() == doctest::Approx(64.0 / 128.0));
  // The infinite cache also counts the last request's partial block: 32 + 40 of 128.
  CHECK(*report.result.infinite_cache_hit_ratio == doctest::Approx(72.0 / 128.0));
  CHECK(log.str().find("Infinite-cache hit ratio:") != std::string::npos);
}
