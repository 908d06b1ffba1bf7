// Helpers of the expert-parallel replica tests: a tiny Mixtral, a completion, the KV event stream, and a
// group of kvfleet-replica processes (--ep-rank R --ep-master) whose rank 0 serves HTTP.
#pragma once

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/json.hpp>

#include "server/replica_fixture.h"

namespace kvfleet::test {
namespace json = boost::json;

inline void make_tiny_mixtral(const std::filesystem::path& out) {
  MakeModelOptions o;
  o.arch = "mixtral";
  o.dtype = DType::bf16;
  o.experts = 4;
  o.experts_per_tok = 2;
  o.tokenizer = std::string(KVFLEET_SOURCE_DIR) + "/models/kvfleet-default";
  make_model(o, out);
}

inline std::string completion(std::uint16_t port, const std::string& prompt, int i) {
  json::object body{{"model", "tiny-moe"}, {"prompt", prompt}, {"max_tokens", 6}, {"ignore_eos", true}};
  if (i % 2) {
    body["temperature"] = 0.9;
    body["seed"] = 7 + i;
  } else {
    body["temperature"] = 0.0;
  }
  const auto res = http::http_request("127.0.0.1", port, "POST", "/v1/completions", json::serialize(body),
                                      {{"Content-Type", "application/json"}}, std::chrono::seconds(60));
  REQUIRE(res.status == 200);
  return res.body;
}

inline std::string completion(const ReplicaProcess& r, const std::string& prompt, int i) {
  return completion(r.port(), prompt, i);
}

inline std::string free_master() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return "127.0.0.1:" + std::to_string(a.local_endpoint().port());
}

// `n` kvfleet-replica processes, one expert-parallel rank each, on loopback; rank 0 serves HTTP.
class EpProcessGroup {
 public:
  explicit EpProcessGroup(int n, const std::vector<std::string>& extra = {}, const std::string& backend = "cpu") {
    make_tiny_mixtral(dir_ / "tiny-moe");
    const std::string master = free_master();
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> argv{bin_dir() + "/kvfleet-replica", "--model", (dir_ / "tiny-moe").string(), "--port", "0",
                                    "--backend", backend, "--cpu-threads", "1", "--ep-size", std::to_string(n),
                                    "--ep-rank", std::to_string(r), "--ep-master", master};
      argv.insert(argv.end(), extra.begin(), extra.end());
      ranks_.push_back(std::make_unique<ChildProcess>(argv));
    }
    port_ = wait_for_serving_port(*ranks_[0], std::chrono::seconds(60));
    REQUIRE_MESSAGE(port_ != 0, "rank 0 did not start serving");
  }
  std::uint16_t port() const { return port_; }
  ChildProcess& rank(int r) { return *ranks_.at(static_cast<std::size_t>(r)); }
  http::Response get(const std::string& target) const {
    return http::http_request("127.0.0.1", port_, "GET", target, {}, {}, std::chrono::seconds(30));
  }
  http::Response post(const std::string& body, http::Headers headers = {}) const {
    headers.add("Content-Type", "application/json");
    return http::http_request("127.0.0.1", port_, "POST", "/v1/completions", body, std::move(headers), std::chrono::seconds(60));
  }

 private:
  TempDir dir_;
  std::vector<std::unique_ptr<ChildProcess>> ranks_;
  std::uint16_t port_ = 0;
};

}  // namespace kvfleet::test
