// The expert-parallel request channel (engine/ep/channel.h) and its bodies (ep/wire.h): requests,
// outputs and stats survive the trip exactly (floats bit for bit); a peer that closes, goes silent or
// sends garbage is reported once, in time.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <future>
#include <thread>

#include "engine/ep/channel.h"
#include "engine/ep/wire.h"

using namespace kvfleet;
using namespace std::chrono_literals;

TEST_CASE("ep wire: a request, an output and stats read back exactly") {
  GenerationRequest r;
  r.prompt = {1, 2, 3, 151643};
  r.sampling.temperature = std::nextafter(0.7f, 1.0f);  // a float whose decimal text is long
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.9f;
  r.sampling.min_p = 1e-7f;
  r.sampling.seed = 0xfedcba9876543210ull;
  r.max_tokens = 77;
  r.ignore_eos = true;
  r.stop_token_ids = {5, 6};
  r.stop = {"\n\n", "é"};
  r.detokenize = true;
  r.skip_special_tokens = true;
  r.priority = -3;
  r.penalties = {0.5f, -0.25f, 1.1f};
  r.logprobs = 3;
  r.logit_bias = {{7, -100.0f}, {8, 0.3f}};
  r.cache_salt = "tenant";
  const GenerationRequest back = ep::request_from_json(boost::json::parse(boost::json::serialize(ep::to_json(r))).as_object());
  CHECK(back.prompt == r.prompt);
  CHECK(std::bit_cast<std::uint32_t>(back.sampling.temperature) == std::bit_cast<std::uint32_t>(r.sampling.temperature));
  CHECK(back.sampling.top_k == 40);
  CHECK(back.sampling.top_p == r.sampling.top_p);
  CHECK(back.sampling.min_p == r.sampling.min_p);
  CHECK(back.sampling.seed == r.sampling.seed);
  CHECK(back.max_tokens == 77);
  CHECK(back.ignore_eos);
  CHECK(back.stop_token_ids == r.stop_token_ids);
  CHECK(back.stop == r.stop);
  CHECK((back.detokenize && back.skip_special_tokens));
  CHECK(back.priority == -3);
  CHECK(back.penalties.frequency == -0.25f);
  CHECK(back.penalties.repetition == 1.1f);
  CHECK(back.logprobs == 3);
  CHECK(back.logit_bias == r.logit_bias);
  CHECK(back.cache_salt == "tenant");

  RequestOutput o;
  o.new_tokens = {9, 10};
  o.text = std::string("hi\xc3\xa9");
  o.finished = true;
  o.finish_reason = FinishReason::stop;
  o.stop_string.assign(1, '\n');  // (GCC 12 -Wrestrict misfires on assigning a short literal here)
  o.num_prompt_tokens = 4;
  o.num_cached_tokens = 2;
  o.queue_time_s = 0.125;
  o.logprobs = {{-0.1f, {{9, -0.1f}, {3, -2.5f}}}, {-1.0f / 3.0f, {}}};
  const RequestOutput ob = ep::output_from_json(boost::json::parse(boost::json::serialize(ep::to_json(o))).as_object());
  CHECK(ob.new_tokens == o.new_tokens);
  CHECK(ob.text == o.text);
  CHECK(ob.finished);
  CHECK(ob.finish_reason == FinishReason::stop);
  CHECK(ob.stop_string == "\n");
  CHECK(ob.num_prompt_tokens == 4);
  CHECK(ob.num_cached_tokens == 2);
  CHECK(ob.queue_time_s == 0.125);
  REQUIRE(ob.logprobs.size() == 2);
  CHECK(ob.logprobs[1].logprob == o.logprobs[1].logprob);
  CHECK(ob.logprobs[0].top[1].id == 3);
  RequestOutput mid;
  mid.new_tokens = {1};
  CHECK_FALSE(ep::output_from_json(ep::to_json(mid)).finished);

  EngineStats s;
  s.scheduler.num_running = 3;
  s.scheduler.kv.num_blocks = 64;
  s.scheduler.kv.prefix_hit_tokens = 1234;
  s.finished = {0, 5, 6, 7};
  s.moe.expert_tokens = {1, 2, 3, 4};
  s.moe.imbalance_sum = 2.5;
  const EngineStats sb = ep::stats_from_json(ep::to_json(s));
  CHECK(sb.scheduler.num_running == 3);
  CHECK(sb.scheduler.kv.num_blocks == 64);
  CHECK(sb.scheduler.kv.prefix_hit_tokens == 1234);
  CHECK(sb.finished == s.finished);
  CHECK(sb.moe.expert_tokens == s.moe.expert_tokens);
  CHECK(sb.moe.imbalance_sum == 2.5);

  CHECK_THROWS_AS(ep::request_from_json(boost::json::object{{"prompt", boost::json::array{1}}}), std::invalid_argument);
}

