// vLLM's metric names on a real kvfleet-replica process: what the Gateway API Inference Extension's endpoint
// picker scrapes (vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc,
// vllm:cache_config_info) carries the values of kvfleet's own gauges, in the same scrape.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>
#include <thread>

#include "replica_fixture.h"

using namespace kvfleet;

namespace {

// Sends a streaming completion on a raw socket and leaves it open: the request runs (or waits) until the
// socket closes, which aborts it.
class OpenStream {
 public:
  OpenStream(std::uint16_t port, const std::string& body) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    REQUIRE(::send(fd_, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  }
  ~OpenStream() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// The value of the sample `name{labels}` (labels exactly as rendered) in a scrape; -1 when absent.
double sample(const std::string& scrape, const std::string& series) {
  const std::regex line("(^|\\n)" + std::regex_replace(series, std::regex(R"([{}()\[\].+*?^$|\\])"), R"(\$&)") +
                        " ([0-9.eE+-]+)");
  std::smatch m;
  return std::regex_search(scrape, m, line) ? std::stod(m[2]) : -1.0;
}

struct Load {
  double running, waiting, usage;                 // kvfleet's names
  double vllm_running, vllm_waiting, vllm_usage;  // vLLM's
};

Load scrape_load(const test::ReplicaProcess& replica) {
  const std::string text = replica.get("/metrics").body;
  const std::string labels = R"({engine="0",model_name="tiny-qwen"})";
  return {sample(text, "kvfleet_requests_running"),       sample(text, "kvfleet_requests_waiting"),
          sample(text, "kvfleet_kv_cache_usage_ratio"),   sample(text, "vllm:num_requests_running" + labels),
          sample(text, "vllm:num_requests_waiting" + labels), sample(text, "vllm:kv_cache_usage_perc" + labels)};
}

void check_same(const Load& l) {
  CHECK(l.vllm_running == l.running);
  CHECK(l.vllm_waiting == l.waiting);
  CHECK(l.vllm_usage == l.usage);
}

}  // namespace

TEST_CASE("vLLM names: the endpoint picker's metrics carry the replica's load, with model_name") {
  // One sequence at a time: of three long requests, one runs and two wait (so running != waiting).
  test::ReplicaProcess replica({"--max-num-seqs", "1", "--num-kv-blocks", "256", "--block-size", "16"});
  const std::string idle = replica.get("/metrics").body;
  CHECK(idle.find("# TYPE vllm:num_requests_running gauge") != std::string::npos);
  CHECK(idle.find("# TYPE vllm:num_requests_waiting gauge") != std::string::npos);
  CHECK(idle.find("# TYPE vllm:kv_cache_usage_perc gauge") != std::string::npos);
  CHECK(sample(idle, R"(vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="256"})") == 1);
  check_same(scrape_load(replica));
  CHECK(scrape_load(replica).vllm_running == 0);

  const std::string body = R"({"prompt":"A long story:","max_tokens":3000,"stream":true,"ignore_eos":true})";
  OpenStream first(replica.port(), body), second(replica.port(), body), third(replica.port(), body);
  Load busy{};
  for (int i = 0; i < 400; ++i) {
    busy = scrape_load(replica);
    if (busy.running == 1 && busy.waiting == 2 && busy.usage > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  CHECK(busy.vllm_running == 1);
  CHECK(busy.vllm_waiting == 2);
  CHECK(busy.vllm_usage > 0);
  CHECK(busy.vllm_usage <= 1);  // a fraction, as vLLM's: "1 means 100 percent usage"
  check_same(busy);

  first.close();
  second.close();
  third.close();
  Load after{};
  for (int i = 0; i < 400; ++i) {
    after = scrape_load(replica);
    if (after.running == 0 && after.waiting == 0 && after.usage == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  CHECK(after.vllm_running == 0);
  CHECK(after.vllm_waiting == 0);
  CHECK(after.vllm_usage == 0);
  check_same(after);
}

TEST_CASE("vLLM names: speculative decoding's counters, and kvfleet's acceptance ratio per method") {
  test::ReplicaProcess plain;
  CHECK(plain.get("/metrics").body.find("spec_decode") == std::string::npos);  // off: none shown
  test::ReplicaProcess replica({"--speculative-config", R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":2})"});
  // A prompt that repeats itself: prompt lookup finds drafts from the first decode step on.
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "one two three four ";
  const auto r = replica.post("/v1/completions", R"({"prompt":")" + prompt + R"(","max_tokens":40,"ignore_eos":true})");
  REQUIRE(r.status == 200);
  const std::string text = replica.get("/metrics").body;
  const std::string labels = R"({engine="0",model_name="tiny-qwen"})";
  const double drafts = sample(text, "vllm:spec_decode_num_drafts_total" + labels);
  const double draft_tokens = sample(text, "vllm:spec_decode_num_draft_tokens_total" + labels);
  const double accepted = sample(text, "vllm:spec_decode_num_accepted_tokens_total" + labels);
  CHECK(text.find("# TYPE vllm:spec_decode_num_drafts_total counter") != std::string::npos);
  CHECK(drafts > 0);
  CHECK(draft_tokens >= drafts);
  CHECK(draft_tokens <= 3 * drafts);
  CHECK(accepted >= 0);
  CHECK(accepted <= draft_tokens);
  double per_pos = 0.0;
  for (int p = 0; p < 3; ++p) {
    const double v = sample(text, R"(vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-qwen",position=")" +
                                      std::to_string(p) + "\"}");
    CHECK(v >= 0);
    per_pos += v;
  }
  CHECK(per_pos == accepted);
  const double ratio = sample(text, R"(kvfleet_spec_decode_acceptance_ratio{method="ngram"})");
  CHECK(ratio == doctest::Approx(accepted / draft_tokens));
}
