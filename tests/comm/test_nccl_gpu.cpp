// The NCCL communicator on real GPUs (>= 2 CUDA devices; one rank per device, ranks as threads of this
// process, the rendezvous over loopback TCP): its collectives equal the in-process communicator's on the
// same inputs, a peer that leaves fails the others in time, and a Mixtral's logits with ep 2 over NCCL on
// the CUDA backend equal one CUDA rank's bit for bit. Elsewhere every case prints SKIP and passes;
// KVFLEET_REQUIRE_NCCL=1 turns a skip into a failure.
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "comm/ep_runner.h"
#include "kvfleet/communicator.h"
#include "kvfleet/make_model.h"
#include "support/temp_dir.h"

#ifdef KVFLEET_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

using namespace kvfleet;
using namespace std::chrono_literals;

namespace {

unsigned short free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

// How many ranks the GPU tests can run (one per device, at most 4); 0 after printing why they skip.
int nccl_ranks_or_skip() {
  int gpus = 0;
#ifdef KVFLEET_HAVE_CUDA
  gpus = cuda_device_count();
#endif
  std::string why;
  if (!nccl_available()) why = "this build has no NCCL";
  else if (gpus < 2) why = "needs >= 2 CUDA devices, " + std::to_string(gpus) + " visible";
  if (why.empty()) return std::min(gpus, 4);
  if (std::getenv("KVFLEET_REQUIRE_NCCL")) FAIL("KVFLEET_REQUIRE_NCCL is set but the NCCL tests cannot run: " << why);
  MESSAGE("SKIP: NCCL GPU test not run (" << why << "); set KVFLEET_REQUIRE_NCCL=1 to make this a failure");
  return 0;
}

std::unique_ptr<Communicator> nccl_rank(int r, int n, const std::string& master, std::chrono::milliseconds timeout) {
  NcclOptions o;
  o.rank = r;
  o.size = n;
  o.master = master;
  o.device = r;
  o.timeout = timeout;
  return make_nccl_communicator(o);
}

std::unique_ptr<Backend> cuda_on(int device) {
  BackendOptions b;
  b.kind = "cuda";
  b.device = device;
  return make_backend(b);
}

// Round `round` of rank r's pieces: ((r + round) % 3) * (d + 1) * 5 bytes for rank d (empty ones too).
std::vector<std::size_t> piece_sizes(int r, int n, int round) {
  std::vector<std::size_t> s;
  for (int d = 0; d < n; ++d) s.push_back(static_cast<std::size_t>(((r + round) % 3) * (d + 1) * 5));
  return s;
}
std::vector<std::uint8_t> piece_bytes(int r, const std::vector<std::size_t>& sizes, int round) {
  std::vector<std::uint8_t> out;
  for (std::size_t d = 0; d < sizes.size(); ++d)
    for (std::size_t i = 0; i < sizes[d]; ++i) out.push_back(static_cast<std::uint8_t>(r * 37 + d * 11 + i + round));
  return out;
}

}  // namespace

TEST_CASE("NCCL communicator (>= 2 GPUs): all_to_all_v (host and device), all_gather and barrier equal in-process") {
  const int n = nccl_ranks_or_skip();
  if (n == 0) return;
  const std::string master = "127.0.0.1:" + std::to_string(free_port());
  auto reference = make_in_process_group(n);
  const auto errors = test::on_threads(n, [&](int r) {
    auto nccl = nccl_rank(r, n, master, 20000ms);
    auto backend = cuda_on(r);
    Communicator& ref = *reference[static_cast<std::size_t>(r)];
    for (int round = 0; round < 6; ++round) {
      const auto sizes = piece_sizes(r, n, round);
      const auto send = piece_bytes(r, sizes, round);
      std::vector<std::size_t> want_sizes, got_sizes;
      const auto want = ref.all_to_all_v(send.data(), sizes, want_sizes);
      const auto got = nccl->all_to_all_v(send.data(), sizes, got_sizes);
      if (got != want || got_sizes != want_sizes) throw std::runtime_error("host all_to_all_v differs");
      // the device variant, on the backend's stream, receive counts from the host round
      void* d_send = backend->allocate(send.size() + 1);
      void* d_recv = backend->allocate(want.size() + 1);
      backend->to_device(d_send, send.data(), send.size());
      nccl->all_to_all_v_device(d_send, sizes, d_recv, want_sizes, backend->stream_handle());
      std::vector<std::uint8_t> dev(want.size());
      backend->to_host(dev.data(), d_recv, dev.size());
      backend->deallocate(d_send);
      backend->deallocate(d_recv);
      if (dev != want) throw std::runtime_error("all_to_all_v_device differs");
      const std::int64_t mine = 1000 * r + round;
      std::vector<std::int64_t> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
      ref.all_gather(&mine, sizeof mine, a.data());
      nccl->all_gather(&mine, sizeof mine, b.data());
      if (a != b) throw std::runtime_error("all_gather differs");
      nccl->barrier();
    }
  });
  for (int r = 0; r < n; ++r) CHECK(errors[static_cast<std::size_t>(r)] == "");
}

