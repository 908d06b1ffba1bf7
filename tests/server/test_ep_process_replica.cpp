// kvfleet-replica --ep-size N --ep-rank R --ep-master HOST:PORT: one expert-parallel rank per process,
// rank 0 serving HTTP, the others reached through the request channel. Real processes on loopback.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <future>
#include <sstream>
#include <set>
#include <thread>

#include "kvfleet/block_hash.h"
#include "kvfleet/communicator.h"
#include "server/ep_fixture.h"

#ifdef KVFLEET_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

using namespace kvfleet;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

json::object request_body(const std::string& prompt, int i, bool stream, int max_tokens) {
  json::object body{{"model", "tiny-moe"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}};
  if (i % 2) {
    body["temperature"] = 0.9;
    body["seed"] = 7 + i;
  } else {
    body["temperature"] = 0.0;
  }
  if (stream) body["stream"] = true;
  return body;
}

// The completion's text: the one choice's, or every chunk's joined (a stream must end with a finish
// reason and [DONE]).
std::string text_of(const http::Response& res, bool stream) {
  REQUIRE(res.status == 200);
  if (!stream) return std::string(json::parse(res.body).at("choices").at(0).at("text").as_string());
  REQUIRE(res.body.ends_with("data: [DONE]\n\n"));
  std::string text, finish;
  std::size_t at = 0;
  while ((at = res.body.find("data: {", at)) != std::string::npos) {
    const auto end = res.body.find("\n\n", at);
    const auto chunk = json::parse(res.body.substr(at + 6, end - at - 6));
    const auto& choice = chunk.at("choices").at(0);
    text += choice.at("text").as_string();
    if (choice.at("finish_reason").is_string()) finish = choice.at("finish_reason").as_string();
    at = end;
  }
  CHECK(finish == "length");
  return text;
}

std::vector<std::string> prompts() {
  std::vector<std::string> out;
  const std::string system(300, 's');
  for (int i = 0; i < 10; ++i) out.push_back((i % 3 ? system : std::string()) + " question " + std::to_string(i * 7919));
  return out;
}

// Each prompt's text, sent all at once (continuous batching over the ranks); every third one streamed.
std::vector<std::string> answers(std::uint16_t port, int max_tokens) {
  const auto ps = prompts();
  std::vector<std::future<std::string>> futures;
  for (std::size_t i = 0; i < ps.size(); ++i)
    futures.push_back(std::async(std::launch::async, [&, i] {
      const bool stream = i % 3 == 2;
      const auto body = request_body(ps[i], static_cast<int>(i), stream, max_tokens + static_cast<int>(i % 4) * 3);
      return text_of(http::http_request("127.0.0.1", port, "POST", "/v1/completions", json::serialize(body),
                                        {{"Content-Type", "application/json"}}, std::chrono::seconds(60)),
                     stream);
    }));
  std::vector<std::string> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

// Opens a streaming request on a raw socket and reads until its first chunk; returns the socket.
int open_stream(std::uint16_t port, const std::string& body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  REQUIRE(::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size()));
  const timeval limit{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    got.append(buf, static_cast<std::size_t>(n));
  }
  return fd;
}

// CPU time (user + system) a process used so far, in clock ticks.
long cpu_ticks(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

double metric_of(const std::string& text, const std::string& line_start) {
  const auto at = text.find("\n" + line_start + " ");
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + line_start.size() + 2));
}

}  // namespace

