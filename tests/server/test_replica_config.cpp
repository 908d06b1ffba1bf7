#include <doctest/doctest.h>

#include "engine/server/replica_config.h"
#include "kvfleet/files.h"

using namespace kvfleet::server;

namespace {

ReplicaConfig parse(std::vector<std::string> args) {
  std::vector<const char*> argv{"kvfleet-replica"};
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_replica_args(static_cast<int>(argv.size()), argv.data(), nullptr);
}

}  // namespace

TEST_CASE("the example config loads, and flags win over it") {
  const std::string path = std::string(KVFLEET_SOURCE_DIR) + "/examples/replica.yaml";
  const ReplicaConfig c = parse({"--config", path, "--port", "9001", "--num-kv-blocks", "77"});
  CHECK(c.model == "build/models/kvfleet-tiny");
  CHECK(c.port == 9001);
  CHECK(c.engine.num_blocks == 77);
  CHECK(c.engine.scheduler.max_num_seqs == 64);
  CHECK(c.drain_timeout.count() == 30000);
}

TEST_CASE("unknown keys and bad values fail, naming the key") {
  ReplicaConfig c;
  CHECK_THROWS_WITH(apply_replica_yaml("model: m\nnum_kv_blokcs: 5\n", "r.yaml", c),
                    "r.yaml: 'num_kv_blokcs' is not a known setting");
  CHECK_THROWS_WITH(apply_replica_yaml("port: lots\n", "r.yaml", c), "r.yaml: 'port' has a bad value 'lots'");
  CHECK_THROWS_WITH(apply_replica_yaml("role: both\n", "r.yaml", c), "r.yaml: 'role' must be mixed, prefill or decode");
  CHECK_THROWS_AS(apply_replica_yaml("- a\n- b\n", "r.yaml", c), std::invalid_argument);
  CHECK_THROWS_WITH(parse({"--port", "1"}), "--model (or 'model' in the config file) is required");
  CHECK_THROWS_AS(parse({"--model", "m", "--no-such-flag"}), std::invalid_argument);
}

TEST_CASE("API keys and special_tokens_in_content: YAML keys and flags") {
  ReplicaConfig c;
  apply_replica_yaml("api_key: k1\ninternal_api_key: k2\nspecial_tokens_in_content: true\n", "r.yaml", c);
  CHECK(c.api_key == "k1");
  CHECK(c.internal_api_key == "k2");
  CHECK(c.special_tokens_in_content);
  CHECK_THROWS_AS(apply_replica_yaml("special_tokens_in_content: maybe\n", "r.yaml", c), std::invalid_argument);
  const ReplicaConfig defaults = parse({"--model", "m"});
  CHECK(defaults.api_key.empty());
  CHECK(!defaults.special_tokens_in_content);  // typed special-token text is plain text unless asked
  const ReplicaConfig flags = parse({"--model", "m", "--api-key", "a", "--internal-api-key", "b",
                                     "--special-tokens-in-content"});
  CHECK(flags.api_key == "a");
  CHECK(flags.internal_api_key == "b");
  CHECK(flags.special_tokens_in_content);
  CHECK(!parse({"--model", "m", "--no-special-tokens-in-content"}).special_tokens_in_content);  // the default, spelled out
  // The example documents every new key with its default.
  const ReplicaConfig example = parse({"--config", std::string(KVFLEET_SOURCE_DIR) + "/examples/replica.yaml"});
  CHECK(example.api_key.empty());
  CHECK(!example.special_tokens_in_content);
}

