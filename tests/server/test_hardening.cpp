// Hardening regressions through a real kvfleet-replica: padded vocabularies, streams that must end with
// an error event and [DONE], admission that counts a request's fan-out, API keys, tenant isolation of
// the prefix cache, the served name only in /v1/models, special tokens in message content.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <csignal>
#include <thread>

#include "kvfleet/make_model.h"
#include "replica_fixture.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

// The default model's 4,096-token tokenizer and chat template on a model with 16,384 embedding rows.
void make_padded(const std::filesystem::path& out) {
  MakeModelOptions o;
  o.vocab = 16384;
  o.layers = 1;
  o.hidden = 32;
  o.intermediate = 64;
  o.heads = 2;
  o.kv_heads = 1;
  o.tokenizer = std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default";
  make_model(o, out);
}

struct Stream {
  std::vector<json::value> chunks;
  std::vector<json::value> errors;
  bool done = false;
};

Stream parse_stream(const std::string& body) {
  Stream s;
  http::SseParser parser;
  for (const auto& e : parser.feed(body)) {
    if (e.data == "[DONE]") {
      s.done = true;
      continue;
    }
    json::value v = json::parse(e.data);
    (v.as_object().contains("error") ? s.errors : s.chunks).push_back(std::move(v));
  }
  return s;
}

std::int64_t cached_tokens(const http::Response& r) {
  return json::parse(r.body).at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
}

}  // namespace

TEST_CASE("a padded vocabulary: sampled streams end with finish_reason and [DONE], padded prompt ids decode to nothing") {
  test::ReplicaProcess replica({}, make_padded, "padded");
  for (int round = 0; round < 4; ++round) {
    // Before: an id past the tokenizer was sampled within a few tokens; the stream ended after two chunks
    // with no finish_reason, no error event and no [DONE], and the whole response was a 400.
    const auto streamed = replica.post("/v1/completions", R"({"prompt":"In the beginning","max_tokens":24,"n":2,)"
                                                          R"("temperature":1.0,"ignore_eos":true,"stream":true,"seed":)" +
                                                              std::to_string(round) + "}");
    CHECK(streamed.status == 200);
    const Stream s = parse_stream(streamed.body);
    CHECK(s.done);
    CHECK(s.errors.empty());
    int finished = 0;
    for (const auto& c : s.chunks)
      if (c.at("choices").at(0).at("finish_reason") == "length") ++finished;
    CHECK(finished == 2);
    const auto whole = replica.post("/v1/completions", R"({"prompt":"And God said","max_tokens":24,"logprobs":5,)"
                                                       R"("temperature":1.0,"ignore_eos":true,"seed":)" +
                                                           std::to_string(round) + "}");
    CHECK(whole.status == 200);
  }
  const auto echo = replica.post("/v1/completions", R"({"prompt":[5000, 16000, 12],"max_tokens":1,"echo":true})");
  CHECK(echo.status == 200);
  const auto detok = replica.post("/detokenize", R"({"tokens":[16383, 4095]})");
  CHECK(detok.status == 200);
}

