// A kvfleet-replica process on a loopback port, serving a tiny random model with the real Qwen3 tokenizer
// and chat template.
#pragma once

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <fstream>
#include <functional>
#include <regex>

#include "kvfleet/http/client.h"
#include "kvfleet/http/sse.h"
#include "support/tiny_qwen.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvfleet::test {

class ReplicaProcess {
 public:
  using ModelMaker = std::function<void(const std::filesystem::path&)>;
  // `make` writes the model directory (default: tiny-qwen); its directory name is the served name.
  explicit ReplicaProcess(std::vector<std::string> extra_flags = {}, const ModelMaker& make = make_tiny_qwen,
                          const std::string& name = "tiny-qwen") {
    make(dir_ / name);
    std::vector<std::string> argv{bin_dir() + "/kvfleet-replica", "--model", (dir_ / name).string(),
                                  "--port", "0", "--backend", "cpu", "--cpu-threads", "1"};
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