TEST_CASE("connection caps and the header deadline: YAML keys, flags, defaults") {
  const ReplicaConfig defaults = parse({"--model", "m"});
  CHECK(defaults.header_timeout == std::chrono::milliseconds(10'000));
  CHECK(defaults.header_timeout < defaults.read_timeout);
  CHECK(defaults.max_connections == 4096);
  CHECK(!defaults.max_connections_per_peer);  // half of max_connections (HttpServerConfig::peer_cap)
  ReplicaConfig c;
  apply_replica_yaml("header_timeout_ms: 2000\nmax_connections: 100\nmax_connections_per_peer: 0\n", "r.yaml", c);
  CHECK(c.header_timeout == std::chrono::milliseconds(2000));
  CHECK(c.max_connections == 100);
  CHECK(c.max_connections_per_peer == std::optional<std::size_t>(0));
  CHECK_THROWS_WITH_AS(apply_replica_yaml("max_connections: 0\n", "r.yaml", c), doctest::Contains("max_connections"),
                       std::invalid_argument);
  const ReplicaConfig flags = parse({"--model", "m", "--header-timeout-ms", "500", "--max-connections", "64",
                                     "--max-connections-per-peer", "8"});
  CHECK(flags.header_timeout == std::chrono::milliseconds(500));
  CHECK(flags.max_connections == 64);
  CHECK(flags.max_connections_per_peer == std::optional<std::size_t>(8));
  CHECK_THROWS_AS(parse({"--model", "m", "--max-connections-per-peer", "-1"}), std::invalid_argument);
  const ReplicaConfig example = parse({"--config", std::string(KVFLEET_SOURCE_DIR) + "/examples/replica.yaml"});
  CHECK(example.header_timeout == std::chrono::milliseconds(10'000));
  CHECK(example.max_connections == 4096);
}

TEST_CASE("speculative_config: the flag, the YAML key as JSON or as a mapping, errors naming the key") {
  ReplicaConfig c = parse({"--model", "m", "--speculative-config",
                           R"({"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":2})"});
  CHECK(c.engine.speculative.method == "ngram");
  CHECK(c.engine.speculative.num_speculative_tokens == 4);
  CHECK(c.engine.speculative.prompt_lookup_max == 3);
  CHECK(c.engine.speculative.prompt_lookup_min == 2);
  CHECK(!parse({"--model", "m"}).engine.speculative.enabled());
  ReplicaConfig y;
  apply_replica_yaml("speculative_config: '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'\n", "r.yaml", y);
  CHECK(y.engine.speculative.num_speculative_tokens == 3);
  CHECK(y.engine.speculative.prompt_lookup_min == 5);
  ReplicaConfig m;
  apply_replica_yaml("speculative_config:\n  method: ngram\n  num_speculative_tokens: 2\n  prompt_lookup_min: 1\n"
                     "  disable_by_batch_size: 4\n", "r.yaml", m);
  CHECK(m.engine.speculative.num_speculative_tokens == 2);
  CHECK(m.engine.speculative.prompt_lookup_min == 1);
  CHECK(m.engine.speculative.prompt_lookup_max == 1);
  CHECK(m.engine.speculative.disable_by_batch_size == 4);
  CHECK_THROWS_WITH(parse({"--model", "m", "--speculative-config", R"({"method":"ngram","num_speculative_tokens":0})"}),
                    doctest::Contains("--speculative-config: speculative_config: num_speculative_tokens must be"));
  CHECK_THROWS_WITH(parse({"--model", "m", "--speculative-config", R"({"method":"draft_model","num_speculative_tokens":2})"}),
                    doctest::Contains("model is required for method \"draft_model\""));
  // draft_model: the draft's directory as flag JSON and as a YAML mapping.
  c = parse({"--model", "m", "--speculative-config", R"({"method":"draft_model","model":"/d/small","num_speculative_tokens":3})"});
  CHECK(c.engine.speculative.method == "draft_model");
  CHECK(c.engine.speculative.draft_model == "/d/small");
  ReplicaConfig dm;
  apply_replica_yaml("speculative_config:\n  method: draft_model\n  model: small-draft\n  num_speculative_tokens: 5\n", "r.yaml", dm);
  CHECK(dm.engine.speculative.draft_model == "small-draft");
  CHECK(dm.engine.speculative.num_speculative_tokens == 5);
  // suffix: its keys as flag JSON and as a YAML mapping (fractions are numbers there too).
  c = parse({"--model", "m", "--speculative-config", R"({"method":"suffix","suffix_decoding_max_cached_requests":50})"});
  CHECK(c.engine.speculative.method == "suffix");
  CHECK(c.engine.speculative.suffix_max_cached_requests == 50);
  ReplicaConfig s;
  apply_replica_yaml("speculative_config:\n  method: suffix\n  num_speculative_tokens: 6\n  suffix_decoding_max_tree_depth: 16\n"
                     "  suffix_decoding_max_spec_factor: 1.5\n  suffix_decoding_min_token_prob: 0.25\n", "r.yaml", s);
  CHECK(s.engine.speculative.num_speculative_tokens == 6);
  CHECK(s.engine.speculative.suffix_max_tree_depth == 16);
  CHECK(s.engine.speculative.suffix_max_spec_factor == 1.5);
  CHECK(s.engine.speculative.suffix_min_token_prob == 0.25);
  CHECK_THROWS_WITH(apply_replica_yaml("speculative_config:\n  method: suffix\n  suffix_decoding_min_token_prob: high\n", "r.yaml", s),
                    doctest::Contains("suffix_decoding_min_token_prob must be a number"));
  CHECK_THROWS_WITH(apply_replica_yaml("speculative_config:\n  method: ngram\n  num_speculative_tokens: 2\n  k: 1\n", "r.yaml", m),
                    doctest::Contains("r.yaml: speculative_config: k is not a key"));
  CHECK_THROWS_WITH(apply_replica_yaml("speculative_config: [1, 2]\n", "r.yaml", m), doctest::Contains("speculative_config"));
  CHECK_THROWS_WITH(parse({"--model", "m", "--ep-size", "2", "--speculative-config",
                           R"({"method":"ngram","num_speculative_tokens":2})"}),
                    doctest::Contains("not supported with --ep-size > 1"));
}

TEST_CASE("the responses store's bounds: YAML keys and flags, with the example's defaults") {
  ReplicaConfig c;
  apply_replica_yaml("responses_store_entries: 5\nresponses_store_bytes: 4096\n", "r.yaml", c);
  CHECK(c.responses_store_entries == 5);
  CHECK(c.responses_store_bytes == 4096);
  const ReplicaConfig flags = parse({"--model", "m", "--responses-store-entries", "7", "--responses-store-bytes", "99"});
  CHECK(flags.responses_store_entries == 7);
  CHECK(flags.responses_store_bytes == 99);
  const ReplicaConfig example = parse({"--config", std::string(KVFLEET_SOURCE_DIR) + "/examples/replica.yaml"});
  const ReplicaConfig defaults = parse({"--model", "m"});
  CHECK(example.responses_store_entries == defaults.responses_store_entries);
  CHECK(example.responses_store_bytes == defaults.responses_store_bytes);
}

TEST_CASE("KV cache tiers: YAML keys and flags, and the combinations refused by name") {
  ReplicaConfig c;
  apply_replica_yaml("model: m\nkv_host_gib: 0.5\nkv_disk_dir: /tmp/d\nkv_disk_gib: 2\nkv_shared_dir: /tmp/s\n", "r.yaml", c);
  CHECK(c.engine.kv_tiers.host_bytes == 512ll << 20);
  CHECK(c.engine.kv_tiers.disk_dir == "/tmp/d");
  CHECK(c.engine.kv_tiers.disk_bytes == 2ll << 30);
  CHECK(c.engine.kv_tiers.shared_dir == "/tmp/s");
  const ReplicaConfig f = parse({"--model", "m", "--kv-host-gib", "1", "--kv-disk-dir", "/d", "--kv-disk-gib", "0.25",
                                 "--kv-shared-dir", "/s"});
  CHECK(f.engine.kv_tiers.host_bytes == 1ll << 30);
  CHECK(f.engine.kv_tiers.disk_dir == "/d");
  CHECK(f.engine.kv_tiers.disk_bytes == 256ll << 20);
  CHECK(f.engine.kv_tiers.shared_dir == "/s");
  CHECK_FALSE(parse({"--model", "m"}).engine.kv_tiers.enabled());  // off by default
  CHECK_THROWS_WITH(parse({"--model", "m", "--kv-disk-dir", "/d"}),
                    "kv_disk_gib: --kv-disk-dir needs --kv-disk-gib, the disk tier's size (more than 0)");
  CHECK_THROWS_WITH(parse({"--model", "m", "--kv-disk-gib", "1"}), "kv_disk_gib: needs --kv-disk-dir");
  CHECK_THROWS_WITH(parse({"--model", "m", "--kv-host-gib", "-1"}), "--kv-host-gib: must be a number of GiB, 0 or more");
  CHECK_THROWS_WITH(parse({"--model", "m", "--kv-host-gib", "1", "--enable-prefix-caching", "false"}),
                    "kv_host_gib: KV cache tiers need prefix caching (--enable-prefix-caching true)");
  ReplicaConfig bad;
  CHECK_THROWS_WITH(apply_replica_yaml("kv_host_gib: lots\n", "r.yaml", bad), "r.yaml: 'kv_host_gib' has a bad value 'lots'");
}
