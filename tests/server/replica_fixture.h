// A kvfleet-replica process on a loopback port, serving a tiny random model with the real Qwen3 tokenizer
// and chat template, and a reader of a replica's KV event stream.
#pragma once

#include <doctest/doctest.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/json.hpp>
#include <algorithm>
#include <fstream>
#include <functional>
#include <regex>

#include "kvfleet/http/client.h"
#include "kvfleet/http/sse.h"
#include "support/tiny_qwen.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvfleet::test {

// Reads GET /v1/kv_events?since=0 for up to `seconds`, until every one of `needles` shows, then for
// `settle` more (the rest of the replay).
inline std::string read_events(std::uint16_t port, const std::vector<std::string>& needles, int seconds,
                               std::chrono::milliseconds settle = std::chrono::milliseconds(0)) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  timeval tv{0, 200000};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET /v1/kv_events?since=0 HTTP/1.1\r\nHost: x\r\n\r\n";
  asio::write(s, asio::buffer(req));
  std::string got;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  char buf[4096];
  const auto all_there = [&] {
    for (const auto& n : needles)
      if (got.find(n) == std::string::npos) return false;
    return true;
  };
  bool found = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!found && all_there()) {
      found = true;
      deadline = std::min(deadline, std::chrono::steady_clock::now() + settle);
      continue;
    }
    const ssize_t n = ::recv(s.native_handle(), buf, sizeof buf, 0);
    if (n == 0) break;
    if (n > 0) got.append(buf, static_cast<std::size_t>(n));
  }
  return got;
}

class ReplicaProcess {
 public:
  using ModelMaker = std::function<void(const std::filesystem::path&)>;
  // `make` writes the model directory (default: tiny-qwen); its directory name is the served name. The CPU
  // backend unless extra_flags name a --backend.
  explicit ReplicaProcess(std::vector<std::string> extra_flags = {}, const ModelMaker& make = make_tiny_qwen,
                          const std::string& name = "tiny-qwen") {
    make(dir_ / name);
    std::vector<std::string> argv{bin_dir() + "/kvfleet-replica", "--model", (dir_ / name).string(),
                                  "--port", "0", "--cpu-threads", "1"};
    if (std::find(extra_flags.begin(), extra_flags.end(), "--backend") == extra_flags.end())
      argv.insert(argv.end(), {"--backend", "cpu"});
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    process_ = std::make_unique<ChildProcess>(argv);
    port_ = wait_for_serving_port(*process_, std::chrono::seconds(60));
    REQUIRE_MESSAGE(port_ != 0, "kvfleet-replica did not start");
  }

  std::uint16_t port() const { return port_; }
  ChildProcess& process() { return *process_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  http::Response post(const std::string& target, const std::string& body, http::Headers headers = {}) const {
    if (!headers.find("Content-Type")) headers.add("Content-Type", "application/json");
    return http::http_request("127.0.0.1", port_, "POST", target, body, std::move(headers), std::chrono::seconds(60));
  }
  http::Response get(const std::string& target) const {
    return http::http_request("127.0.0.1", port_, "GET", target, {}, {}, std::chrono::seconds(30));
  }
  // Resident memory of the replica process, from /proc (bytes; 0 when unknown).
  std::size_t rss_bytes() const {
    std::ifstream status("/proc/" + std::to_string(process_->pid()) + "/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    return 0;
  }
  // The value of an unlabelled metric in /metrics.
  double metric(const std::string& name) const {
    const std::string text = get("/metrics").body;
    const std::regex line("(^|\\n)" + name + " ([0-9.eE+-]+)");
    std::smatch m;
    return std::regex_search(text, m, line) ? std::stod(m[2]) : -1.0;
  }

 private:
  TempDir dir_;
  std::unique_ptr<ChildProcess> process_;
  std::uint16_t port_ = 0;
};

}  // namespace kvfleet::test