TEST_CASE("kvfleet-replica --ep-rank: 2 and 4 processes behind rank 0's HTTP answer as the single replica") {
  test::ReplicaProcess one({"--ep-size", "1"}, test::make_tiny_mixtral, "tiny-moe");
  const auto want = answers(one.port(), 6);
  for (int n : {2, 4}) {
    CAPTURE(n);
    test::EpProcessGroup group(n, {"--ep-timeout-ms", "10000"});
    const auto got = answers(group.port(), 6);
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i] == want[i]);
    }
    // The shared prefix ran on one rank and the other prompts spread (uneven load): the merged stream
    // names the ranks that stored blocks (with 2 ranks both; with 4 at least two, as arrivals decide).
    const std::string events =
        test::read_events(group.port(), n == 2 ? std::vector<std::string>{"\"dp_rank\":0", "\"dp_rank\":1"}
                                               : std::vector<std::string>{"\"dp_rank\""}, 10, std::chrono::milliseconds(500));
    std::set<int> dp_ranks;
    for (std::size_t at = 0; (at = events.find("\"dp_rank\":", at)) != std::string::npos; at += 10)
      dp_ranks.insert(events[at + 10] - '0');
    CHECK(dp_ranks.size() >= 2);
    if (n == 2) CHECK(dp_ranks == std::set<int>{0, 1});
    double finished = 0;
    for (int i = 0; i < 50 && finished < 10; ++i) {  // a remote rank's stats arrive every 200 ms
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      finished = metric_of(group.get("/metrics").body, "kvfleet_requests_finished_total{finish_reason=\"length\"}");
    }
    CHECK(finished == 10);
    const auto again = json::parse(test::completion(group.port(), std::string(300, 's') + " one more", 0));
    CHECK(again.at("usage").at("prompt_tokens_details").at("cached_tokens").to_number<int>() >= 16);
    CHECK(group.get("/health").status == 200);
  }
}

