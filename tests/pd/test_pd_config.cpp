// The replica's role and KV transfer settings: YAML keys and flags (flags win), bad values named.
#include <doctest/doctest.h>

#include "engine/server/replica_config.h"

using namespace kvfleet::server;

namespace {

ReplicaConfig parse(std::vector<std::string> args) {
  std::vector<const char*> argv{"kvfleet-replica", "--model", "m"};
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_replica_args(static_cast<int>(argv.size()), argv.data(), nullptr);
}

}  // namespace

TEST_CASE("role and pd settings from YAML and flags") {
  ReplicaConfig c;
  apply_replica_yaml("role: prefill\npd_lease_ms: 250\npd_io_timeout_ms: 700\npd_connect_timeout_ms: 90\n"
                     "pd_transfer_timeout_ms: 5000\npd_pull_blocks: 4\n", "r.yaml", c);
  CHECK(c.role == "prefill");
  CHECK(c.pd.lease.count() == 250);
  CHECK(c.pd.io_timeout.count() == 700);
  CHECK(c.pd.connect_timeout.count() == 90);
  CHECK(c.pd.transfer_timeout.count() == 5000);
  CHECK(c.pd.pull_blocks == 4);
  const ReplicaConfig f = parse({"--role", "decode", "--pd-lease-ms", "1234", "--pd-io-timeout-ms", "55", "--pd-pull-blocks", "2"});
  CHECK(f.role == "decode");
  CHECK(f.pd.lease.count() == 1234);
  CHECK(f.pd.io_timeout.count() == 55);
  CHECK(f.pd.pull_blocks == 2);
  CHECK(parse({}).role == "mixed");
  CHECK(parse({}).pd.lease.count() == 10000);
  CHECK_THROWS_AS(parse({"--role", "both"}), std::invalid_argument);
  CHECK_THROWS_AS(parse({"--pd-lease-ms", "0"}), std::invalid_argument);
  CHECK_THROWS_WITH(apply_replica_yaml("pd_lease_ms: soon\n", "r.yaml", c), "r.yaml: 'pd_lease_ms' has a bad value 'soon'");
}

TEST_CASE("pd_transports and pd_ucx_port: YAML and flags, tcp by default, bad names refused by name") {
  CHECK(parse({}).pd.transports == std::vector<std::string>{"tcp"});
  const ReplicaConfig example = parse({"--config", std::string(KVFLEET_SOURCE_DIR) + "/examples/replica.yaml"});
  CHECK(example.pd.transports == std::vector<std::string>{"tcp"});  // the example documents the keys
  CHECK(example.pd.ucx_port == 0);
  ReplicaConfig c;
  apply_replica_yaml("pd_transports: tcp\npd_ucx_port: 4711\n", "r.yaml", c);
  CHECK(c.pd.transports == std::vector<std::string>{"tcp"});
  CHECK(c.pd.ucx_port == 4711);
  CHECK_THROWS_WITH(apply_replica_yaml("pd_transports: tcp,rdma\n", "r.yaml", c),
                    doctest::Contains("unknown KV transport 'rdma'"));
  CHECK_THROWS_WITH(parse({"--pd-transports", "tcp,rdma"}), doctest::Contains("--pd-transports: unknown KV transport 'rdma'"));
#if KVFLEET_UCX
  CHECK(parse({"--pd-transports", "ucx,tcp"}).pd.transports == std::vector<std::string>{"ucx", "tcp"});
  CHECK(parse({"--pd-ucx-port", "5000"}).pd.ucx_port == 5000);
#else
  CHECK_THROWS_WITH(parse({"--pd-transports", "ucx,tcp"}), doctest::Contains("not in this build"));
#endif
}
