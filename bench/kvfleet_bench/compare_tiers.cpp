#include "bench/kvfleet_bench/compare_tiers.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <thread>

#include "bench/kvfleet_bench/fleet.h"
#include "bench/kvfleet_bench/preflight.h"

namespace kvfleet::bench {
namespace fs = std::filesystem;
namespace {

fs::path own_bin_dir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path(".") : self.parent_path();
}

std::string run_name(const std::string& tiers, const std::string& topology, int repeat) {
  std::string name = topology + "-" + tiers + (repeat > 0 ? "-" + std::to_string(repeat + 1) : "");
  for (char& c : name)
    if (c == '+') c = '_';
  return name;
}

bool has(const std::string& tiers, const char* tier) { return tiers.find(tier) != std::string::npos; }

void check_options(const CompareTiersOptions& o) {
  for (const std::string& t : o.tiers)
    if (t != "off" && t != "host" && t != "disk" && t != "host+disk")
      throw std::invalid_argument("--tiers: each of off, host, disk, host+disk; got '" + t + "'");
  for (const std::string& t : o.topologies)
    if (t != "replica" && t != "router" && t != "router-device-only")
      throw std::invalid_argument("--topologies: replica, router or router-device-only; got '" + t + "'");
  if (!(o.device_fraction > 0 && o.device_fraction <= 1)) throw std::invalid_argument("--device-fraction must be in (0, 1]");
}

TierRun run_one(const CompareTiersOptions& o, const std::string& tiers, const std::string& topology, std::int64_t blocks,
                int repeat) {
  const std::string name = run_name(tiers, topology, repeat);
  FleetConfig fc;
  fc.bin_dir = o.bin_dir.empty() ? own_bin_dir() : fs::path(o.bin_dir);
  fc.model = o.serve.model;
  fc.replicas = topology == "replica" ? 1 : o.replicas;
  fc.policy = o.policy;
  fc.name = name;
  fc.log_dir = fs::path(o.out_dir) / "logs";
  fc.replica_flags = o.replica_flags;
  fc.replica_flags.push_back("--block-size=" + std::to_string(o.block_size));
  fc.replica_flags.push_back("--num-kv-blocks=" + std::to_string(blocks));
  if (has(tiers, "host")) fc.replica_flags.push_back(fmt::format("--kv-host-gib={}", o.host_gib));
  for (int i = 0; i < fc.replicas && has(tiers, "disk"); ++i) {
    const fs::path dir = fs::path(o.out_dir) / "kv-disk" / (name + "-" + std::to_string(i));
    fs::remove_all(dir);
    fs::create_directories(dir);
    fc.own_replica_flags.push_back({"--kv-disk-dir=" + dir.string(), fmt::format("--kv-disk-gib={}", o.disk_gib)});
  }
  fc.router_flags = o.router_flags;
  fc.router_flags.push_back("--block-size=" + std::to_string(o.block_size));
  if (topology == "router-device-only")  // cache_aware counts device hits only: a block in a tier is worth nothing
    for (const char* knob : {"--host-tier-weight=0", "--disk-tier-weight=0", "--shared-tier-weight=0"}) fc.router_flags.push_back(knob);
  std::cerr << "== " << name << ": " << fc.replicas << " replica(s), " << blocks << " device blocks\n";
  Fleet fleet(fc);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the router's first health checks
  ServeOptions so = o.serve;
  so.base_url = topology == "replica" ? fleet.replica_urls().front() : fleet.router_url();
  so.metrics_urls = fleet.replica_urls();
  so.result_file = (fs::path(o.out_dir) / (name + ".json")).string();
  so.plot_dir.clear();
  ServeReport report = run_serve(so, std::cerr);
  fleet.stop();
  return TierRun{tiers, topology, report.result, blocks, repeat};
}

std::string ratio(std::optional<double> v) { return v ? fmt::format("{:.3f}", *v) : "n/a"; }

struct Medians {
  double ttft_p50 = 0, request_throughput = 0, hit = 0;
  int runs = 0;
};

// Each setup's medians over its repeats.
Medians medians_of(const std::vector<TierRun>& runs, const std::string& tiers, const std::string& topology) {
  std::vector<double> ttft, tput, hit;
  for (const TierRun& r : runs) {
    if (r.tiers != tiers || r.topology != topology) continue;
    ttft.push_back(r.result.ttft_ms.p50);
    tput.push_back(r.result.request_throughput);
    hit.push_back(tier_shares(r.result).total);
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  return Medians{median(ttft), median(tput), median(hit), static_cast<int>(ttft.size())};
}

}  // namespace

TierShares tier_shares(const BenchResult& b) {
  TierShares s;
  if (b.total_input_tokens <= 0) return s;
  const auto input = static_cast<double>(b.total_input_tokens);
  s.total = static_cast<double>(b.total_cached_tokens) / input;
  if (b.fleet) {
    s.host = b.fleet->tier_hits_host / input;
    s.disk = b.fleet->tier_hits_disk / input;
    s.shared = b.fleet->tier_hits_shared / input;
  }
  s.device = std::max(0.0, s.total - s.host - s.disk - s.shared);
  return s;
}

std::int64_t device_blocks_for(const Workload& w, double fraction, std::int32_t block_size) {
  const double working_set = w.infinite_cache ? static_cast<double>(w.infinite_cache->prompt_tokens - w.infinite_cache->hit_tokens) : 0;
  const auto share = static_cast<std::int64_t>(std::ceil(working_set * fraction / block_size));
  const std::int64_t longest = (longest_request(w).total() + block_size - 1) / block_size + 1;
  return std::max(share, longest);
}

void add_compare_tiers_flags(CLI::App& app, CompareTiersOptions& o) {
  add_serve_flags(app, o.serve);
  app.add_option("--bin-dir", o.bin_dir, "Folder of kvfleet-replica and kvfleet-router (default: this program's)");
  app.add_option("--tiers", o.tiers, "Tier setups, in order: off, host, disk, host+disk")->delimiter(',');
  app.add_option("--topologies", o.topologies,
                 "replica (one, directly), router (--replicas behind it), router-device-only (the same, the router "
                 "weighing no tier but the device pool)")
      ->delimiter(',');
  app.add_option("--replicas", o.replicas, "Replicas behind the router")->check(CLI::PositiveNumber);
  app.add_option("--policy", o.policy, "Router policy");
  app.add_option("--device-fraction", o.device_fraction, "Device pool: this share of the trace's working set");
  app.add_option("--num-kv-blocks", o.num_kv_blocks, "Device pool in blocks (overrides --device-fraction)");
  app.add_option("--host-gib", o.host_gib, "Host tier size per replica (GiB)");
  app.add_option("--disk-gib", o.disk_gib, "Disk tier size per replica (GiB)");
  app.add_option("--replica-flag", o.replica_flags, "A flag for every replica, e.g. --replica-flag=--cpu-threads=1")
      ->allow_extra_args(false);
  app.add_option("--router-flag", o.router_flags, "A flag for the router")->allow_extra_args(false);
  app.add_option("--block-size", o.block_size, "KV block size of replicas and router");
  app.add_option("--out-dir", o.out_dir, "Report folder (disk tiers under it, emptied per run)");
  app.add_option("--repeats", o.repeats, "Run the setups this many times, interleaved; compare medians")
      ->check(CLI::PositiveNumber);
}

std::string tiers_markdown(const CompareTiersOptions& o, const std::vector<TierRun>& runs, double working_set) {
  std::string md = "# KV tiers on a trace\n\n";
  md += fmt::format("Trace `{}` (block tokens {}, time scale {}, max output {}), max concurrency {}, block size {}, "
                    "working set {:.0f} tokens ({:.0f} blocks).\n\n",
                    o.serve.workload.trace_file, o.serve.workload.trace_block_tokens, o.serve.workload.trace_time_scale,
                    o.serve.workload.trace_max_output, o.serve.max_concurrency, o.block_size, working_set,
                    std::ceil(working_set / o.block_size));
  md += "| topology | tiers | run | device blocks (% of working set) | hit ratio | device | host | disk | infinite cache | "
        "hit / infinite | TTFT p50 (ms) | TTFT p90 (ms) | req/s | output tok/s | failed |\n";
  md += "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const TierRun& r : runs) {
    const BenchResult& b = r.result;
    const TierShares s = tier_shares(b);
    const double inf = b.infinite_cache_hit_ratio.value_or(0);
    md += fmt::format("| {} | {} | {} | {} ({:.0f}%) | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {} | {} | {:.0f} | {:.0f} | {:.2f} | {:.1f} | {} |\n",
                      r.topology, r.tiers, r.repeat + 1, r.device_blocks, 100.0 * r.device_blocks * o.block_size / std::max(1.0, working_set),
                      s.total, s.device, s.host, s.disk, ratio(b.infinite_cache_hit_ratio),
                      inf > 0 ? fmt::format("{:.2f}", s.total / inf) : "n/a", b.ttft_ms.p50, b.ttft_ms.p90,
                      b.request_throughput, b.output_throughput, b.failed);
  }
  std::string against;
  for (const std::string& topology : o.topologies)
    for (const std::string& tiers : o.tiers) {
      const Medians on = medians_of(runs, tiers, topology), off = medians_of(runs, "off", topology);
      if (tiers == "off" || on.runs == 0 || off.runs == 0 || on.ttft_p50 <= 0 || off.request_throughput <= 0) continue;
      against += fmt::format("| {} | {} | {} | {:.3f} / {:.3f} | {:.0f} / {:.0f} | {:.2f}x | {:+.1f}% | {:+.1f}% |\n", topology,
                             tiers, on.runs, off.hit, on.hit, off.ttft_p50, on.ttft_p50, off.ttft_p50 / on.ttft_p50,
                             100.0 * (on.request_throughput / off.request_throughput - 1),
                             100.0 * (on.ttft_p50 / off.ttft_p50 - 1));
    }
  if (!against.empty())
    md += "\nAgainst `off` on the same topology (medians over the runs):\n\n| topology | tiers | runs | hit ratio off / on | "
          "TTFT p50 off / on (ms) | TTFT p50 off / on | req/s change | TTFT p50 change |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|\n" + against;
  return md;
}

