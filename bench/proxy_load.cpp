// Load for the proxy comparison (bench/router_vs_nginx.sh): a stand-in upstream that answers at once,
// and a client that measures latency and throughput over keep-alive connections, as OpenAI clients
// connect. Requests are realistic chat completions (bench/chat_prompts.h): one shared ~600-token
// system prompt, a distinct ~400-token user message each.
//
//   bench_proxy_load serve PORT                    stand-in replica: /health, /v1/completions, /v1/chat/completions
//   bench_proxy_load tokens MODEL_DIR              average rendered prompt tokens of the bodies (chat template)
//   bench_proxy_load latency N ROUNDS NAME=PORT... one connection per target; request i goes to every target
//                                                  in turn (order rotated), so drift and noise hit all alike;
//                                                  a NAME ending in "_raw" gets the same body with "messages"
//                                                  renamed, which a router forwards without templating,
//                                                  tokenizing or matching: the proxying cost alone
//   bench_proxy_load throughput PORT N CONNECTIONS req/s with CONNECTIONS keep-alive connections
//
// Added latency (latency mode): per round, a target's percentile minus the same percentile of the
// first target (the upstream itself) over the same interleaved requests; the median over ROUNDS is
// printed. The per-request paired difference (target minus first target on the same body, measured
// back to back) is printed too, as a check.
#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/chat_prompts.h"
#include "kvfleet/chat_template.h"
#include "kvfleet/http/server.h"
#include "kvfleet/tokenizer.h"

using namespace kvfleet;
using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;
namespace bhttp = boost::beast::http;

namespace {

int serve(std::uint16_t port) {
  http::HttpRouter routes;
  const std::string answer =
      R"({"id":"cmpl-standin","object":"text_completion","created":0,"model":"standin","choices":[{"index":0,)"
      R"("text":" fine.","finish_reason":"length","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})";
  auto complete = [answer](const http::Request&, http::ResponseWriter& w) -> boost::asio::awaitable<void> {
    http::Response r = http::Response::json(200, answer);
    co_await w.send(std::move(r));
  };
  routes.post("/v1/completions", complete);
  routes.post("/v1/chat/completions", complete);
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

// A blocking keep-alive HTTP/1.1 client: the least client-side work per request.
class KeepAlive {
 public:
  explicit KeepAlive(std::uint16_t port) : port_(port) { connect(); }

  // Microseconds for one POST of `body`; negative on a failure or a non-200 answer.
  double post(const std::string& body) {
    bhttp::request<bhttp::string_body> req{bhttp::verb::post, "/v1/chat/completions", 11};
    req.set(bhttp::field::host, "127.0.0.1");
    req.set(bhttp::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
    const auto start = Clock::now();
    boost::system::error_code ec;
    bhttp::write(socket_, req, ec);
    bhttp::response<bhttp::string_body> res;
    if (!ec) bhttp::read(socket_, buffer_, res, ec);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (ec || !res.keep_alive()) connect();
    return !ec && res.result_int() == 200 ? us : -1;
  }

 private:
  void connect() {
    boost::system::error_code ec;
    socket_.close(ec);
    socket_.connect({asio::ip::make_address("127.0.0.1"), port_});
    socket_.set_option(asio::ip::tcp::no_delay(true));
    buffer_.clear();
  }
  std::uint16_t port_;
  asio::io_context io_;
  asio::ip::tcp::socket socket_{io_};
  boost::beast::flat_buffer buffer_;
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * double(v.size() - 1))];
}

double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

int tokens(const std::string& model_dir) {
  const Tokenizer tokenizer = Tokenizer::load(model_dir);
  std::string why;
  const auto chat = ChatTemplate::from_model_dir(model_dir, &why);
  if (!chat) return std::fprintf(stderr, "no chat template: %s\n", why.c_str()), 1;
  const auto bodies = bench::chat_bodies(100, "m");
  double sum = 0;
  for (const auto& b : bodies)
    sum += double(tokenizer.encode(chat->render(boost::json::parse(b).at("messages").as_array()), false).size());
  std::printf("%.0f\n", sum / double(bodies.size()));
  return 0;
}

