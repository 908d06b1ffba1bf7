// Replica processes whose disk tier fails under them: a disk that fills up (a real tmpfs of a few blocks,
// mounted in a user and mount namespace of the replica's own, so no root is needed) degrades to no tier and
// never fails a request; a replica killed with SIGKILL while a block file is half written leaves no torn
// block: on the same directory the next start drops the leftover, every block file verifies, and the answers
// equal a recompute's.
#include <doctest/doctest.h>

#include <signal.h>

#include <boost/json.hpp>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "engine/kvtier/block_file.h"
#include "server/replica_fixture.h"

using namespace kvfleet;
using namespace kvfleet::test;
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

// A replica process on `model`, optionally started through `wrapper` (argv before the replica's own).
class Replica {
 public:
  Replica(const fs::path& model, const std::vector<std::string>& flags, const std::vector<std::string>& wrapper = {}) {
    std::vector<std::string> argv = wrapper;
    for (const std::string& a : {bin_dir() + "/kvfleet-replica", std::string("--model"), model.string(),
                                 std::string("--port"), std::string("0"), std::string("--cpu-threads"), std::string("1"),
                                 std::string("--backend"), std::string("cpu"), std::string("--num-kv-blocks"), std::string("48")})
      argv.push_back(a);
    argv.insert(argv.end(), flags.begin(), flags.end());
    process_ = std::make_unique<ChildProcess>(argv);
    port_ = wait_for_serving_port(*process_, std::chrono::seconds(60));
    REQUIRE_MESSAGE(port_ != 0, "kvfleet-replica did not start");
  }
  http::Response post(const std::string& body) const {
    return http::http_request("127.0.0.1", port_, "POST", "/v1/completions", body,
                              http::Headers{{"Content-Type", "application/json"}}, std::chrono::seconds(60));
  }
  double metric(const std::string& series) const {
    const std::string text = http::http_request("127.0.0.1", port_, "GET", "/metrics", {}, {}, std::chrono::seconds(30)).body;
    const auto at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
  }
  ChildProcess& process() { return *process_; }

 private:
  std::unique_ptr<ChildProcess> process_;
  std::uint16_t port_ = 0;
};

// Conversation k: 10 full blocks of token ids and one more token.
std::string body(int k) {
  json::array ids;
  for (int i = 0; i < 161; ++i) ids.emplace_back(1000 + (k * 7919 + i * 31) % 20000);
  return json::serialize(json::object{{"model", "tiny-qwen"}, {"prompt", ids}, {"max_tokens", 4}, {"temperature", 0},
                                      {"ignore_eos", true}});
}

std::string answer(const http::Response& r) {
  REQUIRE_MESSAGE(r.status == 200, r.body);
  return json::serialize(json::parse(r.body).at("choices"));
}

std::int64_t cached(const http::Response& r) {
  return json::parse(r.body).at("usage").at("prompt_tokens_details").at("cached_tokens").as_int64();
}

bool wait_until_true(const std::function<bool()>& done, std::chrono::seconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// After SIGSTOP: until every thread of `pid` is stopped (the signal is delivered asynchronously).
bool all_threads_stopped(pid_t pid) {
  return wait_until_true([&] {
    std::error_code ec;
    for (const auto& t : fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "task", ec)) {
      std::ifstream in(t.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto close = stat.rfind(") ");
      if (close == std::string::npos || (stat[close + 2] != 'T' && stat[close + 2] != 't')) return false;
    }
    return !ec;
  }, std::chrono::seconds(2));
}

std::vector<fs::path> files_named(const fs::path& dir, std::string_view suffix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.path().filename().string().ends_with(suffix)) out.push_back(e.path());
  return out;
}

// Every block file of `dir` read back and verified by the engine's own reader: the format (compat from its
// folder's name, payload size from the first header) must hold for all, and each must verify.
std::size_t verify_all(const fs::path& dir) {
  std::size_t n = 0;
  std::optional<std::uint64_t> payload;
  for (const fs::path& f : files_named(dir, ".kvblock")) {
    std::ifstream in(f, std::ios::binary);
    char header[kvtier::kBlockFileHeaderBytes];
    REQUIRE(in.read(header, sizeof header));
    std::uint64_t p = 0;
    std::memcpy(&p, header + 40, sizeof p);
    if (!payload) payload = p;
    const auto compat = std::stoull(f.parent_path().filename().string(), nullptr, 16);
    const kvtier::BlockFileFormat format{compat, 16, static_cast<std::size_t>(*payload)};
    const auto hash = kvtier::block_file_hash(f.filename().string());
    REQUIRE(hash);
    const kvtier::BlockFileRead read = kvtier::read_block_file(f.parent_path(), format, *hash);
    CHECK_MESSAGE(read.block != nullptr, f.string() << " does not verify");
    CHECK_FALSE(read.error);
    n += read.block != nullptr;
  }
  return n;
}

}  // namespace

