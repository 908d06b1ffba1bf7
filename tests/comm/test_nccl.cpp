// The NCCL communicator's CPU side (runs everywhere): the ncclUniqueId exchange through the TCP store,
// --ep-comm selection, argument checks and the clear error without NCCL or a device, and the MoE device
// exchange path (MoeLayers::forward_ep_device, what NCCL ranks run) on the CPU backend, whose "device"
// memory is host memory, against the single-rank runner bit for bit. The GPU side: test_nccl_gpu.cpp.
#include <doctest/doctest.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstring>

#include "comm/ep_runner.h"
#include "engine/comm/nccl_rendezvous.h"
#include "engine/comm/tcp_store.h"
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

int visible_gpus() {
#ifdef KVFLEET_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

// An in-process rank that asks for device-memory exchanges: MoeLayers then takes the path NCCL ranks
// take, and the base class's all_to_all_v_device (host-addressable memory) does the exchange.
class DeviceExchange final : public Communicator {
 public:
  explicit DeviceExchange(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                         std::vector<std::size_t>& recv_bytes) override {
    return inner_.all_to_all_v(send, send_bytes, recv_bytes);
  }
  void all_gather(const void* send, std::size_t bytes, void* recv) override { inner_.all_gather(send, bytes, recv); }
  void barrier() override { inner_.barrier(); }
  bool device_memory() const override { return true; }
  void all_to_all_v_device(const void* d_send, const std::vector<std::size_t>& send_bytes, void* d_recv,
                           const std::vector<std::size_t>& recv_bytes, void* stream) override {
    ++device_calls;
    Communicator::all_to_all_v_device(d_send, send_bytes, d_recv, recv_bytes, stream);
  }
  int device_calls = 0;

 private:
  Communicator& inner_;
};

void check_device_path_equals_single_rank(const Model& model) {
  const auto seqs = test::ep_workload();
  const int steps = test::ep_steps(seqs);
  auto cpu = make_cpu_backend(1);
  test::EpLogits want;
  for (int i = 0; i < static_cast<int>(seqs.size()); ++i) {
    const auto one = test::run_ep_rank(model, *cpu, seqs, {i}, steps, nullptr);
    want.insert(one.begin(), one.end());
  }
  for (int ep : {2, 4}) {
    CAPTURE(ep);
    const auto mine = test::ep_split(static_cast<int>(seqs.size()), ep);
    auto group = make_in_process_group(ep);
    std::vector<std::unique_ptr<DeviceExchange>> comms;
    for (auto& c : group) comms.push_back(std::make_unique<DeviceExchange>(*c));
    std::vector<test::EpLogits> got(static_cast<std::size_t>(ep));
    const auto errors = test::on_threads(ep, [&](int r) {
      auto backend = make_cpu_backend(1);
      const auto ur = static_cast<std::size_t>(r);
      got[ur] = test::run_ep_rank(model, *backend, seqs, mine[ur], steps, comms[ur].get());
    });
    test::EpLogits all;
    for (int r = 0; r < ep; ++r) {
      CHECK(errors[static_cast<std::size_t>(r)] == "");
      // 3 device exchanges per sparse layer and step: the path under test really ran, idle ranks too
      CHECK(comms[static_cast<std::size_t>(r)]->device_calls >= 3 * steps);
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
}

}  // namespace

TEST_CASE("NCCL rendezvous: rank 0's unique id reaches every rank through the TCP store") {
  comm::TcpStoreServer server("127.0.0.1", 0);
  const int n = 4;
  std::vector<std::vector<char>> got(n);
  int made = 0;
  const auto errors = test::on_threads(n, [&](int r) {
    comm::TcpStoreClient client("127.0.0.1", server.port(), 5000ms);
    got[static_cast<std::size_t>(r)] = comm::share_unique_id(client, r, "nccl/unique_id", 128, [&] {
      ++made;  // only rank 0 calls it
      std::vector<char> id(128);
      for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7 + 1);
      return id;
    });
  });
  CHECK(made == 1);
  for (int r = 0; r < n; ++r) {
    CHECK(errors[static_cast<std::size_t>(r)] == "");
    REQUIRE(got[static_cast<std::size_t>(r)].size() == 128);
    CHECK(got[static_cast<std::size_t>(r)] == got[0]);
  }
  CHECK(got[0][5] == static_cast<char>(36));

  // A value of the wrong size under the key (another program on the port) and a rank 0 that never comes.
  comm::TcpStoreClient client("127.0.0.1", server.port(), 300ms);
  client.set("other/id", std::vector<char>(16, 'x'));
  CHECK_THROWS_AS(comm::share_unique_id(client, 1, "other/id", 128, [] { return std::vector<char>(); }),
                  CommunicatorError);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(comm::share_unique_id(client, 1, "never/id", 128, [] { return std::vector<char>(); }),
                  CommunicatorError);
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK_THROWS_AS(comm::share_unique_id(client, 0, "bad/id", 128, [] { return std::vector<char>(3); }),
                  CommunicatorError);
}

TEST_CASE("--ep-comm: gloo, nccl or auto (nccl for CUDA ranks when built with NCCL)") {
  EpCommOptions o;
  o.backend_kind = "cpu";
  CHECK(resolve_ep_comm(o) == "gloo");
  o.kind = "gloo";
  CHECK(resolve_ep_comm(o) == "gloo");
  o.kind = "nccl";
  CHECK_THROWS_AS(resolve_ep_comm(o), std::invalid_argument);  // NCCL exchanges device memory
  CHECK_THROWS_WITH_AS(resolve_ep_comm(o), doctest::Contains("use --ep-comm gloo"), std::invalid_argument);
  o.backend_kind = "cuda";
  if (nccl_available()) {
    CHECK(resolve_ep_comm(o) == "nccl");
  } else {  // asked for by name in a build without it: say so at startup, not at the first collective
    CHECK_THROWS_WITH_AS(resolve_ep_comm(o), doctest::Contains("this build has no NCCL"), std::invalid_argument);
  }
  o.kind = "auto";
  CHECK(resolve_ep_comm(o) == (nccl_available() ? "nccl" : "gloo"));
  o.backend_kind = "auto";
  CHECK(resolve_ep_comm(o) == (nccl_available() && visible_gpus() > 0 ? "nccl" : "gloo"));
  o.kind = "mpi";
  CHECK_THROWS_AS(resolve_ep_comm(o), std::invalid_argument);
  MESSAGE("this build " << std::string(nccl_available() ? "links" : "does not link") << " NCCL; " << visible_gpus()
                        << " CUDA device(s) visible");
}

TEST_CASE("NCCL communicator: bad ranks are refused; without NCCL or a device, a clear CommunicatorError") {
  NcclOptions o;
  o.master = "127.0.0.1:" + std::to_string(free_port());
  o.size = 2;
  o.rank = 2;
  CHECK_THROWS_AS(make_nccl_communicator(o), std::invalid_argument);
  o.rank = -1;
  CHECK_THROWS_AS(make_nccl_communicator(o), std::invalid_argument);
  if (nccl_available() && visible_gpus() > 0) {
    MESSAGE("SKIP (missing-device case): a CUDA device is visible; test_nccl_gpu.cpp covers the real group");
    return;
  }
  o.rank = 0;
  o.timeout = 500ms;
  std::string what;
  try {
    make_nccl_communicator(o);
  } catch (const CommunicatorError& e) {
    what = e.what();
  }
  CAPTURE(what);
  CHECK(what.find("expert-parallel rank 0 of 2") != std::string::npos);
  CHECK(what.find(nccl_available() ? "NCCL needs a CUDA device" : "this build has no NCCL") != std::string::npos);
  CHECK(nccl_default_device(3) == -1);
}

TEST_CASE("Communicator::all_to_all_v_device (host-addressable default): pieces in source order, counts checked") {
  auto group = make_in_process_group(2);
  std::vector<std::vector<std::uint8_t>> recv(2);
  const auto errors = test::on_threads(2, [&](int r) {
    // rank r sends (d + 1) * (r + 1) bytes of value 10 r + d to rank d
    std::vector<std::uint8_t> send;
    std::vector<std::size_t> sizes;
    for (int d = 0; d < 2; ++d) {
      sizes.push_back(static_cast<std::size_t>((d + 1) * (r + 1)));
      send.insert(send.end(), sizes.back(), static_cast<std::uint8_t>(10 * r + d));
    }
    const std::vector<std::size_t> expect = {static_cast<std::size_t>(r + 1), static_cast<std::size_t>(2 * (r + 1))};
    recv[static_cast<std::size_t>(r)].resize(expect[0] + expect[1]);
    group[static_cast<std::size_t>(r)]->all_to_all_v_device(send.data(), sizes, recv[static_cast<std::size_t>(r)].data(),
                                                            expect, nullptr);
    // a receiver whose counts are wrong is told so, never written past
    std::vector<std::uint8_t> small(1);
    group[static_cast<std::size_t>(r)]->all_to_all_v_device(send.data(), sizes, small.data(), {1, 0}, nullptr);
  });
  CHECK(recv[0] == std::vector<std::uint8_t>{0, 10, 10});
  CHECK(recv[1] == std::vector<std::uint8_t>{1, 1, 11, 11, 11, 11});
  CHECK(errors[0].find("differ from the expected receive counts") != std::string::npos);
  CHECK(errors[1].find("differ from the expected receive counts") != std::string::npos);
}

TEST_CASE("MoE device exchange path (NCCL's) on the CPU backend: logits of ep 2 and 4 equal one rank's bit for bit") {
  test::TempDir dir;
  SUBCASE("mixtral") {
    MakeModelOptions o;
    o.arch = "mixtral";
    o.layers = 2;
    o.seed = 11;
    make_model(o, dir.path());
    check_device_path_equals_single_rank(Model::load(dir.path()));
  }
  SUBCASE("qwen2_moe packed, shared expert, a dense layer, bf16") {
    MakeModelOptions o;
    o.arch = "qwen2_moe";
    o.layers = 3;
    o.mlp_only_layers = {1};
    o.packed_experts = true;
    o.dtype = DType::bf16;
    o.seed = 5;
    make_model(o, dir.path());
    check_device_path_equals_single_rank(Model::load(dir.path()));
  }
}
