// Prefill/decode disaggregation with real kvfleet-replica processes on loopback (Contract 3): a decode
// replica D told to fetch from a prefill replica P answers exactly what a mixed replica M answers, and
// every failure (a corrupted frame, a stalled or dying P, a mismatched model or block size, an expired
// lease, P killed, D's client hanging up) still gives a correct, complete answer, with nothing leaked on
// either side (checked with the engine's integrity check through /internal/kv_state). The same cases run
// over each transport: ctest's pd (tcp) and pd_ucx (KVFLEET_TEST_PD_TRANSPORT=ucx, pd_test_util.h).
#include <doctest/doctest.h>

#include <signal.h>

#include <future>

#include "engine/pd/wire.h"
#include "pd/faulty_prefill_proxy.h"
#include "pd/pd_test_util.h"
#include "server/replica_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;

namespace {

// tiny-qwen's KV block: 2 layers x (K and V) x 2 KV heads x 16 tokens x head dim 16, fp32 on the CPU.
constexpr double kBlockBytes = 2 * 2 * 2 * 16 * 16 * 4;

std::string fallbacks(const std::string& reason) { return "kvfleet_pd_fallbacks_total{reason=\"" + reason + "\"}"; }

}  // namespace

TEST_CASE("pd mode answers token for token like mixed mode: greedy, seeded, shared prefixes, partial hits, short prompts") {
  // Two blocks per pull: the longer prompts take several pulls of one lease.
  ReplicaProcess p(with_transport({"--role", "prefill"}));
  ReplicaProcess d(with_transport({"--role", "decode", "--pd-pull-blocks", "2"})), m(with_transport({"--role", "mixed"}));
  const std::vector<int> base = prompt_ids(1, 48);
  const std::vector<std::vector<int>> prompts{
      prompt_ids(2, 5),                      // shorter than a block: nothing to ship
      prompt_ids(3, 16),                     // one block, but its last token is D's own forward
      prompt_ids(4, 17),                     // one block shipped
      base,                                  // three blocks
      concat(base, prompt_ids(5, 20)),       // D holds the shared three blocks: only the rest ships
      concat(base, prompt_ids(6, 37)),
      prompt_ids(7, 100),
  };
  for (const auto& ids : prompts) {
    for (const int seed : {-1, 7}) {
      CAPTURE(ids.size());
      CAPTURE(seed);
      const std::string body = completion_body(ids, seed);
      CHECK(answer_of(post(d.port(), "/v1/completions", body, p.base_url())) ==
            answer_of(post(m.port(), "/v1/completions", body)));
    }
  }
  CHECK(metric_value(d.port(), "kvfleet_pd_transfers_total") == 5);  // the prompts of one block or more, once each
  CHECK(metric_value(d.port(), "kvfleet_pd_transfer_bytes_total") == kBlockBytes * (1 + 2 + 1 + 2 + 6));
  const std::string metrics = d.get("/metrics").body;
  CHECK(metrics.find("kvfleet_pd_fallbacks_total{") == std::string::npos);
  CHECK(metrics.find("kvfleet_pd_transfer_seconds_count 5") != std::string::npos);

  // A partial hit: D computed the first 4 blocks itself; only blocks 4 and 5 of 6 come from P.
  const std::vector<int> own = prompt_ids(8, 64);
  CHECK(post(d.port(), "/v1/completions", completion_body(own, -1)).status == 200);
  const double before = metric_value(d.port(), "kvfleet_pd_transfer_bytes_total");
  const std::string body = completion_body(concat(own, prompt_ids(9, 40)), 3);
  CHECK(answer_of(post(d.port(), "/v1/completions", body, p.base_url())) == answer_of(post(m.port(), "/v1/completions", body)));
  CHECK(metric_value(d.port(), "kvfleet_pd_transfer_bytes_total") - before == 2 * kBlockBytes);

  // Chat requests take the same path.
  const std::string chat = R"({"messages":[{"role":"user","content":"Tell me, at some length and with examples, about the prefill and decode phases of serving a large language model, and why they differ."}],"max_tokens":6,"temperature":0})";
  CHECK(answer_of(post(d.port(), "/v1/chat/completions", chat, p.base_url())) ==
        answer_of(post(m.port(), "/v1/chat/completions", chat)));
  CHECK(metric_value(d.port(), "kvfleet_pd_transfers_total") == 7);
  // Every pull went over the transport of this run (ucx: none downgraded to tcp).
  CHECK(metric_value(d.port(), pulls_on(ucx_run() ? "ucx" : "tcp")) >= 7);
  CHECK(metric_value(d.port(), pulls_on(ucx_run() ? "tcp" : "ucx")) == 0);
  check_no_leak(p.port());
  check_no_leak(d.port());
}

