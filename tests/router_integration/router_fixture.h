// A kvfleet-router process on a loopback port in front of real replica processes
// (tests/server/replica_fixture.h), with its own copy of the tiny model directory (same base name,
// so router and replicas hash in the same namespace).
#pragma once

#include <doctest/doctest.h>

#include <boost/asio/awaitable.hpp>
#include <boost/json.hpp>
#include <fstream>
#include <regex>

#include "../server/replica_fixture.h"

namespace kvfleet::test {

// The model directory the router reads (tokenizer, chat template); no replica loads it.
inline std::filesystem::path make_router_model(const TempDir& dir) {
  const auto path = dir / "tiny-qwen";
  make_tiny_qwen(path);
  return path;
}

class RouterProcess {
 public:
  RouterProcess(const std::vector<const ReplicaProcess*>& replicas, std::vector<std::string> flags = {}) {
    const auto model = make_router_model(dir_);
    std::vector<std::string> argv{bin_dir() + "/kvfleet-router", "--model", model.string(), "--port", "0"};
    for (const auto* r : replicas) {
      argv.push_back("--replica");
      argv.push_back(r->base_url());
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    process_ = std::make_unique<ChildProcess>(argv);
    port_ = wait_for_serving_port(*process_, std::chrono::seconds(30));
    REQUIRE_MESSAGE(port_ != 0, "kvfleet-router did not start");
  }

  std::uint16_t port() const { return port_; }
  ChildProcess& process() { return *process_; }

  // The admin key that post()/get() send to /admin/* targets.
  void set_admin_key(std::string key) { admin_key_ = std::move(key); }

  http::Response post(const std::string& target, const std::string& body) const {
    http::Headers h{{"Content-Type", "application/json"}};
    add_admin_key(target, h);
    return http::http_request("127.0.0.1", port_, "POST", target, body, h, std::chrono::seconds(60));
  }
  http::Response get(const std::string& target) const {
    http::Headers h;
    add_admin_key(target, h);
    return http::http_request("127.0.0.1", port_, "GET", target, {}, h, std::chrono::seconds(30));
  }
  // The router's resident memory (VmRSS), in KiB.
  long rss_kib() const {
    std::ifstream status("/proc/" + std::to_string(process_->pid()) + "/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
  }
  // Sum of every sample of `name` whose labels contain `label_part` (e.g. reason="cache_hit").
  double metric(const std::string& name, const std::string& label_part = "") const {
    const std::string text = get("/metrics").body;
    const std::regex line("(^|\\n)" + name + "(\\{[^}]*\\})? ([0-9.eE+-]+)");
    double sum = 0;
    for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it) {
      if (label_part.empty() || (*it)[2].str().find(label_part) != std::string::npos) sum += std::stod((*it)[3]);
    }
    return sum;
  }
  // The /admin/replicas entry of `url`.
  boost::json::object replica(const std::string& url) const {
    const boost::json::value v = boost::json::parse(get("/admin/replicas").body);
    for (const auto& r : v.at("replicas").as_array())
      if (r.at("url").as_string() == url) return r.as_object();
    FAIL("no replica " << url);
    return {};
  }
  // The same once every request sent to it has its verdict: the proxy records a request's outcome (circuit
  // breaker, in-flight counts) after relaying the answer, so a client that just read one can be first.
  // Waits up to 10 s for in_flight_requests 0 (a test with requests still running must not use it).
  boost::json::object settled_replica(const std::string& url) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      boost::json::object r = replica(url);
      if (r.at("in_flight_requests").to_number<double>() == 0 || std::chrono::steady_clock::now() > end) return r;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  void add_admin_key(const std::string& target, http::Headers& h) const {
    if (!admin_key_.empty() && target.rfind("/admin", 0) == 0) h.add("Authorization", "Bearer " + admin_key_);
  }

  TempDir dir_;
  std::string admin_key_;
  std::unique_ptr<ChildProcess> process_;
  std::uint16_t port_ = 0;
};

// Connects `client` to 127.0.0.1:`port`, sends GET `target` and returns the response head; a stream's body
// (a replica's /v1/kv_events) then comes through client.read_some().
inline boost::asio::awaitable<http::ResponseHead> open_get(http::HttpClient& client, std::uint16_t port, std::string target) {
  const std::string host = "127.0.0.1";
  co_await client.connect(host, port);
  http::Request req;
  req.method = "GET";
  req.target = std::move(target);
  co_await client.send(req);
  co_return co_await client.read_head();
}

inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace kvfleet::test
