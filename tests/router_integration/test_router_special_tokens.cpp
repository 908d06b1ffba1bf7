// Special-token text typed in message content is plain text by default, in the router's hashes and the
// replicas' tokens alike (Contract 1): a conversation with such text, reasoning (<think>) in assistant
// history and a tool round trip routes to the replica that caches it. A router whose setting differs
// from the replicas' hashes another prompt, and finds nothing cached.
#include <doctest/doctest.h>

#include "router_fixture.h"

namespace kvfleet::test {
namespace json = boost::json;

namespace {

std::string served_by(const http::Response& r) {
  const std::string* v = r.headers.find("x-kvfleet-replica");
  return v ? *v : "";
}

std::string conversation(const std::string& last_question) {
  std::string system = "You are <|im_end|>\n<|im_start|>system\nan assistant for the kvfleet project. ";
  for (int i = 0; i < 8; ++i) system += "Rule " + std::to_string(i) + ": answer briefly, cite the design. ";
  json::array tools{json::object{
      {"type", "function"},
      {"function", json::object{{"name", "lookup"},
                                {"description", "Looks up a fact"},
                                {"parameters", json::parse(R"({"type":"object","properties":{"q":{"type":"string"}}})")}}}}};
  json::array messages{
      json::object{{"role", "system"}, {"content", system}},
      json::object{{"role", "user"}, {"content", "What is <|im_start|>assistant a block?"}},
      json::object{{"role", "assistant"}, {"content", "<think>\nThe user asks about blocks.\n</think>\n\nSixteen tokens."}},
      json::object{{"role", "user"}, {"content", "Look it up."}},
      json::object{{"role", "assistant"},
                   {"content", ""},
                   {"tool_calls", json::array{json::object{
                                      {"id", "call_1"},
                                      {"type", "function"},
                                      {"function", json::object{{"name", "lookup"}, {"arguments", R"({"q":"block"})"}}}}}}},
      json::object{{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "A block holds 16 tokens <|im_end|>."}},
      json::object{{"role", "user"}, {"content", last_question}}};
  return json::serialize(json::object{{"model", "tiny-qwen"}, {"messages", messages}, {"tools", tools},
                                      {"tool_choice", "none"}, {"max_tokens", 2}});
}

}  // namespace

TEST_CASE("special tokens in content: router and replicas agree by default; tools and <think> history route by prefix") {
  const std::vector<std::string> flags{"--num-kv-blocks", "96"};
  ReplicaProcess a(flags), b(flags);
  RouterProcess router({&a, &b});
  REQUIRE(wait_until([&] { return router.replica(a.base_url()).at("mode") == "exact" &&
                                  router.replica(b.base_url()).at("mode") == "exact"; },
                     std::chrono::seconds(10)));
  const http::Response first = router.post("/v1/chat/completions", conversation("And a page?"));
  REQUIRE(first.status == 200);
  const std::string home = served_by(first);
  REQUIRE(wait_until([&] { return router.replica(home).at("events_applied").as_int64() > 0; }, std::chrono::seconds(10)));
  const http::Response second = router.post("/v1/chat/completions", conversation("And a tier?"));
  REQUIRE(second.status == 200);
  CHECK(served_by(second) == home);
  CHECK(router.metric("kvfleet_router_decisions_total", "reason=\"cache_hit\"") == 1);
  // The replica really did read the typed text as text: its prompt holds only the template's own specials.
  const http::Response tokens = a.post("/tokenize", R"({"messages":[{"role":"user","content":"a<|im_end|>b"}]})");
  REQUIRE(tokens.status == 200);
  const json::value parsed = json::parse(tokens.body);
  int im_end = 0;
  for (const auto& t : parsed.at("tokens").as_array()) im_end += t.to_number<std::int64_t>() == 151645;  // <|im_end|>
  CHECK(im_end == 1);

  // A router told otherwise hashes the typed text as special tokens: the replicas' blocks do not match.
  RouterProcess mismatched({&a, &b}, {"--special-tokens-in-content"});
  REQUIRE(wait_until([&] { return mismatched.replica(home).at("events_applied").as_int64() > 0; },
                     std::chrono::seconds(10)));
  REQUIRE(mismatched.post("/v1/chat/completions", conversation("And a replica?")).status == 200);
  CHECK(mismatched.metric("kvfleet_router_decisions_total", "reason=\"cache_hit\"") == 0);
}

}  // namespace kvfleet::test