int latency(int n, int rounds, const std::vector<std::pair<std::string, std::uint16_t>>& targets) {
  const auto bodies = bench::chat_bodies(n, "kvfleet-tiny");
  std::vector<std::string> raw_bodies;
  for (std::string b : bodies) raw_bodies.push_back(b.replace(b.find("\"messages\""), 10, "\"messagez\""));
  const std::size_t t_count = targets.size();
  std::vector<const std::vector<std::string>*> body_of;
  for (const auto& t : targets) body_of.push_back(t.first.ends_with("_raw") ? &raw_bodies : &bodies);
  std::vector<std::vector<double>> p50(t_count), p99(t_count), pair50(t_count), pair99(t_count), raw50(t_count), raw99(t_count);
  int errors = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::unique_ptr<KeepAlive>> clients;
    for (const auto& t : targets) clients.push_back(std::make_unique<KeepAlive>(t.second));
    for (std::size_t t = 0; t < t_count; ++t)  // warm-up: connections, pools, caches of the shared prompt
      for (int i = 0; i < 50; ++i) clients[t]->post((*body_of[t])[static_cast<std::size_t>(i)]);
    std::vector<std::vector<double>> lat(t_count, std::vector<double>(static_cast<std::size_t>(n)));
    for (int i = 0; i < n; ++i)
      for (std::size_t k = 0; k < t_count; ++k) {
        const std::size_t t = (k + static_cast<std::size_t>(i)) % t_count;
        const double us = clients[t]->post((*body_of[t])[static_cast<std::size_t>(i)]);
        errors += us < 0;
        lat[t][static_cast<std::size_t>(i)] = us;
      }
    for (std::size_t t = 0; t < t_count; ++t) {
      std::vector<double> paired(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) paired[static_cast<std::size_t>(i)] = lat[t][static_cast<std::size_t>(i)] - lat[0][static_cast<std::size_t>(i)];
      raw50[t].push_back(percentile(lat[t], 0.5));
      raw99[t].push_back(percentile(lat[t], 0.99));
      p50[t].push_back(raw50[t].back() - percentile(lat[0], 0.5));
      p99[t].push_back(raw99[t].back() - percentile(lat[0], 0.99));
      pair50[t].push_back(percentile(paired, 0.5));
      pair99[t].push_back(percentile(paired, 0.99));
    }
  }
  for (std::size_t t = 0; t < t_count; ++t)
    std::printf("{\"target\": \"%s\", \"p50_us\": %.1f, \"p99_us\": %.1f, \"added_p50_us\": %.1f, \"added_p99_us\": %.1f, "
                "\"paired_p50_us\": %.1f, \"paired_p99_us\": %.1f, \"rounds\": %d, \"requests_per_round\": %d, \"errors\": %d}\n",
                targets[t].first.c_str(), median(raw50[t]), median(raw99[t]), median(p50[t]), median(p99[t]),
                median(pair50[t]), median(pair99[t]), rounds, n, errors);
  return errors == 0 ? 0 : 1;
}

int throughput(std::uint16_t port, int n, int connections) {
  const auto bodies = bench::chat_bodies(256, "kvfleet-tiny", 11);
  std::atomic<int> next{0}, errors{0};
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int c = 0; c < connections; ++c)
    threads.emplace_back([&] {
      KeepAlive client(port);
      for (int i; (i = next++) < n;) errors += client.post(bodies[static_cast<std::size_t>(i) % bodies.size()]) < 0;
    });
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("{\"req_per_s\": %.1f, \"errors\": %d}\n", n / secs, errors.load());
  return errors == 0 ? 0 : 1;
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
  if (mode == "tokens" && argc == 3) return tokens(argv[2]);
  if (mode == "latency" && argc >= 5) {
    std::vector<std::pair<std::string, std::uint16_t>> targets;
    for (int a = 4; a < argc; ++a) {
      const std::string arg = argv[a];
      const auto eq = arg.find('=');
      targets.emplace_back(arg.substr(0, eq), static_cast<std::uint16_t>(std::stoi(arg.substr(eq + 1))));
    }
    return latency(std::stoi(argv[2]), std::stoi(argv[3]), targets);
  }
  if (mode == "throughput" && argc == 5)
    return throughput(static_cast<std::uint16_t>(std::stoi(argv[2])), std::stoi(argv[3]), std::stoi(argv[4]));
  std::fprintf(stderr,
               "usage: bench_proxy_load serve PORT | tokens MODEL_DIR | latency N ROUNDS NAME=PORT... | "
               "throughput PORT N CONNECTIONS\n");
  return 2;
}
