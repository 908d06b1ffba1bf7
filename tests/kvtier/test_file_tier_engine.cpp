// The disk and shared tiers in running engines: blocks come back from files after eviction, after a restart
// and from another engine, with the tokens of a recompute; damaged files are misses, never used.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "kvtier/tier_harness.h"

using namespace kvfleet;
using namespace kvfleet::test;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> block_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;  // a directory not made (again) yet holds none
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.path().extension() == ".kvblock") out.push_back(e.path());
  return out;
}

// Writes are asynchronous: waits until `n` block files are in `dir`.
bool wait_for_files(const fs::path& dir, std::size_t n) {
  for (int i = 0; i < 1000; ++i) {
    if (block_files(dir).size() >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

EngineConfig disk_config(const fs::path& dir, std::int32_t num_blocks = 24) {
  EngineConfig c = tier_config(num_blocks);
  c.kv_tiers.disk_dir = dir.string();
  c.kv_tiers.disk_bytes = 64 << 20;
  return c;
}

// The conversation alone, on a fresh engine.
TierRun conversation(const Model& model, const EngineConfig& c, const SamplingParams& sampling) {
  Engine engine(model, c);
  return run_tier_scenario(engine, sampling, false);
}

}  // namespace

TEST_CASE("a prefix back from the disk tier gives the tokens of a recompute") {
  TempDir dir, disk;
  const Model model = tier_model(dir.path());
  for (const SamplingParams& sampling : {greedy(), seeded()}) {
    CAPTURE(sampling.temperature);
    Engine plain(model, tier_config());
    const TierRun recompute = run_tier_scenario(plain, sampling);
    REQUIRE(recompute.back.cached_tokens == 0);

    fs::remove_all(disk.path() / "x");
    Engine tiered(model, disk_config(disk.path() / "x"));
    const TierRun run = run_tier_scenario(tiered, sampling);
    CHECK(run.back.cached_tokens == 144);
    CHECK(medium(run.stats, KvMedium::disk).hit_tokens == 144);
    CHECK(medium(run.stats, KvMedium::disk).onload_bytes > 0);
    CHECK(medium(run.stats, KvMedium::disk).offload_bytes > 0);
    CHECK(run.back.tokens == recompute.back.tokens);
    CHECK(run.first.tokens == recompute.first.tokens);
  }
}

TEST_CASE("a restarted engine finds its blocks in the disk tier") {
  TempDir dir, disk;
  const Model model = tier_model(dir.path());
  const TierRun first = conversation(model, disk_config(disk.path()), seeded());
  CHECK(first.back.cached_tokens == 144);  // a device hit in the same engine
  CHECK(block_files(disk.path()).size() == 10);  // 168 tokens computed: 10 full blocks, all written at shutdown
  // A fresh engine on the same directory: the first request already finds its prefix.
  Engine engine(model, disk_config(disk.path()));
  Collector col;
  GenerationRequest convo;
  convo.prompt = tier_tokens(160, 1);
  convo.max_tokens = 8;
  convo.ignore_eos = true;
  convo.sampling = seeded();
  engine.submit(convo, col.callback(0));
  engine.wait_idle();
  CHECK(col.results().at(0).cached_tokens == 144);
  CHECK(col.results().at(0).tokens == first.first.tokens);
  CHECK(medium(engine.stats(), KvMedium::disk).hit_tokens == 144);
}

TEST_CASE("damaged block files are misses: the engine recomputes and counts why") {
  TempDir dir, disk;
  const Model model = tier_model(dir.path());
  const TierRun clean = conversation(model, disk_config(disk.path()), greedy());
  const auto files = block_files(disk.path());
  REQUIRE(files.size() == 10);
  // The prefix's first block: damaging it leaves nothing usable after it (a match walks from the first block).
  const std::vector<TokenId> prompt = tier_tokens(160, 1);
  const BlockHash h0 = block_hash_next(block_hash_root(model.name()), std::span(prompt).first(16));
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.kvblock", static_cast<unsigned long long>(h0));
  fs::path first;
  for (const auto& f : files)
    if (f.filename() == name) first = f;
  REQUIRE(!first.empty());
  KvTierError expected{};
  SUBCASE("corrupt") {
    expected = KvTierError::corrupt;
    std::fstream f(first, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(first) - 3));
    f.put('\x55');
  }
  SUBCASE("truncated") {
    expected = KvTierError::truncated;
    fs::resize_file(first, fs::file_size(first) / 2);
  }
  SUBCASE("foreign") {
    expected = KvTierError::foreign;
    std::fstream f(first, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);  // the compatibility hash: another model's block
    f.put('\x01');
  }
  Engine engine(model, disk_config(disk.path()));
  Collector col;
  GenerationRequest convo;
  convo.prompt = tier_tokens(160, 1);
  convo.max_tokens = 8;
  convo.ignore_eos = true;
  convo.sampling = greedy();
  engine.submit(convo, col.callback(0));
  engine.wait_idle();
  CHECK(col.results().at(0).cached_tokens == 0);
  CHECK(col.results().at(0).tokens == clean.first.tokens);
  const auto& d = medium(engine.stats(), KvMedium::disk);
  CHECK(d.hit_tokens == 0);
  CHECK(d.errors[static_cast<std::size_t>(expected)] == 1);
}

TEST_CASE("a second engine serves the first one's conversation from the shared tier") {
  TempDir dir, shared;
  const Model model = tier_model(dir.path());
  EngineConfig c = tier_config();
  c.kv_tiers.shared_dir = shared.path().string();
  Engine a(model, c);
  const TierRun ra = run_tier_scenario(a, seeded(), false);
  REQUIRE(wait_for_files(shared.path(), 10));  // written while `a` still runs
  Engine b(model, c);
  Collector col;
  GenerationRequest convo;
  convo.prompt = tier_tokens(160, 1);
  convo.max_tokens = 8;
  convo.ignore_eos = true;
  convo.sampling = seeded();
  b.submit(convo, col.callback(0));
  b.wait_idle();
  CHECK(col.results().at(0).cached_tokens == 144);
  CHECK(col.results().at(0).tokens == ra.first.tokens);
  CHECK(medium(b.stats(), KvMedium::shared).hit_tokens == 144);
}

TEST_CASE("the disk tier stays within its byte bound") {
  TempDir dir, disk;
  const Model model = tier_model(dir.path());
  EngineConfig probe = disk_config(disk.path() / "probe");
  conversation(model, probe, greedy());
  const auto size = fs::file_size(block_files(disk.path() / "probe").at(0));
  EngineConfig c = disk_config(disk.path() / "small");
  c.kv_tiers.disk_bytes = static_cast<std::int64_t>(3 * size);
  const TierRun run = conversation(model, c, greedy());
  CHECK(block_files(disk.path() / "small").size() == 3);
  CHECK(run.back.tokens == run.first.tokens);
  // A new engine with the same bound keeps the 3 newest files and serves from them what still chains.
  Engine again(model, c);
  CHECK(block_files(disk.path() / "small").size() == 3);
}

TEST_CASE("the disk tier drops what a killed writer left, and keeps working when its directory is deleted") {
  TempDir dir, disk;
  const Model model = tier_model(dir.path());
  const TierRun first = conversation(model, disk_config(disk.path()), greedy());
  const fs::path folder = block_files(disk.path()).at(0).parent_path();
  const fs::path leftover = folder / ".00000000000000aa.123.0.tmp";  // a write a kill -9 interrupted
  std::ofstream(leftover) << "half a block";
  Engine engine(model, disk_config(disk.path()));
  CHECK_FALSE(fs::exists(leftover));
  CHECK(block_files(disk.path()).size() == 10);
  fs::remove_all(disk.path());  // under the running engine
  Collector col;
  GenerationRequest other;
  other.prompt = tier_tokens(100, 9);
  other.max_tokens = 4;
  other.ignore_eos = true;
  engine.submit(other, col.callback(0));
  engine.wait_idle();
  CHECK(col.results().at(0).tokens.size() == 4);
  CHECK(wait_for_files(disk.path(), 6));  // the folder is made again and the new blocks written
  // The conversation's files are gone: a miss (recomputed, same tokens), counted as no error.
  GenerationRequest convo;
  convo.prompt = tier_tokens(160, 1);
  convo.max_tokens = 8;
  convo.ignore_eos = true;
  convo.sampling = greedy();
  engine.submit(convo, col.callback(1));
  engine.wait_idle();
  CHECK(col.results().at(1).tokens == first.first.tokens);
  CHECK(col.results().at(1).cached_tokens == 0);
  const auto& d = medium(engine.stats(), KvMedium::disk);
  CHECK(d.errors[static_cast<std::size_t>(KvTierError::corrupt)] == 0);
}

TEST_CASE("an idle engine publishes the KV events of block files written after its last step") {
  TempDir dir, disk;
  const Model model = tier_model(dir.path());
  Engine engine(model, disk_config(disk.path()));
  Collector col;
  GenerationRequest convo;
  convo.prompt = tier_tokens(160, 1);
  convo.max_tokens = 1;
  convo.sampling = greedy();
  engine.submit(convo, col.callback(0));
  engine.wait_idle();  // no step after this one: the writes finish while the engine waits
  const auto disk_events = [&] {
    std::size_t n = 0;
    for (const KvEvent& e : engine.kv_events()->since(0).events)
      if (e.type == KvEvent::Type::stored && e.medium == KvMedium::disk) n += e.block_hashes.size();
    return n;
  };
  for (int i = 0; i < 500 && disk_events() < 10; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(disk_events() == 10);
  CHECK(medium(engine.stats(), KvMedium::disk).blocks == 10);
}
