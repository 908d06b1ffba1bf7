// Speculative decoding on the decode side of prefill/decode disaggregation: a decode replica with
// --speculative-config that pulls its prompts' KV from a prefill replica answers exactly what a mixed replica
// without speculation answers (text and logprobs), and leaks nothing.
#include <doctest/doctest.h>

#include "pd/pd_test_util.h"
#include "server/replica_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;

TEST_CASE("pd with speculation on D: the answers equal a mixed replica's without it") {
  const std::string spec = R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":3})";
  ReplicaProcess p(with_transport({"--role", "prefill"}));
  ReplicaProcess d(with_transport({"--role", "decode", "--speculative-config", spec})), m(with_transport({"--role", "mixed"}));
  // Prompts that repeat themselves, so that prompt lookup proposes from the first decode step on.
  const std::vector<int> pattern = prompt_ids(11, 12);
  std::vector<int> repeated;
  for (int i = 0; i < 5; ++i) repeated = concat(repeated, pattern);
  for (const auto& ids : {repeated, concat(prompt_ids(12, 40), repeated), prompt_ids(13, 50)}) {
    for (const int seed : {-1, 5}) {
      CAPTURE(ids.size());
      CAPTURE(seed);
      const std::string body = completion_body(ids, seed, 24);
      CHECK(answer_of(post(d.port(), "/v1/completions", body, p.base_url())) ==
            answer_of(post(m.port(), "/v1/completions", body)));
    }
  }
  CHECK(metric_value(d.port(), "kvfleet_pd_transfers_total") == 3);
  CHECK(metric_value(d.port(), R"(vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-qwen"})") > 0);
  check_no_leak(p.port());
  check_no_leak(d.port());
}