TEST_CASE("a salted request's blocks move under its salted root and never reach the unsalted namespace") {
  ReplicaProcess p(with_transport({"--role", "prefill"}));
  ReplicaProcess d(with_transport({"--role", "decode"})), m(with_transport({"--role", "mixed"}));
  const std::vector<int> ids = prompt_ids(11, 48);  // two blocks wanted (the last token is D's own)
  const auto cached_tokens = [](const http::Response& r) {
    REQUIRE_MESSAGE(r.status == 200, r.body);
    return json::parse(r.body).at("usage").at("prompt_tokens_details").at("cached_tokens").to_number<int>();
  };
  json::object salted = json::parse(completion_body(ids, 5)).as_object();
  salted["cache_salt"] = "tenant-a";
  const std::string body = json::serialize(salted);
  const http::Response through_pd = post(d.port(), "/v1/completions", body, p.base_url());
  CHECK(answer_of(through_pd) == answer_of(post(m.port(), "/v1/completions", body)));
  CHECK(metric_value(d.port(), "kvfleet_pd_transfers_total") == 1);
  CHECK(cached_tokens(through_pd) == 32);  // D's salted request found the shipped blocks under its own root
  // Neither side holds them for an unsalted request (nor for another tenant's).
  const std::string plain = completion_body(ids, 5);
  CHECK(cached_tokens(post(d.port(), "/v1/completions", plain)) == 0);
  CHECK(cached_tokens(post(p.port(), "/v1/completions", plain)) == 0);
  salted["cache_salt"] = "tenant-b";
  CHECK(cached_tokens(post(d.port(), "/v1/completions", json::serialize(salted))) == 0);
  // P computed them as tenant-a's: a tenant-a request there finds them.
  CHECK(cached_tokens(post(p.port(), "/v1/completions", body)) >= 32);
  check_no_leak(p.port());
  check_no_leak(d.port());
}

TEST_CASE("faults mid-transfer: corrupted frame, stalled P, P dying, expired lease, client hang-up") {
  ReplicaProcess p(with_transport({"--role", "prefill", "--pd-lease-ms", "1000"}));
  ReplicaProcess d1(with_transport({"--role", "decode", "--pd-io-timeout-ms", "500"}));
  ReplicaProcess d2(with_transport({"--role", "decode", "--pd-io-timeout-ms", "5000"}));
  ReplicaProcess m(with_transport({"--role", "mixed"}));
  FaultyPrefillProxy proxy(p.port(), ucx_run());
  struct Case {
    Fault fault;
    const char* reason;
    ReplicaProcess* d;
    std::chrono::milliseconds pause;
  };
  // d1's 500 ms deadline is for the stall alone: the proxy forwards a pull only once P has sent all of it,
  // so on a loaded machine a corrupt or dying pull could reach d1 after its deadline and be counted as a
  // timeout. d2 (5 s) sees those faults for what they are.
  const Case cases[] = {{Fault::corrupt, "checksum", &d2, std::chrono::milliseconds(0)},
                        {Fault::stall, "timeout", &d1, std::chrono::milliseconds(3000)},
                        {Fault::die, "peer_closed", &d2, std::chrono::milliseconds(0)},
                        {Fault::delay_pull, "lease_expired", &d2, std::chrono::milliseconds(2000)}};
  int seed = 100;
  for (const Case& c : cases) {
    CAPTURE(c.reason);
    proxy.fault = c.fault;
    proxy.pause = c.pause;
    const std::string body = completion_body(prompt_ids(++seed, 100), 5);
    const double before = metric_value(c.d->port(), fallbacks(c.reason));
    CHECK(answer_of(post(c.d->port(), "/v1/completions", body, proxy.url())) ==
          answer_of(post(m.port(), "/v1/completions", body)));
    CHECK(metric_value(c.d->port(), fallbacks(c.reason)) == before + 1);
    check_no_leak(c.d->port());
    check_no_leak(p.port());
  }
  CHECK(kv_state(p.port()).at("leases_expired").as_int64() >= 1);

  // D's client hangs up while D waits for a stalled P: D stops the transfer and frees everything.
  proxy.fault = Fault::stall;
  proxy.pause = std::chrono::milliseconds(3000);
  const std::string body = completion_body(prompt_ids(++seed, 100), -1);
  http::Headers h{{"Content-Type", "application/json"}, {"x-kvfleet-prefill-from", proxy.url()}};
  CHECK_THROWS(http::http_request("127.0.0.1", d2.port(), "POST", "/v1/completions", body, h, std::chrono::milliseconds(400)));
  for (int i = 0; i < 500 && metric_value(d2.port(), fallbacks("client_gone")) < 1; ++i)  // up to ~10 s loaded
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(metric_value(d2.port(), fallbacks("client_gone")) == 1);
  check_no_leak(d2.port());
  check_no_leak(p.port());
  // Both decode replicas still serve.
  CHECK(answer_of(post(d1.port(), "/v1/completions", body, p.base_url())) == answer_of(post(m.port(), "/v1/completions", body)));
}

