// Structured outputs through a replica on loopback HTTP: the request's constraint reaches the grammar engine
// (here a test engine that compiles `choice` into token sequences of the real Qwen3 tokenizer), its grammar
// constrains every choice of chat and completions requests, streamed or not; a constraint the engine refuses
// is a 400 naming the field; a replica without a grammar engine refuses every constrained request with a 400;
// a slow compile holds no HTTP thread.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <future>
#include <regex>
#include <set>

#include "engine/server/replica.h"
#include "kvfleet/http/client.h"
#include "kvfleet/tokenizer.h"
#include "support/sequence_grammar.h"
#include "support/temp_dir.h"
#include "support/tiny_qwen.h"

using namespace kvfleet;
namespace json = boost::json;

namespace {

struct Fixture {
  test::TempDir dir;
  std::string model;
  Fixture() : model((dir.path() / "tiny-qwen").string()) { test::make_tiny_qwen(model); }

  std::unique_ptr<server::Replica> start(server::GrammarCompiler compiler) const {
    server::ReplicaConfig c;
    c.model = model;
    c.port = 0;
    c.http_threads = 1;  // one HTTP thread: a compile that held it would hold every other request
    c.engine.backend.kind = "cpu";
    c.engine.backend.threads = 1;
    c.engine.num_blocks = 128;
    auto r = std::make_unique<server::Replica>(c);
    r->set_grammar_compiler(std::move(compiler));  // null: none (a replica has the grammar engine by default)
    r->start();
    return r;
  }
};

// The test grammar engine: `choice` becomes the choices' token sequences followed by an end-of-sequence id;
// a choice "block" waits for `gate` first. Everything else is refused, a schema with a pattern by its keyword.
server::GrammarCompiler choice_compiler(const std::string& model, std::shared_future<void> gate = {}) {
  auto tok = std::make_shared<Tokenizer>(Tokenizer::load(model));
  const Model m = Model::load(model);
  const auto eos = m.config().eos_token_ids;
  const auto vocab = static_cast<std::size_t>(m.config().vocab_size);
  return [tok, eos, vocab, gate](const server::StructuredOutput& so) -> std::shared_ptr<const TokenGrammar> {
    if (so.kind == server::StructuredOutput::Kind::json_schema && so.schema.is_object() && so.schema.as_object().contains("pattern"))
      throw server::StructuredOutputError("the keyword 'pattern' is not supported", so.schema_param + ".pattern");
    if (so.kind != server::StructuredOutput::Kind::choice)
      throw server::StructuredOutputError(std::string("the test grammar engine does not compile ") + to_string(so.kind));
    std::vector<std::vector<TokenId>> seqs;
    for (const auto& c : so.choices) {
      if (c == "block" && gate.valid()) gate.wait();
      seqs.push_back(tok->encode(c, false));
    }
    return std::make_shared<test::SequenceGrammar>(seqs, eos, vocab);
  };
}

http::Response post(const server::Replica& r, const std::string& target, const std::string& body) {
  return http::http_request("127.0.0.1", const_cast<server::Replica&>(r).port(), "POST", target, body,
                            {{"Content-Type", "application/json"}}, std::chrono::milliseconds(60'000));
}

json::object error_of(const http::Response& res) {
  CHECK(res.status == 400);
  return json::parse(res.body).at("error").as_object();
}

}  // namespace

TEST_CASE("a replica without a grammar engine refuses each kind of constraint with a 400 naming its field") {
  Fixture f;
  auto r = f.start(nullptr);
  const auto chat = error_of(post(*r, "/v1/chat/completions",
                                  R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})"));
  CHECK(chat.at("param") == "response_format");
  CHECK(std::string(chat.at("message").as_string()).find("no grammar engine") != std::string::npos);
  CHECK(error_of(post(*r, "/v1/completions", R"({"prompt":"hi","guided_choice":["a","b"]})")).at("param") == "guided_choice");
  CHECK(error_of(post(*r, "/v1/completions", R"({"prompt":"hi","structured_outputs":{"regex":"a+"}})")).at("param") ==
        "structured_outputs.regex");
  // Unconstrained requests are served as ever.
  CHECK(post(*r, "/v1/completions", R"({"prompt":"hi","max_tokens":2})").status == 200);
}

TEST_CASE("guided choices constrain every choice of chat and completions, streamed or not") {
  Fixture f;
  auto r = f.start(choice_compiler(f.model));
  const std::set<std::string> allowed{"alpha beta", "gamma", "delta epsilon zeta"};
  const std::string choices = R"(["alpha beta","gamma","delta epsilon zeta"])";
  auto body = json::parse(post(*r, "/v1/chat/completions",
                               R"({"messages":[{"role":"user","content":"pick"}],"n":4,"temperature":1.5,"seed":3,"guided_choice":)" +
                                   choices + "}")
                              .body)
                  .as_object();
  REQUIRE(body.at("choices").as_array().size() == 4);
  for (const auto& c : body.at("choices").as_array()) {
    CHECK(allowed.count(std::string(c.at("message").at("content").as_string())) == 1);
    CHECK(c.at("finish_reason") == "stop");
  }
  auto completion = json::parse(post(*r, "/v1/completions",
                                     R"({"prompt":["one","two"],"temperature":0,"structured_outputs":{"choice":)" +
                                         choices + "}}")
                                    .body)
                        .as_object();
  REQUIRE(completion.at("choices").as_array().size() == 2);
  for (const auto& c : completion.at("choices").as_array()) {
    CHECK(allowed.count(std::string(c.at("text").as_string())) == 1);
    CHECK(c.at("finish_reason") == "stop");
  }
  // Streamed: the deltas add up to a choice.
  const auto stream = post(*r, "/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"pick"}],"stream":true,"seed":9,"temperature":1,"guided_choice":)" +
                               choices + "}");
  std::string text, finish;
  for (std::size_t at = 0; (at = stream.body.find("data: {", at)) != std::string::npos; ++at) {
    const auto end = stream.body.find("\n\n", at);
    const auto chunk = json::parse(stream.body.substr(at + 6, end - at - 6)).as_object();
    const auto& c = chunk.at("choices").as_array().at(0).as_object();
    if (const auto* content = c.at("delta").as_object().if_contains("content")) text += content->as_string();
    if (!c.at("finish_reason").is_null()) finish = c.at("finish_reason").as_string();
  }
  CHECK(allowed.count(text) == 1);
  CHECK(finish == "stop");
  // max_tokens before the grammar's end: length, and the text is a choice's beginning.
  auto cut = json::parse(post(*r, "/v1/completions",
                              R"({"prompt":"x","max_tokens":1,"guided_choice":["delta epsilon zeta"]})").body).as_object();
  const auto& c0 = cut.at("choices").as_array().at(0).as_object();
  CHECK(c0.at("finish_reason") == "length");
  CHECK(std::string("delta epsilon zeta").starts_with(std::string(c0.at("text").as_string())));
}

TEST_CASE("a constraint the grammar engine refuses is a 400 naming the field it names, or the constraint's own") {
  Fixture f;
  auto r = f.start(choice_compiler(f.model));
  CHECK(error_of(post(*r, "/v1/completions", R"({"prompt":"x","guided_regex":"a+"})")).at("param") == "guided_regex");
  const auto e = error_of(post(*r, "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],
    "response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"string","pattern":"a+"}}}})"));
  CHECK(e.at("param") == "response_format.json_schema.schema.pattern");
  CHECK(std::string(e.at("message").as_string()).find("pattern") != std::string::npos);
}

TEST_CASE("a compile in progress holds no HTTP thread: other requests are served meanwhile") {
  Fixture f;
  std::promise<void> open;
  auto r = f.start(choice_compiler(f.model, open.get_future().share()));
  auto slow = std::async(std::launch::async, [&] {
    return post(*r, "/v1/completions", R"({"prompt":"x","temperature":0,"guided_choice":["block","gamma"]})");
  });
  // The replica's only HTTP thread answers while the compile waits (were it blocked, this would time out).
  const auto quick = post(*r, "/v1/completions", R"({"prompt":"hi","max_tokens":2})");
  CHECK(quick.status == 200);
  CHECK(slow.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready);
  open.set_value();
  const auto done = slow.get();
  CHECK(done.status == 200);
  const auto text = std::string(json::parse(done.body).at("choices").at(0).at("text").as_string());
  CHECK((text == "block" || text == "gamma"));
}

TEST_CASE("the replica's own grammar engine: regex, choice and JSON Schema outputs are in their languages") {
  Fixture f;
  server::ReplicaConfig c;
  c.model = f.model;
  c.port = 0;
  c.engine.backend.kind = "cpu";
  c.engine.backend.threads = 1;
  c.engine.num_blocks = 128;
  server::Replica r(c);  // no set_grammar_compiler: the grammar engine (engine/grammar) compiles
  r.start();
  const auto text_of = [&](const std::string& body) {
    const http::Response res = post(r, "/v1/completions", body);
    REQUIRE_MESSAGE(res.status == 200, res.body);
    const json::value v = json::parse(res.body);
    CHECK(v.at("choices").at(0).at("finish_reason") == "stop");
    return std::string(v.at("choices").at(0).at("text").as_string());
  };
  for (const int seed : {1, 2, 3}) {
    const std::string sampled = R"(,"temperature":1.0,"seed":)" + std::to_string(seed) + "}";
    const std::string phone = text_of(R"({"prompt":"call","max_tokens":20,"guided_regex":"[0-9]{3}-[0-9]{2}")" + sampled);
    CHECK(std::regex_match(phone, std::regex("[0-9]{3}-[0-9]{2}")));
    const std::string pick = text_of(R"({"prompt":"pick","max_tokens":20,"guided_choice":["alpha","beta gamma"])" + sampled);
    CHECK((pick == "alpha" || pick == "beta gamma"));
    const std::string color =
        text_of(R"({"prompt":"color","max_tokens":20,"guided_json":{"enum":["red","green",7]})" + sampled);
    const json::value parsed = json::parse(color);
    CHECK((parsed == "red" || parsed == "green" || parsed == 7));
  }
}