TEST_CASE("NCCL communicator (>= 2 GPUs): a rank that leaves fails the other's next collective in time, then sticky") {
  if (nccl_ranks_or_skip() == 0) return;
  const std::string master = "127.0.0.1:" + std::to_string(free_port());
  std::string first, second;
  std::chrono::steady_clock::duration took{};
  const auto errors = test::on_threads(2, [&](int r) {
    auto nccl = nccl_rank(r, 2, master, 2000ms);
    nccl->barrier();
    if (r == 1) return;  // leaves: destroys its communicator without another collective
    const auto t0 = std::chrono::steady_clock::now();
    try {
      std::int32_t x = 1, y[2];
      nccl->all_gather(&x, sizeof x, y);
    } catch (const CommunicatorError& e) {
      first = e.what();
    }
    took = std::chrono::steady_clock::now() - t0;
    try {
      nccl->barrier();
    } catch (const CommunicatorError& e) {
      second = e.what();
    }
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(first.find("expert-parallel rank 0 of 2 (NCCL, device 0): all_gather failed") != std::string::npos);
  CHECK(second == first);
  CHECK(took < 10s);
}

TEST_CASE("MoE over NCCL on CUDA (>= 2 GPUs): Mixtral logits with ep 2 equal one CUDA rank's bit for bit") {
  const int n = nccl_ranks_or_skip();
  if (n == 0) return;
  test::TempDir dir;
  MakeModelOptions o;
  o.arch = "mixtral";
  o.layers = 2;
  o.dtype = DType::bf16;
  o.seed = 3;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  const auto seqs = test::ep_workload();
  const int steps = test::ep_steps(seqs);
  test::EpLogits want;
  {
    auto backend = cuda_on(0);
    for (int i = 0; i < static_cast<int>(seqs.size()); ++i) {
      const auto one = test::run_ep_rank(model, *backend, seqs, {i}, steps, nullptr);
      want.insert(one.begin(), one.end());
    }
  }
  const int ep = 2;
  const auto mine = test::ep_split(static_cast<int>(seqs.size()), ep);
  const std::string master = "127.0.0.1:" + std::to_string(free_port());
  std::vector<test::EpLogits> got(ep);
  const auto errors = test::on_threads(ep, [&](int r) {
    auto nccl = nccl_rank(r, ep, master, 20000ms);
    auto backend = cuda_on(r);
    got[static_cast<std::size_t>(r)] = test::run_ep_rank(model, *backend, seqs, mine[static_cast<std::size_t>(r)], steps,
                                                         nccl.get());
    nccl->barrier();
  });
  test::EpLogits all;
  for (int r = 0; r < ep; ++r) {
    CHECK(errors[static_cast<std::size_t>(r)] == "");
    all.insert(got[static_cast<std::size_t>(r)].begin(), got[static_cast<std::size_t>(r)].end());
  }
  REQUIRE(all.size() == want.size());
  for (const auto& [key, row] : want) {
    const auto seq = key.first, step = key.second;
    CAPTURE(seq);
    CAPTURE(step);
    CHECK(std::memcmp(all.at(key).data(), row.data(), row.size() * sizeof(float)) == 0);
  }
}