TEST_CASE("mismatched block size or model: the handshake refuses, D prefills locally") {
  ReplicaProcess p32(with_transport({"--role", "prefill", "--block-size", "32"}));
  ReplicaProcess other(with_transport({"--role", "prefill", "--served-model-name", "other-model"}));
  ReplicaProcess d(with_transport({"--role", "decode"})), m(with_transport({"--role", "mixed"}));
  int seed = 200;
  for (ReplicaProcess* p : {&p32, &other}) {
    const std::string body = completion_body(prompt_ids(++seed, 80), 9);
    CHECK(answer_of(post(d.port(), "/v1/completions", body, p->base_url())) == answer_of(post(m.port(), "/v1/completions", body)));
    check_no_leak(p->port());
  }
  CHECK(metric_value(d.port(), fallbacks("handshake")) == 2);
  CHECK(metric_value(d.port(), "kvfleet_pd_transfers_total") == 0);
  // Nobody listening, and a malformed URL.
  for (const char* url : {"http://127.0.0.1:1", "not a url"}) {
    const std::string body = completion_body(prompt_ids(++seed, 40), -1);
    CHECK(answer_of(post(d.port(), "/v1/completions", body, url)) == answer_of(post(m.port(), "/v1/completions", body)));
  }
  CHECK(metric_value(d.port(), fallbacks("connect")) == 2);
  check_no_leak(d.port());
}