namespace {

struct Received {
  std::mutex mu;
  std::vector<std::int64_t> seen;  // each message's "i"
  std::promise<std::string> closed;
  std::atomic<int> closes{0};
};

std::unique_ptr<ep::Channel> channel_on(int fd, std::chrono::milliseconds timeout, Received& got) {
  auto c = std::make_unique<ep::Channel>(
      fd, timeout,
      [&got](ep::Message& m) {
        std::lock_guard lock(got.mu);
        got.seen.push_back(m.at("i").as_int64());
      },
      [&got](const std::string& why) {
        if (got.closes++ == 0) got.closed.set_value(why);
      });
  c->start();
  return c;
}

}  // namespace

TEST_CASE("ep channel: messages arrive in order; heartbeats keep an idle peer alive; a closed peer is reported once") {
  unsigned short port = 0;
  const int listener = ep::listen_tcp("127.0.0.1", port);
  auto accepted = std::async(std::launch::async, [&] { return ep::accept_tcp(listener, 5s); });
  const int client_fd = ep::connect_tcp("127.0.0.1", port, 5s);
  const int server_fd = accepted.get();
  ::close(listener);
  Received a, b;
  auto ca = channel_on(client_fd, 400ms, a);
  auto cb = channel_on(server_fd, 400ms, b);
  for (int i = 0; i < 100; ++i) ca->send(ep::Message{{"t", "m"}, {"i", i}});
  std::this_thread::sleep_for(1s);  // over twice the timeout with nothing but pings
  {
    std::lock_guard lock(b.mu);
    REQUIRE(b.seen.size() == 100);
    for (std::size_t i = 0; i < b.seen.size(); ++i) CHECK(b.seen[i] == static_cast<std::int64_t>(i));
  }
  CHECK(a.closes == 0);
  CHECK(b.closes == 0);
  auto closed = b.closed.get_future();
  ca.reset();  // our own close reports nothing on this side; the peer hears it at once
  REQUIRE(closed.wait_for(2s) == std::future_status::ready);
  CHECK(closed.get().find("closed") != std::string::npos);
  CHECK(a.closes == 0);
  CHECK(b.closes == 1);
}

TEST_CASE("ep channel: a silent peer times out; a frame too large or not JSON ends the channel") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  Received got;
  const auto start = std::chrono::steady_clock::now();
  auto c = channel_on(fds[0], 300ms, got);
  auto closed = got.closed.get_future();
  REQUIRE(closed.wait_for(3s) == std::future_status::ready);  // fds[1] never writes
  CHECK(std::chrono::steady_clock::now() - start >= 300ms);
  CHECK(closed.get().find("sent nothing for 300 ms") != std::string::npos);
  c.reset();
  ::close(fds[1]);

  const std::vector<std::string> bad_frames{std::string("\xff\xff\xff\x7f", 4), std::string("\x03\0\0\0abc", 7)};
  for (const std::string& bad : bad_frames) {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    Received g;
    auto ch = channel_on(fds[0], 5s, g);
    REQUIRE(::write(fds[1], bad.data(), bad.size()) == static_cast<ssize_t>(bad.size()));
    auto f = g.closed.get_future();
    REQUIRE(f.wait_for(3s) == std::future_status::ready);
    CHECK(f.get().find("frame") != std::string::npos);
    ch.reset();
    ::close(fds[1]);
  }
}
