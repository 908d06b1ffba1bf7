// Load for the proxy comparison (bench/router_vs_nginx.sh): a stand-in upstream that answers instantly, and a
// client that measures request latency and throughput against any address.
//
//   bench_proxy_load serve PORT                        stand-in replica: /health, /v1/models, /v1/completions
//   bench_proxy_load hit PORT BODY_FILE N CONCURRENCY  N POSTs to /v1/completions; prints p50/p99 us and req/s
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvfleet/http/client.h"
#include "kvfleet/http/server.h"

using namespace kvfleet;
using Clock = std::chrono::steady_clock;

namespace {

int serve(std::uint16_t port) {
  http::HttpRouter routes;
  const std::string answer =
      R"({"id":"cmpl-standin","object":"text_completion","created":0,"model":"standin","choices":[{"index":0,)"
      R"("text":" fine.","finish_reason":"length","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
  routes.post("/v1/completions", [answer](const http::Request&, http::ResponseWriter& w) -> boost::asio::awaitable<void> {
    http::Response r = http::Response::json(200, answer);
    co_await w.send(std::move(r));
  });
  routes.get("/health", [](const http::Request&, http::ResponseWriter& w) -> boost::asio::awaitable<void> {
    http::Response r = http::Response::json(200, "{\"status\":\"ok\"}");
    co_await w.send(std::move(r));
  });
  http::HttpServerConfig config;
  config.port = port;
  config.io_threads = 1;
  http::HttpServer server(config, std::move(routes));
  server.start();
  std::printf("stand-in upstream on http://127.0.0.1:%u\n", server.port());
  std::fflush(stdout);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  int sig = 0;
  sigwait(&s, &sig);
  return 0;
}

int hit(std::uint16_t port, const std::string& body_file, int n, int concurrency) {
  std::ifstream in(body_file);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string body = ss.str();
  std::vector<double> latencies(static_cast<std::size_t>(n));
  std::atomic<int> next{0}, errors{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] {
      for (int i; (i = next++) < n;) {
        const auto s = Clock::now();
        try {
          const auto r = http::http_request("127.0.0.1", port, "POST", "/v1/completions", body,
                                            {{"Content-Type", "application/json"}});
          if (r.status != 200) ++errors;
        } catch (const std::exception&) {
          ++errors;
        }
        latencies[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::micro>(Clock::now() - s).count();
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::sort(latencies.begin(), latencies.end());
  auto pct = [&](double p) { return latencies[static_cast<std::size_t>(p * (n - 1))]; };
  std::printf("{\"p50_us\": %.1f, \"p99_us\": %.1f, \"req_per_s\": %.1f, \"errors\": %d}\n", pct(0.5), pct(0.99),
              n / secs, errors.load());
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "serve" && argc == 3) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    pthread_sigmask(SIG_BLOCK, &s, nullptr);
    return serve(static_cast<std::uint16_t>(std::stoi(argv[2])));
  }
  if (mode == "hit" && argc == 6)
    return hit(static_cast<std::uint16_t>(std::stoi(argv[2])), argv[3], std::stoi(argv[4]), std::stoi(argv[5]));
  std::fprintf(stderr, "usage: bench_proxy_load serve PORT | hit PORT BODY_FILE N CONCURRENCY\n");
  return 2;
}