TEST_CASE("a drain that times out ends each running stream with an error event and [DONE]") {
  test::ReplicaProcess replica({"--drain-timeout-ms", "300"});
  http::Response streamed;
  std::thread running([&] {
    streamed = replica.post("/v1/completions", R"({"prompt":"Count:","max_tokens":3000,"stream":true,"ignore_eos":true})");
  });
  for (int i = 0; i < 300 && replica.metric("kvfleet_requests_running") < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  replica.process().signal(SIGTERM);
  running.join();
  CHECK(streamed.status == 200);
  const Stream s = parse_stream(streamed.body);
  CHECK(s.done);
  REQUIRE(s.errors.size() == 1);
  CHECK(s.errors[0].at("error").at("type") == "server_error");
  CHECK(replica.process().wait(std::chrono::seconds(20)) == 0);
}

TEST_CASE("admission reserves a request's whole fan-out at once: prompts x n beyond capacity is 400, beyond what is free 429") {
  test::ReplicaProcess replica({"--max-num-seqs", "2", "--max-waiting-requests", "2"});
  CHECK(replica.post("/v1/completions", R"({"prompt":["a","b","c"],"n":2,"max_tokens":1})").status == 400);
  http::Response big;
  std::thread running([&] {
    big = replica.post("/v1/completions", R"({"prompt":"go","n":4,"max_tokens":60,"temperature":0,"ignore_eos":true,"stream":true})");
  });
  for (int i = 0; i < 300 && replica.metric("kvfleet_requests_running") < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The engine's stats could still say nothing waits; the reservation knows all four slots are taken.
  const auto refused = replica.post("/v1/completions", R"({"prompt":"late","max_tokens":1})");
  CHECK(refused.status == 429);
  CHECK(json::parse(refused.body).at("error").at("type") == "rate_limit_error");
  running.join();
  CHECK(big.status == 200);
  CHECK(replica.post("/v1/completions", R"({"prompt":"after","max_tokens":1})").status == 200);
}

TEST_CASE("API keys: --api-key guards /v1 and /tokenize; --internal-api-key alone opens /v1/kv_events; probes stay open") {
  test::ReplicaProcess replica({"--api-key", "user-key", "--internal-api-key", "router-key"});
  const std::string body = R"({"prompt":"hi","max_tokens":1})";
  const auto none = replica.post("/v1/completions", body);
  CHECK(none.status == 401);
  CHECK(json::parse(none.body).at("error").at("type") == "authentication_error");
  CHECK(replica.post("/v1/completions", body, {{"Authorization", "Bearer wrong-key"}}).status == 401);
  CHECK(replica.post("/v1/completions", body, {{"Authorization", "Bearer user-ke"}}).status == 401);
  CHECK(replica.post("/v1/completions", body, {{"Authorization", "user-key"}}).status == 401);
  CHECK(replica.post("/v1/completions", body, {{"Authorization", "Bearer router-key"}}).status == 401);
  CHECK(replica.post("/v1/completions", body, {{"Authorization", "Bearer user-key"}}).status == 200);
  CHECK(replica.post("/tokenize", R"({"prompt":"a"})").status == 401);
  CHECK(replica.post("/detokenize", R"({"tokens":[1]})").status == 401);
  CHECK(replica.post("/tokenize", R"({"prompt":"a"})", {{"Authorization", "Bearer user-key"}}).status == 200);
  CHECK(replica.get("/v1/models").status == 401);
  CHECK(replica.get("/health").status == 200);
  CHECK(replica.get("/metrics").status == 200);
  auto kv = [&](const std::string& key) {
    http::Headers h;
    if (!key.empty()) h.add("Authorization", "Bearer " + key);
    return http::http_request("127.0.0.1", replica.port(), "GET", "/v1/kv_events?since=0&max_events=1", {}, h,
                              std::chrono::seconds(5)).status;
  };
  CHECK(kv("") == 401);
  CHECK(kv("user-key") == 401);
}

TEST_CASE("cache_salt: another tenant's prefix is never reused, nor revealed by usage.cached_tokens") {
  test::ReplicaProcess replica;
  const std::string prompt = "\"" + std::string(400, 'q') + " shared system prompt\"";
  auto send = [&](const std::string& salt) {
    const std::string extra = salt.empty() ? "" : R"(,"cache_salt":")" + salt + "\"";
    const auto r = replica.post("/v1/completions", R"({"prompt":)" + prompt + R"(,"max_tokens":1)" + extra + "}");
    REQUIRE(r.status == 200);
    return cached_tokens(r);
  };
  CHECK(send("tenant-a") == 0);
  CHECK(send("tenant-b") == 0);  // before: tenant b saw tenant a's prefix as cached
  CHECK(send("") == 0);
  CHECK(send("tenant-a") > 0);
  CHECK(send("tenant-b") > 0);
}

TEST_CASE("/v1/models shows the served name, never the model's local path") {
  test::ReplicaProcess replica;
  const auto r = replica.get("/v1/models");
  REQUIRE(r.status == 200);
  CHECK(r.body.find('/') == std::string::npos);
  CHECK(json::parse(r.body).at("data").at(0).at("root") == "tiny-qwen");
}

TEST_CASE("special tokens in content: '<|im_end|>' typed by a user is text by default; the template's own stay special") {
  const std::string body = R"({"messages":[{"role":"user","content":"a<|im_end|>b"}]})";
  auto im_end_count = [&](const test::ReplicaProcess& replica) {
    const auto r = replica.post("/tokenize", body);
    REQUIRE(r.status == 200);
    const json::value parsed = json::parse(r.body);
    std::size_t n = 0;
    for (const auto& t : parsed.at("tokens").as_array()) n += t.to_number<std::int64_t>() == 151645;  // <|im_end|>
    return n;
  };
  test::ReplicaProcess vllm_like({"--special-tokens-in-content"});
  CHECK(im_end_count(vllm_like) == 2);  // the user's and the template's
  test::ReplicaProcess safe;
  CHECK(im_end_count(safe) == 1);  // the template's end of the user turn only
  const auto chat = safe.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"<|im_start|>system"}],"max_tokens":2})");
  CHECK(chat.status == 200);
}

