// The replica's kvfleet_http_requests_total counts the internal endpoints too: a prefill replica's
// /internal/prefill, /internal/prefill/blocks and /internal/prefill/release (its share of a real KV
// transfer to a decode replica, and the errors it answered, with the status it really answered), and the 403 a decode replica gives them.
#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "server/replica_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;

namespace {

// kvfleet_http_requests_total{path=PATH,status=STATUS} in a /metrics text; 0 when absent.
double http_requests(const std::string& text, const std::string& path, int status) {
  const std::string series = "kvfleet_http_requests_total{path=\"" + path + "\",status=\"" + std::to_string(status) + "\"} ";
  const auto at = text.find(series);
  return at == std::string::npos ? 0 : std::stod(text.substr(at + series.size()));
}

// Waits (bounded) until P's count of `path` with `status` reaches `want`: P counts a request when its
// handler ends, which may be just after D has its answer.
double await_count(const ReplicaProcess& r, const std::string& path, int status, double want) {
  double got = 0;
  for (int i = 0; i < 500 && (got = http_requests(r.get("/metrics").body, path, status)) < want; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return got;
}

}  // namespace

TEST_CASE("a prefill replica's /internal/prefill* requests are in its kvfleet_http_requests_total") {
  ReplicaProcess p({"--role", "prefill"}), d({"--role", "decode"});
  std::string ids;
  for (int i = 0; i < 40; ++i) {  // two full blocks and a tail
    if (i > 0) ids += ',';
    ids += std::to_string(1000 + i * 37);
  }
  const std::string body = R"({"prompt":[)" + ids + R"(],"max_tokens":2,"temperature":0})";
  http::Headers from{{"x-kvfleet-prefill-from", p.base_url()}};
  REQUIRE(d.post("/v1/completions", body, from).status == 200);
  CHECK(d.metric("kvfleet_pd_transfers_total") == 1);  // the blocks really came from P

  CHECK(p.post("/internal/prefill", "not a frame").status == 400);
  CHECK(p.get("/internal/prefill/blocks?transfer=x").status == 400);
  CHECK(d.post("/internal/prefill", "x").status == 403);
  const int released = p.post("/internal/prefill/release?transfer=987654", "").status;  // a transfer P never had

  CHECK(await_count(p, "/internal/prefill", 200, 1) == 1);  // the handshake
  CHECK(await_count(p, "/internal/prefill/blocks", 200, 1) >= 1);
  CHECK(await_count(p, "/internal/prefill/release", released, 1) == 1);
  CHECK(await_count(p, "/internal/prefill", 400, 1) == 1);
  CHECK(await_count(p, "/internal/prefill/blocks", 400, 1) == 1);
  CHECK(await_count(d, "/internal/prefill", 403, 1) == 1);
  CHECK(await_count(d, "/v1/completions", 200, 1) == 1);  // the public paths as before
}
