// Constrained decoding on an in-process expert-parallel group: each rank samples its own requests with their
// grammars, and the tokens equal one engine's.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>

#include "ep/ep_test_model.h"
#include "kvfleet/ep_group.h"
#include "runtime/engine_harness.h"
#include "support/sequence_grammar.h"
#include "support/temp_dir.h"

using namespace kvfleet;

TEST_CASE("EpGroup: constrained requests give one engine's tokens on every rank, and only allowed ones") {
  test::TempDir dir;
  const Model model = test::tiny_moe(dir);
  auto requests = test::equivalence_requests(300);
  std::mt19937 rng(5);
  std::vector<std::vector<std::vector<TokenId>>> seqs_of(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    for (int k = 0; k < 4; ++k) {
      std::vector<TokenId> s(3 + rng() % 6);
      for (auto& t : s) t = static_cast<TokenId>(rng() % 299);
      seqs_of[i].push_back(s);
    }
    requests[i].grammar = std::make_shared<test::SequenceGrammar>(seqs_of[i], std::vector<TokenId>{299}, 300);
    requests[i].max_tokens = 12;
  }
  EngineConfig c = test::ep_config(256);
  c.enable_prefix_caching = false;
  const auto want = test::run_requests(model, requests, c, false, nullptr);
  EpGroup group(model, c, 2);
  CHECK(group.rank_in_process(0));
  CHECK(group.rank_in_process(1));
  test::Collector col;
  std::set<int> used;
  for (std::size_t i = 0; i < requests.size(); ++i) used.insert(group.submit(requests[i], col.callback(i)).rank);
  for (int r = 0; r < 2; ++r) group.rank(r).wait_idle();
  const auto got = col.results();
  CHECK(used.size() == 2);
  for (const auto& [i, w] : want) {
    const auto request_id = i;
    CAPTURE(request_id);
    CHECK(got.at(i).tokens == w.tokens);
    CHECK(got.at(i).reason == FinishReason::stop);  // every branch (at most 8 tokens + the stop) fits in 12
    std::vector<TokenId> body(w.tokens.begin(), w.tokens.end() - 1);
    CHECK(std::find(seqs_of[i].begin(), seqs_of[i].end(), body) != seqs_of[i].end());
  }
}
