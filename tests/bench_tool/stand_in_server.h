// A stand-in OpenAI streaming server for the bench tool's tests: kvfleet's HttpServer (Beast) on a
// loopback port whose answers follow a script: the first token after `first`, then one token every
// `gap`, then a usage chunk and [DONE]. It records the request bodies it got.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "kvfleet/http/server.h"
#include "kvfleet/http/sse.h"

namespace kvfleet::test {

struct StreamScript {
  std::chrono::milliseconds first{200};
  std::chrono::milliseconds gap{50};
  int tokens = 6;
  int prompt_tokens = 100;  // what the usage chunk reports
  bool send_done = true;    // false: end the stream without [DONE]
  std::mutex mu;
  std::vector<std::string> bodies;
};

inline std::string token_chunk(bool chat, int i) {
  const std::string text = "t" + std::to_string(i);
  boost::json::object choice{{"index", 0}, {"finish_reason", nullptr}};
  if (chat) choice["delta"] = boost::json::object{{"content", text}};
  else choice["text"] = text;
  return boost::json::serialize(boost::json::object{{"choices", boost::json::array{choice}}});
}

inline boost::asio::awaitable<void> scripted_stream(StreamScript& s, const http::Request& request, http::ResponseWriter& w) {
  {
    std::lock_guard lock(s.mu);
    s.bodies.push_back(request.body);
  }
  const bool chat = request.path() == "/v1/chat/completions";
  http::Headers headers{{"Content-Type", "text/event-stream"}, {"x-kvfleet-replica", "http://stand-in:1"}};
  if (!co_await w.begin_stream(200, std::move(headers))) co_return;
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  for (int i = 0; i < s.tokens; ++i) {
    timer.expires_after(i == 0 ? s.first : s.gap);
    co_await timer.async_wait(boost::asio::use_awaitable);
    const std::string line = http::sse_format(token_chunk(chat, i));
    if (!co_await w.write(line)) co_return;
  }
  if (s.send_done) {
    const boost::json::object usage{{"choices", boost::json::array{}},
                                    {"usage", boost::json::object{{"prompt_tokens", s.prompt_tokens},
                                                                  {"completion_tokens", s.tokens}}}};
    const std::string lines = http::sse_format(boost::json::serialize(usage)) + http::sse_format("[DONE]");
    co_await w.write(lines);
  }
  co_await w.finish();
}

inline boost::asio::awaitable<void> overloaded(const http::Request&, http::ResponseWriter& w) {
  http::Response r = http::Response::json(503, R"({"error":{"message":"busy","type":"overloaded","param":null,"code":null}})");
  co_await w.send(std::move(r));
}

class StandInServer {
 public:
  explicit StandInServer(StreamScript& script) {
    http::HttpRouter router;
    router.post("/v1/completions", [&script](const http::Request& r, http::ResponseWriter& w) { return scripted_stream(script, r, w); });
    router.post("/v1/chat/completions", [&script](const http::Request& r, http::ResponseWriter& w) { return scripted_stream(script, r, w); });
    router.post("/busy/v1/completions", overloaded);
    http::HttpServerConfig config;
    config.io_threads = 1;
    server_ = std::make_unique<http::HttpServer>(config, std::move(router));
    server_->start();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

 private:
  std::unique_ptr<http::HttpServer> server_;
};

}  // namespace kvfleet::test
