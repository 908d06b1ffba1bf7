// A kvfleet-replica process on a loopback port, serving a tiny random model with the real Qwen3 tokenizer
// and chat template.
#pragma once

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <regex>

#include "kvfleet/http/client.h"
#include "kvfleet/http/sse.h"
#include "support/tiny_qwen.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvfleet::test {

class ReplicaProcess {
 public:
  explicit ReplicaProcess(std::vector<std::string> extra_flags = {}) {
    make_tiny_qwen(dir_ / "tiny-qwen");
    std::vector<std::string> argv{bin_dir() + "/kvfleet-replica", "--model", (dir_ / "tiny-qwen").string(),
                                  "--port", "0", "--backend", "cpu", "--cpu-threads", "1"};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    process_ = std::make_unique<ChildProcess>(argv);
    port_ = wait_for_serving_port(*process_, std::chrono::seconds(60));
    REQUIRE_MESSAGE(port_ != 0, "kvfleet-replica did not start");
  }

  std::uint16_t port() const { return port_; }
  ChildProcess& process() { return *process_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  http::Response post(const std::string& target, const std::string& body) const {
    return http::http_request("127.0.0.1", port_, "POST", target, body, {{"Content-Type", "application/json"}},
                              std::chrono::seconds(60));
  }
  http::Response get(const std::string& target) const {
    return http::http_request("127.0.0.1", port_, "GET", target, {}, {}, std::chrono::seconds(30));
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