TEST_CASE("a disk tier on a full file system degrades to no tier: every request answers, as a recompute") {
  REQUIRE_MESSAGE(std::system("unshare -Urm true") == 0, "needs unshare(1) and user namespaces (a tmpfs without root)");
  TempDir dir, disk;
  make_tiny_qwen(dir / "tiny-qwen");
  const fs::path model = dir / "tiny-qwen";
  Replica reference(model, {});
  // 48 KiB: a few block files fit, then every write gets ENOSPC.
  const std::vector<std::string> wrapper{"/usr/bin/unshare", "-Urm", "sh", "-c",
                                         "mount -t tmpfs -o size=48k tmpfs \"$0\" && exec \"$@\"", disk.path().string()};
  Replica full(model, {"--kv-disk-dir", disk.path().string(), "--kv-disk-gib", "1"}, wrapper);
  // The replica's view of its disk directory (its own mount namespace).
  const fs::path seen = fs::path("/proc") / std::to_string(full.process().pid()) / "root" / fs::relative(disk.path(), "/");
  for (int k = 0; k < 6; ++k) {
    CAPTURE(k);
    CHECK(answer(full.post(body(k))) == answer(reference.post(body(k))));
  }
  const std::string io = R"(kvfleet_kv_tier_errors_total{medium="disk",reason="io"})";
  REQUIRE(wait_until_true([&] { return full.metric(io) > 0; }));
  const std::size_t kept = verify_all(seen);
  CHECK(kept > 0);   // what fitted
  CHECK(kept < 60);  // not all 6 x 10 blocks
  CHECK(files_named(seen, ".tmp").empty());  // a failed write removes its temporary file
  // Still answering, from the blocks that fitted where they chain: conversation 0 came first.
  const http::Response again = full.post(body(0));
  CHECK(answer(again) == answer(reference.post(body(0))));
  MESSAGE("block files kept on the full disk: " << kept << "; io errors: " << full.metric(io)
                                                << "; conversation 0 back with " << cached(again) << " cached tokens");
}

TEST_CASE("a replica killed while a block file is half written leaves no torn block for the next start") {
  TempDir dir, disk;
  make_tiny_qwen(dir / "tiny-qwen");
  const fs::path model = dir / "tiny-qwen";
  const std::vector<std::string> flags{"--kv-disk-dir", disk.path().string(), "--kv-disk-gib", "1"};
  int killed_mid_write = 0;
  bool last_torn = false;
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto replica = std::make_unique<Replica>(model, flags);
    // Conversation `round` first, whole: its 10 block files are in place before the kill.
    const std::size_t before = files_named(disk.path(), ".kvblock").size();
    answer(replica->post(body(round)));
    REQUIRE(wait_until_true([&] { return files_named(disk.path(), ".kvblock").size() >= before + 10; }));
    std::atomic<bool> stop{false};
    std::thread load([&] {  // new conversations, one after another, until the kill cuts the connection
      for (int k = 100 * (round + 1); !stop; ++k) {
        try {
          replica->post(body(k));
        } catch (const std::exception&) {
        }
      }
    });
    // Freeze the replica until one of its I/O threads is between creating a temporary file and renaming it
    // into place, then kill it there.
    bool torn = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!torn && std::chrono::steady_clock::now() < deadline) {
      replica->process().signal(SIGSTOP);
      REQUIRE(all_threads_stopped(replica->process().pid()));
      torn = !files_named(disk.path(), ".tmp").empty();
      if (!torn) {
        replica->process().signal(SIGCONT);
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      }
    }
    replica->process().signal(SIGKILL);
    stop = true;
    load.join();
    replica.reset();
    killed_mid_write += torn;
    last_torn = torn;
  }
  MESSAGE("kills with a block file half written: " << killed_mid_write << " of 3");
  CHECK(killed_mid_write > 0);
  if (last_torn) CHECK_FALSE(files_named(disk.path(), ".tmp").empty());  // the last kill's leftover

  Replica restarted(model, flags);
  CHECK(files_named(disk.path(), ".tmp").empty());  // dropped at start
  const std::size_t blocks = verify_all(disk.path());
  CHECK(blocks > 0);
  Replica reference(model, {});
  for (int k : {0, 1, 2, 100, 200, 300}) {  // whole before a kill; cut by a kill (some blocks, or none)
    CAPTURE(k);
    const http::Response r = restarted.post(body(k));
    CHECK(answer(r) == answer(reference.post(body(k))));
    if (k < 3) CHECK(cached(r) == 160);
  }
  CHECK(restarted.metric(R"(kvfleet_kv_tier_hit_tokens_total{medium="disk"})") > 0);
  for (const char* reason : {"truncated", "corrupt", "foreign", "io"})
    CHECK(restarted.metric(std::string(R"(kvfleet_kv_tier_errors_total{medium="disk",reason=")") + reason + "\"}") == 0);
}