TEST_CASE("P killed while D fetches from it: the answer is still correct, D leaks nothing") {
  ReplicaProcess p(with_transport({"--role", "prefill"}));
  ReplicaProcess d(with_transport({"--role", "decode"})), m(with_transport({"--role", "mixed"}));
  const std::string body = completion_body(prompt_ids(300, 800), -1, 4);
  const std::string want = answer_of(post(m.port(), "/v1/completions", body));
  auto got = std::async(std::launch::async, [&] { return post(d.port(), "/v1/completions", body, p.base_url()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  p.process().signal(SIGKILL);
  CHECK(answer_of(got.get()) == want);
  CHECK(metric_value(d.port(), "kvfleet_pd_transfers_total") + metric_value(d.port(), fallbacks("peer_closed")) +
            metric_value(d.port(), fallbacks("connect")) ==
        1);
  check_no_leak(d.port());
}

TEST_CASE("P's endpoints: bad frames, wrong roles and layouts get error objects; an unclaimed lease expires") {
  ReplicaProcess p(with_transport({"--role", "prefill", "--pd-lease-ms", "1500"})), d(with_transport({"--role", "decode"}));
  auto err = [](const http::Response& r) { return json::parse(r.body).at("error").at("code"); };
  const auto garbage = post(p.port(), "/internal/prefill", "not a frame");
  CHECK(garbage.status == 400);
  CHECK(err(garbage) == "bad_frame");
  CHECK(post(d.port(), "/internal/prefill", "x").status == 403);

  pd::Hello hello;
  hello.layout = {"tiny-qwen", "qwen2", DType::bf16, DType::f32, 2, 2, 16, 16, block_hash_root("tiny-qwen")};
  hello.compat_hash = pd::compat_hash(hello.layout);
  const auto ids = prompt_ids(400, 64);
  hello.tokens.assign(ids.begin(), ids.end());
  pd::Hello wrong = hello;
  wrong.layout.head_dim = 32;
  wrong.compat_hash = pd::compat_hash(wrong.layout);
  const auto refused = post(p.port(), "/internal/prefill", pd::encode(wrong));
  CHECK(refused.status == 409);
  CHECK(err(refused) == "compat_mismatch");
  CHECK(refused.body.find("head_dim: 16 here, 32 there") != std::string::npos);
  pd::Hello ragged = hello;
  ragged.tokens.pop_back();
  CHECK(post(p.port(), "/internal/prefill", pd::encode(ragged)).status == 400);

  const auto ok = post(p.port(), "/internal/prefill", pd::encode(hello));
  REQUIRE(ok.status == 200);
  const auto accept = std::get<pd::Accept>(pd::decode_one(ok.body));
  CHECK(accept.num_blocks == 4);
  CHECK(accept.hashes == block_hashes(hello.layout.root, hello.tokens, 16));
  // A lease pins its blocks as they are computed (the stream pin) and, once the prefill finished, holds the
  // prefill's own pin of them too (P accepts as soon as the first block is computed).
  const auto pins = kv_state(p.port()).at("pins").as_int64();
  CHECK((pins == 1 || pins == 2));
  check_no_leak(p.port());  // nobody pulls: the lease runs out and the blocks are freed
  CHECK(kv_state(p.port()).at("leases_expired").as_int64() == 1);
  const auto late = http::http_request("127.0.0.1", p.port(), "GET",
                                       "/internal/prefill/blocks?transfer=" + std::to_string(accept.transfer_id) + "&from=0&count=1");
  CHECK(late.status == 410);
  CHECK(err(late) == "lease_expired");
  CHECK(http::http_request("127.0.0.1", p.port(), "GET", "/internal/prefill/blocks?transfer=x").status == 400);
}

TEST_CASE("internal keys: P's transfer endpoints need the internal key, and D sends its own") {
  ReplicaProcess p(with_transport({"--role", "prefill", "--internal-api-key", "fleet-secret"}));
  ReplicaProcess d(with_transport({"--role", "decode", "--internal-api-key", "fleet-secret"}));
  ReplicaProcess stranger(with_transport({"--role", "decode", "--internal-api-key", "not-the-key"}));
  ReplicaProcess m(with_transport({"--role", "mixed"}));
  // Without the key (or with another), /internal/* answers 401 with an error object.
  const auto bare = post(p.port(), "/internal/prefill", "not a frame");
  CHECK(bare.status == 401);
  CHECK(json::parse(bare.body).at("error").at("type") == "authentication_error");
  CHECK(http::http_request("127.0.0.1", p.port(), "GET", "/internal/kv_state").status == 401);
  // D holds the fleet's key: the transfer happens. A D with another key falls back, and still answers right.
  const std::string body = completion_body(prompt_ids(400, 80), 3);
  const std::string want = answer_of(post(m.port(), "/v1/completions", body));
  CHECK(answer_of(post(d.port(), "/v1/completions", body, p.base_url())) == want);
  CHECK(metric_value(d.port(), "kvfleet_pd_transfers_total") == 1);
  const std::string other = completion_body(prompt_ids(401, 80), 3);
  CHECK(answer_of(post(stranger.port(), "/v1/completions", other, p.base_url())) ==
        answer_of(post(m.port(), "/v1/completions", other)));
  CHECK(metric_value(stranger.port(), "kvfleet_pd_transfers_total") == 0);
  CHECK(metric_value(stranger.port(), fallbacks("error")) == 1);
}
