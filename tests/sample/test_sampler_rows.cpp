// A step's rows are sampled by two shares that claim them 16 at a time: with 40 rows a step, every
// sampling mode (min-p's zone path, top-p's two-bucket path, top-k, temperature alone, penalties) gives
// each request the tokens it gets run alone, whichever share sampled its row.
#include <doctest/doctest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <random>

#include "runtime/engine_harness.h"
#include "kvfleet/make_model.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

constexpr std::int32_t kVocab = 300;  // >= 256: the bucketed paths, not the small-row ones

Model make_model_in(const test::TempDir& dir) {
  MakeModelOptions o;
  o.dtype = DType::bf16;
  o.vocab = kVocab;
  o.layers = 2;
  make_model(o, dir.path());
  return Model::load(dir.path());
}

std::vector<GenerationRequest> mixed_requests() {
  std::mt19937 rng(77);
  std::vector<GenerationRequest> out;
  for (int i = 0; i < 40; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 4 + i % 7; ++k) r.prompt.push_back(static_cast<TokenId>(rng() % kVocab));
    r.max_tokens = 6;
    r.ignore_eos = true;
    r.sampling.seed = static_cast<std::uint64_t>(1000 + i);
    switch (i % 6) {
      case 0: r.sampling.temperature = 1.0f; break;
      case 1: r.sampling.temperature = 0.7f; r.sampling.top_p = 0.9f; break;
      case 2: r.sampling.temperature = 1.0f; r.sampling.top_k = 50; break;
      case 3: r.sampling.temperature = 1.0f; r.sampling.min_p = 0.05f; break;
      case 4: r.sampling.temperature = 1.3f; r.sampling.min_p = 0.3f; break;
      default:
        r.sampling.temperature = 1.0f;
        r.penalties.presence = 0.5f;
        r.penalties.frequency = 0.5f;
    }
    out.push_back(r);
  }
  return out;
}

// Which share claimed how many rows. The first claim of share 0 waits (up to 10 s) until share 1 has claimed
// rows too, so both shares sample rows whatever the timing: left alone, the engine thread's share is often
// done with all 40 rows before the pool's worker starts, and the run would not show that a row's token is
// the same whichever share's scratch sampled it.
struct ClaimLog {
  std::mutex mu;
  std::condition_variable claimed;
  std::map<std::int64_t, std::int64_t> rows_by_share;
  bool waited = false;
  void claim(std::int64_t share, std::int64_t begin, std::int64_t end) {
    std::unique_lock lock(mu);
    rows_by_share[share] += end - begin;
    claimed.notify_all();
    if (share != 0 || waited) return;
    waited = true;
    claimed.wait_for(lock, std::chrono::seconds(10), [&] { return rows_by_share.count(1) > 0; });
  }
};

EngineConfig config(std::int32_t max_seqs) {
  EngineConfig c;
  c.num_blocks = 256;
  c.scheduler.max_num_seqs = max_seqs;
  c.scheduler.max_num_batched_tokens = 512;
  c.enable_prefix_caching = false;
  c.backend.kind = "cpu";
  c.backend.threads = 2;
  return c;
}

}  // namespace

TEST_CASE("40 rows a step, every sampling mode: each request's tokens equal its run alone") {
  test::TempDir dir;
  const Model model = make_model_in(dir);
  const std::vector<GenerationRequest> requests = mixed_requests();
  std::map<std::size_t, test::Collected> alone;
  {
    Engine engine(model, config(64));
    test::Collector col;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      engine.submit(requests[i], col.callback(i));
      engine.wait_idle();
    }
    alone = col.results();
  }
  ClaimLog claims;
  EngineConfig batched_config = config(64);
  batched_config.on_rows_claimed = [&](std::int64_t share, std::int64_t begin, std::int64_t end) {
    claims.claim(share, begin, end);
  };
  Engine engine(model, batched_config);
  test::Collector col;
  for (std::size_t i = 0; i < requests.size(); ++i) engine.submit(requests[i], col.callback(i));
  engine.wait_idle();
  const std::map<std::size_t, test::Collected> batched = col.results();
  REQUIRE(batched.size() == requests.size());
  std::size_t differ = 0, distinct_tokens = 0;
  for (const auto& [i, c] : alone) {
    const std::size_t request = i;
    CAPTURE(request);
    CHECK(c.tokens.size() == 6);
    CHECK(batched.at(i).tokens == c.tokens);
    differ += batched.at(i).tokens != c.tokens;
    distinct_tokens += c.tokens.empty() ? 0 : static_cast<std::size_t>(c.tokens[0] != alone.at(0).tokens[0]);
  }
  CHECK(differ == 0);
  CHECK(distinct_tokens > 10);  // the draws vary: not every request collapsed to one token
  // The batched run sampled its rows together (few steps), in two shares that both claimed rows.
  CHECK(engine.stats().steps <= 8);
  std::lock_guard lock(claims.mu);
  CHECK(claims.rows_by_share.size() == 2);
  CHECK(claims.rows_by_share[0] > 0);
  CHECK(claims.rows_by_share[1] > 0);
  CHECK(claims.rows_by_share[0] + claims.rows_by_share[1] <= 40 * 6);
}
