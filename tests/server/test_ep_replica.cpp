// kvfleet-replica --ep-size N: N in-process expert-parallel ranks behind one endpoint. Answers equal the
// single-engine replica's, a shared prefix meets its rank's cache (usage.cached_tokens), and the KV event
// stream carries dp_rank.
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/json.hpp>
#include <future>

#include "engine/server/replica_config.h"
#include "server/replica_fixture.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

void make_tiny_mixtral(const std::filesystem::path& out) {
  MakeModelOptions o;
  o.arch = "mixtral";
  o.dtype = DType::bf16;
  o.experts = 4;
  o.experts_per_tok = 2;
  o.tokenizer = std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default";
  make_model(o, out);
}

std::string completion(const test::ReplicaProcess& r, const std::string& prompt, int i) {
  json::object body{{"model", "tiny-moe"}, {"prompt", prompt}, {"max_tokens", 6}, {"ignore_eos", true}};
  if (i % 2) {
    body["temperature"] = 0.9;
    body["seed"] = 7 + i;
  } else {
    body["temperature"] = 0.0;
  }
  const auto res = r.post("/v1/completions", json::serialize(body));
  REQUIRE(res.status == 200);
  return res.body;
}

// Reads GET /v1/kv_events?since=0 for up to `seconds`, until `needle` shows.
std::string read_events(std::uint16_t port, const std::string& needle, int seconds) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  timeval tv{0, 200000};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET /v1/kv_events?since=0 HTTP/1.1\r\nHost: x\r\n\r\n";
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

}  // namespace

TEST_CASE("kvfleet-replica --ep-size 2 and 4: the single replica's answers; prefixes meet their rank's cache") {
  test::ReplicaProcess one({"--ep-size", "1"}, make_tiny_mixtral, "tiny-moe");
  std::vector<std::string> prompts;
  const std::string system(300, 's');
  for (int i = 0; i < 6; ++i) prompts.push_back((i % 3 ? system : std::string()) + " question " + std::to_string(i * 7919));
  std::vector<std::string> want;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    auto body = json::parse(completion(one, prompts[i], static_cast<int>(i))).as_object();
    want.push_back(json::serialize(body["choices"].as_array()[0].as_object()["text"]));
  }
  for (const char* n : {"2", "4"}) {
    CAPTURE(n);
    test::ReplicaProcess ep({"--ep-size", n}, make_tiny_mixtral, "tiny-moe");
    // All at once (continuous batching over the ranks), then compare each answer's text.
    std::vector<std::future<std::string>> answers;
    for (std::size_t i = 0; i < prompts.size(); ++i)
      answers.push_back(std::async(std::launch::async, [&, i] { return completion(ep, prompts[i], static_cast<int>(i)); }));
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      auto body = json::parse(answers[i].get()).as_object();
      CHECK(json::serialize(body["choices"].as_array()[0].as_object()["text"]) == want[i]);
    }
    // The shared system prompt again: it goes to the rank that cached it.
    auto again = json::parse(completion(ep, system + " one more", 0)).as_object();
    const auto cached = again["usage"].as_object()["prompt_tokens_details"].as_object()["cached_tokens"].to_number<int>();
    CHECK(cached >= 16);
    const std::string events = read_events(ep.port(), "\"dp_rank\"", 10);
    CHECK(events.find("\"type\":\"stored\"") != std::string::npos);
    CHECK(events.find("\"dp_rank\"") != std::string::npos);
    CHECK(ep.metric("kvfleet_moe_steps_total") > 0);
  }
  CHECK(test::run_command(test::bin_dir() + "/kvfleet-replica --model /nonexistent --ep-size 0 2>&1").status != 0);
}

TEST_CASE("ep_size: a YAML key and a flag; needs role mixed and a mixture-of-experts model") {
  server::ReplicaConfig c;
  server::apply_replica_yaml("model: m\nep_size: 4\n", "r.yaml", c);
  CHECK(c.ep_size == 4);
  const std::string replica = test::bin_dir() + "/kvfleet-replica --port 0 --backend cpu --cpu-threads 1 ";
  test::TempDir dir;
  make_tiny_mixtral(dir / "m");
  const auto decode = test::run_command(replica + "--model " + (dir / "m").string() + " --ep-size 2 --role decode 2>&1");
  CHECK(decode.status != 0);
  CHECK(decode.out.find("--ep-size needs role mixed") != std::string::npos);
  test::make_tiny_qwen(dir / "dense");
  const auto dense = test::run_command(replica + "--model " + (dir / "dense").string() + " --ep-size 2 2>&1");
  CHECK(dense.status != 0);
  CHECK(dense.out.find("--ep-size needs a mixture-of-experts model") != std::string::npos);
}
