// kvfleet-replica --ep-size N: N expert-parallel ranks behind one endpoint, in process or (--ep-rank R
// --ep-master) one per process. Answers equal the single-engine replica's, a shared prefix meets its
// rank's cache (usage.cached_tokens), and the KV event stream carries dp_rank. Over processes also: a rank
// killed mid-run ends the requests with an error naming it, rank 0 going ends the others, a client that
// hangs up cancels on the rank that runs it, and each rank's own KV capacity decides admission (400).
#include <doctest/doctest.h>

#include <future>

#ifdef KVFLEET_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

#include "engine/server/replica_config.h"
#include "kvfleet/communicator.h"
#include "server/ep_fixture.h"

using namespace kvfleet;
namespace json = boost::json;
using test::completion;
using test::make_tiny_mixtral;
using test::read_events;

namespace {
bool cuda_visible() {
#ifdef KVFLEET_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
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
    const std::string events = read_events(ep.port(), {"\"dp_rank\""}, 10);
    CHECK(events.find("\"type\":\"stored\"") != std::string::npos);
    CHECK(events.find("\"dp_rank\"") != std::string::npos);
    CHECK(ep.metric("kvfleet_moe_steps_total") > 0);
    // /internal/kv_state: every in-process rank's cache, with its dp_rank; the top sums them.
    const auto state = json::parse(ep.get("/internal/kv_state").body).as_object();
    const auto& ranks = state.at("ranks").as_array();
    REQUIRE(ranks.size() == static_cast<std::size_t>(std::stoi(n)));
    std::int64_t blocks = 0, cached_blocks = 0;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      CHECK(ranks[r].at("dp_rank").as_int64() == static_cast<std::int64_t>(r));
      CHECK(ranks[r].at("integrity").as_string() == "ok");
      blocks += ranks[r].at("num_blocks").as_int64();
      cached_blocks += ranks[r].at("cached_blocks").as_int64();
    }
    CHECK(state.at("integrity").as_string() == "ok");
    CHECK(state.at("num_blocks").as_int64() == blocks);
    CHECK(state.at("cached_blocks").as_int64() == cached_blocks);
    CHECK(cached_blocks > 0);
  }
  CHECK(test::run_command(test::bin_dir() + "/kvfleet-replica --model /nonexistent --ep-size 0 2>&1").status != 0);
}

TEST_CASE("ep_size, ep_rank, ep_master, ep_bind, ep_timeout_ms: YAML keys and flags; needs role mixed and a MoE model") {
  server::ReplicaConfig c;
  server::apply_replica_yaml("model: m\nep_size: 4\nep_rank: 2\nep_master: 10.0.0.1:29500\nep_bind: 10.0.0.3\n"
                             "ep_timeout_ms: 1500\nep_join_timeout_ms: 90000\nep_comm: gloo\n", "r.yaml", c);
  CHECK(c.ep_comm == "gloo");
  CHECK(server::ep_comm_options(c).kind == "gloo");
  CHECK(c.ep_size == 4);
  CHECK(c.ep_rank == 2);
  CHECK(c.ep_master == "10.0.0.1:29500");
  CHECK(c.ep_bind == "10.0.0.3");
  CHECK(c.ep_timeout.count() == 1500);
  CHECK(c.ep_join_timeout.count() == 90000);
  CHECK(server::ep_comm_options(c).join_timeout.count() == 90000);
  const auto parse = [](std::vector<const char*> argv) {
    argv.insert(argv.begin(), "kvfleet-replica");
    return server::parse_replica_args(static_cast<int>(argv.size()), argv.data(), nullptr);
  };
  CHECK(parse({"--model", "m", "--ep-size", "2", "--ep-rank", "1", "--ep-master", "h:1"}).ep_processes());
  CHECK_THROWS_WITH_AS(parse({"--model", "m", "--ep-size", "2", "--ep-rank", "1"}), "--ep-rank needs --ep-master HOST:PORT",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse({"--model", "m", "--ep-size", "2", "--ep-rank", "2", "--ep-master", "h:1"}),
                       "--ep-rank 2 must be below --ep-size 2", std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse({"--model", "m", "--ep-master", "h:1"}), "--ep-master needs --ep-rank", std::invalid_argument);
  // --ep-comm gloo|nccl|auto: checked at startup, with what to do instead.
  CHECK(parse({"--model", "m", "--ep-size", "2", "--ep-rank", "1", "--ep-master", "h:1", "--ep-comm", "gloo"}).ep_comm == "gloo");
  CHECK_THROWS_WITH_AS(parse({"--model", "m", "--ep-size", "2", "--ep-comm", "gloo"}),
                       "--ep-comm needs --ep-rank (in-process ranks exchange through memory)", std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse({"--model", "m", "--ep-size", "2", "--ep-rank", "0", "--ep-master", "h:1", "--ep-comm", "mpi"}),
                       "--ep-comm 'mpi': use gloo, nccl or auto", std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse({"--model", "m", "--ep-size", "2", "--ep-rank", "0", "--ep-master", "h:1", "--ep-comm", "nccl",
                              "--backend", "cpu"}),
                       doctest::Contains("--ep-comm nccl exchanges device memory: it needs --backend cuda"), std::invalid_argument);
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
  // NCCL where it cannot run fails at startup with why, not at the first collective nor after the join
  // timeout: no GPU visible (or a build without NCCL).
  if (!cuda_visible()) {
    const auto nccl = test::run_command(test::bin_dir() + "/kvfleet-replica --port 0 --backend auto --model " +
                                        (dir / "m").string() + " --ep-size 2 --ep-rank 0 --ep-master " + test::free_master() +
                                        " --ep-comm nccl 2>&1");
    CAPTURE(nccl.out);
    CHECK(nccl.status != 0);
    CHECK(nccl.out.find(nccl_available() ? "NCCL needs a CUDA device and this process sees none" : "this build has no NCCL") !=
          std::string::npos);
  }
}