int run_compare_tiers(const CompareTiersOptions& o) {
  check_options(o);
  fs::create_directories(o.out_dir);
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_path(o.serve));
  WorkloadOptions wo = o.serve.workload;
  wo.seed = o.serve.seed;
  const Workload workload = make_workload(wo, PromptBuilder(tokenizer));
  if (!workload.infinite_cache)
    throw std::invalid_argument("compare-tiers replays a Mooncake trace: --dataset-name trace --trace-file F");
  const double working_set = static_cast<double>(workload.infinite_cache->prompt_tokens - workload.infinite_cache->hit_tokens);
  const std::int64_t blocks = o.num_kv_blocks > 0 ? o.num_kv_blocks : device_blocks_for(workload, o.device_fraction, o.block_size);
  std::vector<TierRun> runs;
  boost::json::object all{{"working_set_tokens", working_set}, {"device_blocks", blocks}};
  for (int repeat = 0; repeat < o.repeats; ++repeat)
    for (const std::string& topology : o.topologies)
      for (const std::string& tiers : o.tiers) {
        runs.push_back(run_one(o, tiers, topology, blocks, repeat));
        const std::string name = run_name(tiers, topology, repeat);
        std::ifstream in(fs::path(o.out_dir) / (name + ".json"));
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        all[name] = boost::json::parse(text);
      }
  const std::string md = tiers_markdown(o, runs, working_set);
  std::ofstream(fs::path(o.out_dir) / "report.md") << md;
  std::ofstream(fs::path(o.out_dir) / "results.json") << boost::json::serialize(all) << "\n";
  std::cout << md;
  return 0;
}

}  // namespace kvfleet::bench