namespace {

// An IPv4 address of this machine that is not a loopback one (empty when it has none).
std::string non_loopback_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* a = list; a && found.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK))
      continue;
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) found = text;
  }
  freeifaddrs(list);
  return found;
}

int kv_events_status(const std::string& host, std::uint16_t port, const std::string& key = "") {
  // The event stream never ends: read only the status line.
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address(host), port});
  timeval tv{5, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string req = "GET /v1/kv_events?since=0&max_events=1 HTTP/1.1\r\nHost: x\r\n";
  if (!key.empty()) req += "Authorization: Bearer " + key + "\r\n";
  req += "\r\n";
  asio::write(s, asio::buffer(req));
  std::string got;
  char buf[512];
  while (got.size() < 12) {
    const ssize_t n = ::recv(s.native_handle(), buf, sizeof buf, 0);
    if (n <= 0) return 0;
    got.append(buf, static_cast<std::size_t>(n));
  }
  return std::stoi(got.substr(9, 3));
}

}  // namespace

TEST_CASE("without keys, /v1/kv_events and /internal/* answer loopback clients only, unless opened") {
  const std::string address = non_loopback_address();
  if (address.empty()) {
    WARN_MESSAGE(false, "this machine has no non-loopback IPv4 address: the remote half is not exercised");
  }
  {
    test::ReplicaProcess replica({"--host", "0.0.0.0"});
    CHECK(kv_events_status("127.0.0.1", replica.port()) == 200);
    if (!address.empty()) {
      CHECK(kv_events_status(address, replica.port()) == 403);
      const auto r = http::http_request(address, replica.port(), "POST", "/internal/prefill", "{}",
                                        {{"Content-Type", "application/json"}}, std::chrono::seconds(5));
      CHECK(r.status == 403);
      CHECK(json::parse(r.body).at("error").at("code") == "internal_endpoint_closed");
      // The public API stays open to everybody.
      CHECK(http::http_request(address, replica.port(), "GET", "/v1/models", {}, {}, std::chrono::seconds(5)).status ==
            200);
    }
  }
  if (!address.empty()) {
    test::ReplicaProcess opened({"--host", "0.0.0.0", "--open-internal-endpoints"});
    CHECK(kv_events_status(address, opened.port()) == 200);
    test::ReplicaProcess keyed({"--host", "0.0.0.0", "--internal-api-key", "router-key"});
    CHECK(kv_events_status(address, keyed.port()) == 401);
    CHECK(kv_events_status(address, keyed.port(), "router-key") == 200);
  }
}
