// Mid-stream failover with real processes: a replica SIGKILLed or SIGSTOPped while it streams, and the
// client's stream (resumed on the other replica) equals the unbroken one, token for token, with the
// same usage; with nowhere to resume, an error event and [DONE]. (failover: false keeps the old error
// event: test_router_integration.cpp.)
#include <doctest/doctest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>
#include <csignal>
#include <optional>
#include <set>

#include "kvfleet/http/sse.h"
#include "router_fixture.h"

namespace kvfleet::test {
namespace json = boost::json;
namespace asio = boost::asio;

namespace {

const std::vector<std::string> kReplicaFlags{"--num-kv-blocks", "96"};

// What a client makes of a stream: its chunks' text, ids, finish reason and usage, and its framing.
struct Stream {
  std::string replica;  // x-kvfleet-replica: the first replica
  std::string text;
  std::set<std::string> ids;
  std::set<std::int64_t> created;
  int roles = 0;
  std::string finish_reason;
  json::value usage;
  bool error = false;
  bool done_last = false;  // [DONE] is the last event
  int events_after_done = 0;
};

// Streams `body` from `target` on the router; `on_first` runs once the first bytes arrived (with the
// replica that serves it).
Stream stream(std::uint16_t port, const std::string& target, const std::string& body,
              const std::function<void(const std::string&)>& on_first = {}) {
  asio::io_context io;
  Stream out;
  std::string raw;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    http::HttpClientConfig cc;
    cc.io_timeout = std::chrono::seconds(60);
    http::HttpClient client(co_await asio::this_coro::executor, cc);
    const std::string host = "127.0.0.1";
    co_await client.connect(host, port);
    http::Request request;
    request.method = "POST";
    request.target = target;
    request.body = body;
    request.headers.set("content-type", "application/json");
    co_await client.send(request);
    const http::ResponseHead head = co_await client.read_head();
    REQUIRE(head.status == 200);
    if (const std::string* r = head.headers.find("x-kvfleet-replica")) out.replica = *r;
    bool first = true;
    while (std::optional<std::string> piece = co_await client.read_some()) {
      raw += *piece;
      if (first && on_first) on_first(out.replica);
      first = false;
    }
  }, [](std::exception_ptr e) { if (e) std::rethrow_exception(e); });
  io.run();
  http::SseParser parser;
  bool done = false;
  for (const http::SseEvent& e : parser.feed(raw)) {
    if (done) ++out.events_after_done;
    if (e.data == "[DONE]") {
      done = true;
      continue;
    }
    const json::object chunk = json::parse(e.data).as_object();
    CHECK(!chunk.contains("kvfleet_token_ids"));  // the router's, never the client's
    if (chunk.contains("error")) {
      out.error = true;
      continue;
    }
    out.ids.insert(std::string(chunk.at("id").as_string()));
    out.created.insert(chunk.at("created").as_int64());
    if (const json::value* u = chunk.if_contains("usage"); u && !u->is_null()) out.usage = *u;
    for (const auto& c : chunk.at("choices").as_array()) {
      const json::object& choice = c.as_object();
      if (const json::value* delta = choice.if_contains("delta")) {
        if (delta->as_object().contains("role")) ++out.roles;
        if (const json::value* t = delta->as_object().if_contains("content")) out.text += t->as_string();
      } else {
        out.text += choice.at("text").as_string();
      }
      if (!choice.at("finish_reason").is_null()) out.finish_reason = choice.at("finish_reason").as_string();
    }
  }
  out.done_last = done && out.events_after_done == 0;
  return out;
}

std::string completion(int max_tokens, std::optional<int> seed) {
  json::object body{{"model", "tiny-qwen"}, {"prompt", "Once upon a time in a fleet of replicas"},
                    {"max_tokens", max_tokens}, {"stream", true}, {"ignore_eos", true},
                    {"stream_options", json::object{{"include_usage", true}}}};
  if (seed) {
    body["temperature"] = 1.0;
    body["seed"] = *seed;
  } else {
    body["temperature"] = 0.0;
  }
  return json::serialize(body);
}

std::string chat(int max_tokens, int seed) {
  json::array messages{json::object{{"role", "user"}, {"content", "Tell me about failover."}}};
  return json::serialize(json::object{{"model", "tiny-qwen"}, {"messages", messages}, {"max_tokens", max_tokens},
                                      {"stream", true}, {"ignore_eos", true}, {"temperature", 0.9}, {"seed", seed},
                                      {"stream_options", json::object{{"include_usage", true}}}});
}

ReplicaProcess& serving(ReplicaProcess& a, ReplicaProcess& b, const std::string& url) {
  return url == a.base_url() ? a : b;
}

// The resumed stream is the unbroken one: the same text, end and usage, one id, [DONE] last.
void check_same(const Stream& resumed, const Stream& unbroken) {
  CHECK(!resumed.error);
  CHECK(resumed.text == unbroken.text);
  CHECK(resumed.finish_reason == unbroken.finish_reason);
  CHECK(resumed.usage.at("completion_tokens") == unbroken.usage.at("completion_tokens"));
  CHECK(resumed.usage.at("prompt_tokens") == unbroken.usage.at("prompt_tokens"));
  CHECK(resumed.ids.size() == 1);
  CHECK(resumed.created.size() == 1);
  CHECK(resumed.roles == unbroken.roles);
  CHECK(resumed.done_last);
}

}  // namespace