TEST_CASE("kvfleet-replica --ep-rank: a rank killed mid-run ends every request with an error naming it, no hang") {
  test::EpProcessGroup group(2, {"--ep-timeout-ms", "2000"});
  auto stream = std::async(std::launch::async, [&] {
    return group.post(json::serialize(request_body("a long story", 0, true, 2000)));
  });
  auto plain = std::async(std::launch::async, [&] {
    return group.post(json::serialize(request_body("another long story, told slowly", 1, false, 2000)));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  group.rank(1).signal(SIGKILL);
  const auto killed = Clock::now();
  const auto s = stream.get();
  const auto p = plain.get();
  CHECK(Clock::now() - killed < std::chrono::seconds(6));  // the 2 s timeout at most, plus slack
  CHECK(s.status == 200);
  CHECK(s.body.find("\"text_completion\"") != std::string::npos);  // it had started
  CHECK(s.body.find("{\"error\":{\"message\":\"expert-parallel rank 1 of 2 is gone") != std::string::npos);
  CHECK(s.body.ends_with("data: [DONE]\n\n"));
  CHECK(p.status == 500);
  CHECK(p.body.find("expert-parallel rank 1 of 2 is gone") != std::string::npos);
  const auto health = group.get("/health");
  CHECK(health.status == 503);
  CHECK(health.body.find("rank 1 of 2") != std::string::npos);
  const auto after = group.post(json::serialize(request_body("after", 0, false, 4)));
  CHECK(after.status == 503);
  CHECK(after.body.find("rank 1 of 2") != std::string::npos);
  // /internal/kv_state still answers: rank 0's own figures, and for the lost rank why it cannot.
  const auto state = json::parse(group.get("/internal/kv_state").body).as_object();
  CHECK(std::string(state.at("integrity").as_string()).starts_with("rank 1: expert-parallel rank 1 of 2 is gone"));
  CHECK(state.at("ranks").at(0).at("integrity").as_string() == "ok");
  CHECK(state.at("ranks").at(1).as_object().contains("error"));
  group.rank(0).signal(SIGTERM);
  CHECK(group.rank(0).wait(std::chrono::seconds(10)) == 0);
}

TEST_CASE("kvfleet-replica --ep-rank: a rank that stops answering (SIGSTOP) fails the group within the timeout") {
  test::EpProcessGroup group(2, {"--ep-timeout-ms", "1500"});
  auto stream = std::async(std::launch::async, [&] {
    return group.post(json::serialize(request_body("a long story", 0, true, 2000)));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  group.rank(1).signal(SIGSTOP);
  const auto stopped = Clock::now();
  const auto s = stream.get();
  CHECK(Clock::now() - stopped < std::chrono::seconds(6));  // 1.5 s, a second for the channel's verdict, slack
  CHECK(s.status == 200);
  CHECK(s.body.find("{\"error\":{\"message\":\"expert-parallel rank") != std::string::npos);
  CHECK(s.body.ends_with("data: [DONE]\n\n"));
  CHECK(group.get("/health").status == 503);
  group.rank(1).signal(SIGKILL);
}

TEST_CASE("kvfleet-replica --ep-rank: rank 0 exiting ends the other ranks") {
  test::EpProcessGroup group(4, {"--ep-timeout-ms", "2000"});
  CHECK(group.get("/health").status == 200);
  group.rank(0).signal(SIGKILL);
  for (int r = 1; r < 4; ++r) {
    CAPTURE(r);
    CHECK(group.rank(r).wait(std::chrono::seconds(15)) == 1);
  }
}

TEST_CASE("kvfleet-replica --ep-rank: a hang-up cancels on the rank running it; each rank's cache admits; idle ranks sleep") {
  test::EpProcessGroup group(2, {"--num-kv-blocks", "16", "--ep-timeout-ms", "10000"});
  // The second stream starts while the first runs: it goes to the other (less loaded) rank.
  const int a = open_stream(group.port(), json::serialize(request_body("first long one", 0, true, 200)));
  const int b = open_stream(group.port(), json::serialize(request_body("second long one", 0, true, 200)));
  ::close(a);
  ::close(b);
  double aborted = 0, running = -1;
  for (int i = 0; i < 100 && (aborted < 2 || running != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string text = group.get("/metrics").body;
    aborted = metric_of(text, "kvfleet_requests_finished_total{finish_reason=\"abort\"}");
    running = metric_of(text, "kvfleet_requests_running");
  }
  CHECK(aborted == 2);
  CHECK(running == 0);
  // 16 blocks of 16 tokens per rank: a 300-token prompt fits no rank's cache. Distinct prompts spread
  // over both ranks (the idle tie-break hashes the first block, as ep/group.cpp's tie_break_of).
  std::set<int> ranks;
  for (int k = 0; k < 6; ++k) {
    std::vector<TokenId> ids(300);
    for (std::size_t t = 0; t < ids.size(); ++t) ids[t] = static_cast<TokenId>(100 + (t * 7 + static_cast<std::size_t>(k) * 13) % 500);
    ranks.insert(static_cast<int>(block_hash_next(block_hash_root("ep"), std::span<const TokenId>(ids).first(16)) % 2));
    json::object body{{"model", "tiny-moe"}, {"prompt", json::value_from(ids)}, {"max_tokens", 4}};
    const auto res = group.post(json::serialize(body));
    CAPTURE(res.body);
    CHECK(res.status == 400);
    CHECK(res.body.find("more than the KV cache holds") != std::string::npos);
  }
  CHECK(ranks == std::set<int>{0, 1});
  CHECK(group.get("/health").status == 200);
  // Idle, the ranks sleep (no vote every few milliseconds): under 50 ms of CPU each in a second, and the
  // next request still gets its answer.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long before0 = cpu_ticks(group.rank(0).pid()), before1 = cpu_ticks(group.rank(1).pid());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const long ticks_per_50ms = ::sysconf(_SC_CLK_TCK) / 20;
  CHECK(cpu_ticks(group.rank(0).pid()) - before0 <= ticks_per_50ms);
  CHECK(cpu_ticks(group.rank(1).pid()) - before1 <= ticks_per_50ms);
  CHECK(group.post(json::serialize(request_body("awake?", 0, false, 3))).status == 200);
}

namespace {

json::object kv_state(const test::EpProcessGroup& group) {
  const auto res = group.get("/internal/kv_state");
  REQUIRE(res.status == 200);
  return json::parse(res.body).as_object();
}

}  // namespace

TEST_CASE("kvfleet-replica --ep-rank: /internal/kv_state reports every rank with its dp_rank; it and /metrics are fresh") {
  test::EpProcessGroup group(2, {"--num-kv-blocks", "24", "--ep-timeout-ms", "10000"});
  const auto idle = kv_state(group);
  REQUIRE(idle.at("ranks").as_array().size() == 2);
  for (std::int64_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto& rank = idle.at("ranks").at(static_cast<std::size_t>(r)).as_object();
    CHECK(rank.at("dp_rank").as_int64() == r);
    CHECK(rank.at("integrity").as_string() == "ok");
    CHECK(rank.at("num_blocks").as_int64() == 24);  // each rank its own cache
    CHECK(rank.at("cached_blocks").as_int64() == 0);
  }
  CHECK(idle.at("integrity").as_string() == "ok");
  CHECK(idle.at("num_blocks").as_int64() == 48);
  // A prompt of full blocks on rank 1 only, named by data_parallel_rank: right after the answer, rank 1's
  // figures show them (asked over its channel, not from its 200 ms stats), rank 0's none.
  json::object body = request_body(std::string(300, 's') + " to rank one", 0, false, 3);
  body["data_parallel_rank"] = 1;
  REQUIRE(group.post(json::serialize(body)).status == 200);
  // A scrape asks the ranks too: rank 1's finished request counts at once, not after its next stats frame.
  CHECK(metric_of(group.get("/metrics").body, "kvfleet_requests_finished_total{finish_reason=\"length\"}") == 1);
  const auto after = kv_state(group);
  const auto& r0 = after.at("ranks").at(0).as_object();
  const auto& r1 = after.at("ranks").at(1).as_object();
  CHECK(r0.at("cached_blocks").as_int64() == 0);
  CHECK(r1.at("cached_blocks").as_int64() >= 1);
  CHECK(r1.at("running").as_int64() == 0);
  CHECK(after.at("cached_blocks").as_int64() == r1.at("cached_blocks").as_int64());
  CHECK(after.at("free_blocks").as_int64() == r0.at("free_blocks").as_int64() + r1.at("free_blocks").as_int64());
  CHECK(after.at("integrity").as_string() == "ok");
  CHECK(after.at("role").as_string() == "mixed");
}

// The replica's process ranks over NCCL (one GPU each): what they answer equals the same group over Gloo
// on the same CUDA backend (which equals one CUDA engine: the group's result does not depend on ep_size
// nor on the exchange). Needs >= 2 CUDA devices and a build with NCCL; elsewhere it prints SKIP and passes
// (KVFLEET_REQUIRE_NCCL=1 makes the skip a failure).
TEST_CASE("kvfleet-replica --ep-rank --ep-comm nccl: 2 GPU ranks answer as the same ranks over Gloo") {
  int gpus = 0;
#ifdef KVFLEET_HAVE_CUDA
  gpus = cuda_device_count();
#endif
  std::string why;
  if (!nccl_available()) why = "this build has no NCCL";
  else if (gpus < 2) why = "needs >= 2 CUDA devices, " + std::to_string(gpus) + " visible";
  if (!why.empty()) {
    if (std::getenv("KVFLEET_REQUIRE_NCCL")) FAIL("KVFLEET_REQUIRE_NCCL is set but the NCCL replica test cannot run: " << why);
    MESSAGE("SKIP: NCCL replica test not run (" << why << ")");
    return;
  }
  std::vector<std::string> want;
  {
    test::EpProcessGroup gloo(2, {"--ep-comm", "gloo", "--ep-timeout-ms", "20000"}, "cuda");
    want = answers(gloo.port(), 6);
  }
  test::EpProcessGroup nccl(2, {"--ep-comm", "nccl", "--ep-timeout-ms", "20000"}, "cuda");
  const auto got = answers(nccl.port(), 6);
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == want[i]);
  }
  const auto state = kv_state(nccl);
  CHECK(state.at("integrity").as_string() == "ok");
  CHECK(state.at("ranks").as_array().size() == 2);
  CHECK(nccl.get("/health").status == 200);
  // A rank that goes fails the group as over Gloo: 503 with its name.
  nccl.rank(1).signal(SIGKILL);
  const auto t0 = Clock::now();
  while (nccl.get("/health").status == 200 && Clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto health = nccl.get("/health");
  CHECK(health.status == 503);
  CHECK(health.body.find("rank 1 of 2") != std::string::npos);
}
