// The replica's spans beyond completions and chat: a Responses API request (its own replica.request, the chat
// job's phases under it) and the load of a prompt's prefix from a lower KV tier (replica.kv_load), checked
// through the strict OTLP receiver.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>

#include "trace_support.h"

namespace kvfleet::test {
namespace {

namespace json = boost::json;

std::size_t block_files(const std::filesystem::path& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    if (e.path().extension() == ".kvblock") ++n;
  return n;
}

// A chat long enough for several full blocks (16 tokens each) of shared prefix.
std::string long_chat() {
  std::string system = "You are a careful assistant for a shipping company.";
  for (int i = 0; i < 12; ++i) system += " Rule " + std::to_string(i) + ": answer politely, cite the order number, never guess.";
  return json::serialize(json::object{
      {"model", "tiny-qwen"},
      {"messages", json::array{json::object{{"role", "system"}, {"content", system}},
                               json::object{{"role", "user"}, {"content", "Where is order 4521?"}}}},
      {"max_tokens", 3}, {"ignore_eos", true}, {"temperature", 0}});
}

// A prompt of `blocks` full blocks (and one token more) as token ids, different for each seed.
std::string token_prompt_body(int seed, int blocks) {
  json::array ids;
  for (int i = 0; i < blocks * 16 + 1; ++i) ids.push_back(1000 + (seed * 7919 + i * 31) % 20000);
  return json::serialize(json::object{{"model", "tiny-qwen"}, {"prompt", ids}, {"max_tokens", 2}, {"temperature", 0}});
}

}  // namespace

TEST_CASE("responses: a request gets its own replica.request span with the chat job's phases under it") {
  OtlpReceiver receiver;
  ReplicaProcess replica({"--otlp-endpoint", receiver.url()});
  for (const bool stream : {false, true}) {
    CAPTURE(stream);
    const std::string trace = stream ? "1bf7651916cd43dd8448eb211c80319c" : std::string(kClientTrace);
    const std::string body = std::string(R"({"model":"tiny-qwen","input":"hi","max_output_tokens":3,"ignore_eos":true,"stream":)") +
                             (stream ? "true" : "false") + "}";
    const http::Response r = post(replica.port(), "/v1/responses", body, "00-" + trace + "-" + std::string(kClientSpan) + "-01");
    REQUIRE_MESSAGE(r.status == 200, r.body);
    const std::string* id = r.headers.find("x-kvfleet-response-id");
    REQUIRE(id);
    std::vector<ReceivedSpan> spans;
    REQUIRE(eventually([&] {
      spans = of_trace(receiver.spans(), trace);
      return spans.size() >= 4;
    }));
    const ReceivedSpan* request = named(spans, "replica.request");
    REQUIRE(request);
    CHECK(request->parent_span_id == kClientSpan);
    CHECK(request->kind == 2);
    CHECK(request->attributes.at("url.path") == "/v1/responses");
    CHECK(request->attributes.at("gen_ai.operation.name") == "chat");
    CHECK(request->attributes.at("gen_ai.response.id") == *id);
    CHECK(request->attributes.at("gen_ai.usage.output_tokens") == "3");
    CHECK(request->events == std::vector<std::string>{"first_token"});
    for (const char* phase : {"replica.queue", "replica.prefill", "replica.decode"}) {
      CAPTURE(phase);
      const ReceivedSpan* p = named(spans, phase);
      REQUIRE(p);
      CHECK(p->parent_span_id == request->span_id);
    }
    CHECK(spans.size() == 4);  // one request span: the chat completion it runs as has none of its own
  }
  CHECK(receiver.errors().empty());
}

TEST_CASE("kv tiers: a prefix read from the shared tier is a replica.kv_load span with its medium and blocks") {
  TempDir shared;
  OtlpReceiver receiver;
  const std::vector<std::string> flags{"--kv-shared-dir", shared.path().string(), "--num-kv-blocks", "64",
                                       "--otlp-endpoint", receiver.url()};
  ReplicaProcess a(flags);
  const http::Response ra = a.post("/v1/chat/completions", long_chat());
  REQUIRE_MESSAGE(ra.status == 200, ra.body);
  const auto prompt_tokens = json::parse(ra.body).at("usage").at("prompt_tokens").as_int64();
  const auto want = static_cast<std::size_t>((prompt_tokens - 1) / 16);
  REQUIRE(want >= 4);
  REQUIRE(eventually([&] { return block_files(shared.path()) >= want; }));

  ReplicaProcess b(flags);  // has never seen the prompt: its prefix comes from a's files
  const http::Response rb = post(b.port(), "/v1/chat/completions", long_chat(), client_traceparent());
  REQUIRE_MESSAGE(rb.status == 200, rb.body);
  const auto cached = json::parse(rb.body).at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
  REQUIRE(cached == static_cast<std::int64_t>(want) * 16);

  std::vector<ReceivedSpan> spans;
  REQUIRE(eventually([&] {
    spans = of_trace(receiver.spans(), kClientTrace);
    return named(spans, "replica.decode") != nullptr;
  }));
  const ReceivedSpan* request = named(spans, "replica.request");
  const ReceivedSpan* load = named(spans, "replica.kv_load");
  const ReceivedSpan* prefill = named(spans, "replica.prefill");
  REQUIRE(request);
  REQUIRE(load);
  REQUIRE(prefill);
  CHECK(load->parent_span_id == request->span_id);
  CHECK(load->attributes.at("kvfleet.kv_tier.medium") == "shared");
  CHECK(load->attributes.at("kvfleet.kv_tier.blocks") == std::to_string(want));
  CHECK(prefill->attributes.at("kvfleet.cached_tokens") == std::to_string(cached));
  // Inside the request, and over before its first token.
  CHECK(load->start_ns >= request->start_ns);
  CHECK(load->end_ns <= prefill->end_ns);
  CHECK(load->end_ns > load->start_ns);
  CHECK(spans.size() == 5);  // request, kv_load, queue, prefill, decode

  // A's own request computed its prompt: no load span in its trace.
  for (const auto& s : receiver.spans())
    if (s.name == "replica.kv_load") CHECK(s.trace_id == kClientTrace);
  CHECK(receiver.errors().empty());
}

TEST_CASE("kv tiers: a prefix copied back from the host tier is a replica.kv_load span of medium host") {
  OtlpReceiver receiver;
  // 24 device blocks: two 20-block prompts evict a 10-block one, which the host tier takes.
  ReplicaProcess replica({"--num-kv-blocks", "24", "--kv-host-gib", "0.05", "--otlp-endpoint", receiver.url()});
  REQUIRE(replica.post("/v1/completions", token_prompt_body(1, 10)).status == 200);
  for (const int seed : {2, 3}) REQUIRE(replica.post("/v1/completions", token_prompt_body(seed, 20)).status == 200);
  const http::Response again = post(replica.port(), "/v1/completions", token_prompt_body(1, 10), client_traceparent());
  REQUIRE_MESSAGE(again.status == 200, again.body);
  CHECK(json::parse(again.body).at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64() == 10 * 16);
  std::vector<ReceivedSpan> spans;
  REQUIRE(eventually([&] {
    spans = of_trace(receiver.spans(), kClientTrace);
    return named(spans, "replica.decode") != nullptr;
  }));
  const ReceivedSpan* request = named(spans, "replica.request");
  const ReceivedSpan* load = named(spans, "replica.kv_load");
  REQUIRE(request);
  REQUIRE(load);
  CHECK(load->parent_span_id == request->span_id);
  CHECK(load->attributes.at("kvfleet.kv_tier.medium") == "host");
  CHECK(load->attributes.at("kvfleet.kv_tier.blocks") == "10");
  CHECK(load->start_ns >= request->start_ns);
  CHECK(load->end_ns <= request->end_ns);
  CHECK(receiver.errors().empty());
}

}  // namespace kvfleet::test