TEST_CASE("failover: a replica SIGKILLed mid-stream; greedy and seeded streams go on elsewhere unchanged") {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags), c(kReplicaFlags);
  RouterProcess router({&a, &b, &c}, {"--kv-events", "false"});
  const auto kill_server = [&](const std::string& url) {
    ReplicaProcess& r = url == a.base_url() ? a : url == b.base_url() ? b : c;
    r.process().signal(SIGKILL);
  };
  struct Case {
    const char* name;
    const char* target;
    std::string body;
  };
  const Case cases[] = {{"greedy completion", "/v1/completions", completion(600, std::nullopt)},
                        {"seeded chat", "/v1/chat/completions", chat(600, 11)}};
  double resumed_streams = 0;
  for (const Case& k : cases) {
    CAPTURE(k.name);
    const Stream unbroken = stream(router.port(), k.target, k.body);
    REQUIRE(unbroken.finish_reason == "length");
    REQUIRE(unbroken.usage.at("completion_tokens") == 600);
    // The same request, its replica killed as the first bytes reach the client: another one resumes it.
    const Stream resumed = stream(router.port(), k.target, k.body, kill_server);
    check_same(resumed, unbroken);
    resumed_streams += 1;
    CHECK(router.metric("kvfleet_router_failover_attempts_total") >= resumed_streams);  // (a dead one tried first)
    CHECK(router.metric("kvfleet_router_failovers_succeeded_total") == resumed_streams);
  }
}

TEST_CASE("failover: a replica SIGSTOPped mid-stream stalls; the stream resumes elsewhere, late bytes dropped") {
  ReplicaProcess a(kReplicaFlags), b(kReplicaFlags);
  RouterProcess router({&a, &b}, {"--kv-events", "false", "--stream-stall-timeout-ms", "700"});
  const std::string body = completion(600, 5);
  const Stream unbroken = stream(router.port(), "/v1/completions", body);
  REQUIRE(unbroken.finish_reason == "length");
  ReplicaProcess* stopped = nullptr;
  const Stream resumed = stream(router.port(), "/v1/completions", body, [&](const std::string& url) {
    stopped = &serving(a, b, url);
    stopped->process().signal(SIGSTOP);
  });
  REQUIRE(stopped != nullptr);
  stopped->process().signal(SIGCONT);  // its late bytes go nowhere: the router closed the connection
  check_same(resumed, unbroken);
  CHECK(router.metric("kvfleet_router_upstream_stalls_total") == 1);
  CHECK(router.metric("kvfleet_router_failovers_succeeded_total") == 1);
}

TEST_CASE("failover: with nowhere to resume, the stream ends with an error event and [DONE]") {
  ReplicaProcess a(kReplicaFlags);
  RouterProcess router({&a}, {"--kv-events", "false"});
  const Stream s = stream(router.port(), "/v1/completions", completion(600, std::nullopt),
                          [&](const std::string&) { a.process().signal(SIGKILL); });
  CHECK(s.error);
  CHECK(s.done_last);
  CHECK(router.metric("kvfleet_router_failovers_failed_total") == 1);
}

}  // namespace kvfleet::test

namespace kvfleet::test {

TEST_CASE("failover: the replica's resume extension refuses what it cannot continue, naming the field") {
  ReplicaProcess r(kReplicaFlags);
  const auto param = [&](const std::string& body) {
    const http::Response res = r.post("/v1/completions", body);
    CHECK(res.status == 400);
    return std::string(json::parse(res.body).at("error").at("param").as_string());
  };
  const std::string head = R"({"model":"tiny-qwen","prompt":"Hi","max_tokens":4,)";
  CHECK(param(head + R"("stream":true,"kvfleet_resume":{"output_token_ids":[1,2,3,4]}})") ==
        "kvfleet_resume.output_token_ids");
  CHECK(param(head + R"("stream":true,"kvfleet_resume":{"output_token_ids":[1,-2]}})") ==
        "kvfleet_resume.output_token_ids");
  CHECK(param(head + R"("stream":true,"kvfleet_resume":{"output_token_ids":[99999999]}})") ==
        "kvfleet_resume.output_token_ids");
  CHECK(param(head + R"("stream":false,"kvfleet_resume":{"output_token_ids":[1]}})") == "kvfleet_resume");
  CHECK(param(head + R"("stream":true,"n":2,"kvfleet_resume":{"output_token_ids":[1]}})") == "kvfleet_resume");
  CHECK(param(head + R"("stream":true,"kvfleet_resume":{"output_token_ids":[1],"role":"x"}})") ==
        "kvfleet_resume.role");
  http::Headers bad{{"X-Kvfleet-Token-Ids", "yes"}};
  const http::Response res = r.post("/v1/completions", head + R"("stream":true})", bad);
  CHECK(res.status == 400);
  CHECK(res.body.find("X-Kvfleet-Token-Ids") != std::string::npos);
  // Asked for, a stream's chunks carry their ids; a resumed one continues under the given id and created.
  http::Headers ids{{"X-Kvfleet-Token-Ids", "true"}};
  const http::Response resumed = r.post(
      "/v1/completions",
      head + R"("stream":true,"ignore_eos":true,"kvfleet_resume":{"output_token_ids":[9,10],"id":"cmpl-x","created":7}})",
      ids);
  REQUIRE(resumed.status == 200);
  http::SseParser parser;
  std::size_t ids_seen = 0;
  for (const http::SseEvent& e : parser.feed(resumed.body)) {
    if (e.data == "[DONE]") continue;
    const json::object chunk = json::parse(e.data).as_object();
    CHECK(chunk.at("id") == "cmpl-x");
    CHECK(chunk.at("created") == 7);
    ids_seen += chunk.at("kvfleet_token_ids").as_array().size();
  }
  CHECK(ids_seen == 2);  // max_tokens 4, two of them resumed
}

}  // namespace kvfleet::test
