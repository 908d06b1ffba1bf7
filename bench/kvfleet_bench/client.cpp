#include "bench/kvfleet_bench/client.h"

#include <boost/asio/error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/json.hpp>
#include <optional>
#include <regex>
#include <stdexcept>

#include "kvfleet/http/client.h"
#include "kvfleet/http/sse.h"

namespace kvfleet::bench {
namespace {

namespace json = boost::json;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The text a chunk carries: choices[0].text (completions; an empty one is the closing chunk) or
// choices[0].delta.content (chat; the first chunk, with the role, may carry "" and still marks the
// first token, which is when the replica sends it). nullopt: no token in this chunk.
std::optional<std::string> chunk_text(const json::object& chunk) {
  const auto* choices = chunk.if_contains("choices");
  if (!choices || !choices->is_array() || choices->as_array().empty()) return std::nullopt;
  const auto& c = choices->as_array()[0];
  if (!c.is_object()) return std::nullopt;
  if (const auto* t = c.as_object().if_contains("text"); t && t->is_string() && !t->as_string().empty())
    return std::string(t->as_string());
  if (const auto* d = c.as_object().if_contains("delta"); d && d->is_object())
    if (const auto* t = d->as_object().if_contains("content"); t && t->is_string()) return std::string(t->as_string());
  return std::nullopt;
}

void read_usage(const json::object& chunk, RequestResult& out) {
  const auto* usage = chunk.if_contains("usage");
  if (!usage || !usage->is_object()) return;
  const auto& u = usage->as_object();
  if (const auto* p = u.if_contains("prompt_tokens"); p && p->is_number()) out.prompt_tokens = p->to_number<std::int64_t>();
  if (const auto* c = u.if_contains("completion_tokens"); c && c->is_number())
    out.output_tokens = c->to_number<std::int64_t>();
  if (const auto* d = u.if_contains("prompt_tokens_details"); d && d->is_object())
    if (const auto* c = d->as_object().if_contains("cached_tokens"); c && c->is_number())
      out.cached_tokens = c->to_number<std::int64_t>();
}

struct StreamState {
  bool done = false;
  bool have_usage = false;
  std::int64_t text_chunks = 0;
  Clock::time_point last{};
};

// Handles one SSE event; returns false when the stream reported an error.
bool on_event(const std::string& data, Clock::time_point now, Clock::time_point sent, StreamState& s,
              RequestResult& out) {
  if (data == "[DONE]") {
    s.done = true;
    return true;
  }
  boost::system::error_code ec;
  const json::value v = json::parse(data, ec);
  if (ec || !v.is_object()) return true;  // not ours to judge; keep reading
  const auto& chunk = v.as_object();
  if (chunk.contains("error")) {
    out.error_kind = "stream_error";
    out.error = data;
    return false;
  }
  if (const std::optional<std::string> text = chunk_text(chunk)) {
    if (s.text_chunks == 0) out.ttft = seconds_between(sent, now);
    else out.itl.push_back(seconds_between(s.last, now));
    s.last = now;
    ++s.text_chunks;
    out.text += *text;
  }
  if (chunk.contains("usage") && !chunk.at("usage").is_null()) {
    read_usage(chunk, out);
    s.have_usage = true;
  }
  return true;
}

std::string kind_of(const boost::system::error_code& ec, bool connected) {
  if (ec == boost::beast::error::timeout || ec == boost::asio::error::timed_out) return "timeout";
  return connected ? "io" : "connect";
}

}  // namespace

Target parse_target(const std::string& base_url, const std::string& endpoint) {
  static const std::regex url(R"(http://([^/:]+):([0-9]+)(/.*)?)");
  std::smatch m;
  if (!std::regex_match(base_url, m, url)) throw std::invalid_argument("--base-url must look like http://HOST:PORT");
  Target t;
  t.host = m[1];
  t.port = static_cast<std::uint16_t>(std::stoi(m[2]));
  std::string prefix = m[3];
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  t.path = prefix + endpoint;
  return t;
}

boost::asio::awaitable<void> stream_request(const Target& target, const std::string& body, Clock::time_point run_start,
                                            const ClientConfig& config, RequestResult& out) {
  http::HttpClientConfig cc;
  cc.connect_timeout = config.connect_timeout;
  cc.io_timeout = config.io_timeout;
  http::HttpClient client(co_await boost::asio::this_coro::executor, cc);
  http::Request request;
  request.method = "POST";
  request.target = target.path;
  request.headers.add("Content-Type", "application/json");
  request.headers.add("Accept", "text/event-stream");
  for (const auto& [name, value] : config.headers) request.headers.add(name, value);
  request.body = body;
  const Clock::time_point sent = Clock::now();
  out.start = seconds_between(run_start, sent);
  bool connected = false;
  StreamState state;
  try {
    co_await client.connect(target.host, target.port);
    connected = true;
    co_await client.send(request);
    http::ResponseHead head = co_await client.read_head();
    if (const std::string* r = head.headers.find("x-kvfleet-replica")) out.replica = *r;
    if (head.status != 200) {
      out.error_kind = "http_" + std::to_string(head.status);
      std::string error_body = co_await client.read_body();
      out.error = error_body.substr(0, 4096);  // an OpenAI error object, parsed for the summary
      co_return;
    }
    http::SseParser parser;
    bool ok = true;
    while (ok && !state.done) {
      std::optional<std::string> piece = co_await client.read_some();
      if (!piece) break;
      const Clock::time_point now = Clock::now();
      for (const http::SseEvent& e : parser.feed(*piece)) {
        ok = on_event(e.data, now, sent, state, out);
        if (!ok) break;
      }
    }
    if (!ok) co_return;
  } catch (const boost::system::system_error& e) {
    out.error_kind = kind_of(e.code(), connected);
    out.error = e.what();
    co_return;
  }
  out.latency = seconds_between(sent, Clock::now());
  if (!state.done) {
    out.error_kind = "incomplete";
    out.error = "the stream ended without [DONE]";
    co_return;
  }
  if (!state.have_usage) out.output_tokens = state.text_chunks;
  out.success = state.text_chunks > 0 || out.output_tokens > 0;
  if (!out.success) {
    out.error_kind = "empty";
    out.error = "no tokens came back";
  }
}

}  // namespace kvfleet::bench
