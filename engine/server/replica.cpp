#include "engine/server/replica.h"

#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

#include "engine/pd/decode_fetcher.h"
#include "engine/pd/prefill_service.h"
#include "engine/server/api_request.h"
#include "kvfleet/http/json_error.h"

namespace kvfleet::server {
namespace json = boost::json;
using boost::asio::awaitable;

namespace {

http::Response json_response(int status, const json::value& v) { return http::Response::json(status, json::serialize(v)); }

}  // namespace

Replica::Replica(ReplicaConfig config)
    : config_(std::move(config)), model_(Model::load(config_.model)),
      name_(config_.served_model_name.empty() ? model_.name() : config_.served_model_name),
      tokenizer_(Tokenizer::load(config_.model)), metrics_(config_.engine.block_size) {
  std::string why;
  chat_template_ = ChatTemplate::from_model_dir(config_.model, &why);
  if (!chat_template_)
    std::fprintf(stderr, "kvfleet-replica: no usable chat template (%s); /v1/chat/completions will answer 400\n", why.c_str());
  config_.engine.served_model_name = name_;
  engine_ = std::make_unique<Engine>(model_, config_.engine);
  engine_->set_tokenizer(&tokenizer_);
  start_pd();
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Replica::~Replica() {
  if (server_) server_->stop(std::chrono::milliseconds(0));
  // The engine's callbacks push to AsyncQueues bound to the server's io_context: end the engine (its last
  // callbacks run now) before the io_context goes away with the server. KV transfer first: it frees its
  // pins through the engine.
  pd_prefill_.reset();
  pd_fetch_.reset();
  engine_.reset();
  server_.reset();
}

void Replica::start() {
  http::HttpServerConfig hc;
  hc.host = config_.host;
  hc.port = config_.port;
  hc.io_threads = config_.http_threads;
  hc.read_timeout = config_.read_timeout;
  hc.body_limit = config_.max_body_bytes;
  hc.header_limit = config_.max_header_bytes;
  server_ = std::make_unique<http::HttpServer>(hc, routes());
  server_->start();
}

std::uint16_t Replica::port() const { return server_->port(); }

bool Replica::drain() {
  draining_ = true;
  const auto deadline = std::chrono::steady_clock::now() + config_.drain_timeout;
  while (in_flight_ > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const bool clean = in_flight_ == 0;
  server_->stop(std::chrono::milliseconds(clean ? 1000 : 0));
  return clean;
}

http::Handler Replica::guarded(awaitable<void> (Replica::*handler)(const http::Request&, http::ResponseWriter&)) {
  return [this, handler](const http::Request& req, http::ResponseWriter& w) -> awaitable<void> {
    ++in_flight_;
    struct Leave {
      std::atomic<int>& n;
      ~Leave() { --n; }
    } leave{in_flight_};
    std::optional<http::Response> error;
    try {
      co_await (this->*handler)(req, w);
    } catch (const ApiError& e) {
      error = http::json_error(e.status, e.what(), e.type, e.param, e.code);
    } catch (const std::invalid_argument& e) {
      error = http::json_error(400, e.what(), "invalid_request_error");
    } catch (const TemplateError& e) {
      error = http::json_error(400, e.what(), "invalid_request_error", "messages");
    }
    if (error) {
      metrics_.count_http(std::string(req.path()), error->status);
      if (!w.started()) co_await w.send(std::move(*error));
    } else {
      metrics_.count_http(std::string(req.path()), 200);
    }
  };
}

http::HttpRouter Replica::routes() {
  http::HttpRouter r;
  r.post("/v1/completions", guarded(&Replica::completions));
  r.post("/v1/chat/completions", guarded(&Replica::chat));
  r.get("/v1/models", guarded(&Replica::models));
  r.get("/health", guarded(&Replica::health));
  r.get("/metrics", guarded(&Replica::metrics));
  r.post("/tokenize", guarded(&Replica::tokenize));
  r.post("/detokenize", guarded(&Replica::detokenize));
  r.get("/v1/kv_events", guarded(&Replica::kv_events));
  add_pd_routes(r);
  return r;
}

void Replica::check_model(const std::string& requested) const {
  if (!requested.empty() && requested != name_)
    throw ApiError(404, "The model '" + requested + "' does not exist; this replica serves '" + name_ + "'",
                   "not_found_error", "model", "model_not_found");
}

void Replica::check_admission() const {
  if (draining_) throw ApiError(503, "the replica is draining and takes no new requests", "overloaded_error");
  if (static_cast<std::size_t>(engine_->stats().scheduler.num_waiting) >= config_.max_waiting_requests)
    throw ApiError(429, "too many requests are waiting; retry later", "rate_limit_error");
}

awaitable<void> Replica::models(const http::Request&, http::ResponseWriter& w) {
  json::object model{{"id", name_}, {"object", "model"}, {"created", created_}, {"owned_by", "kvfleet"},
                     {"root", config_.model}, {"max_model_len", engine_->max_model_len()}};
  http::Response r = json_response(200, json::object{{"object", "list"}, {"data", json::array{model}}});
  co_await w.send(std::move(r));
}

awaitable<void> Replica::health(const http::Request&, http::ResponseWriter& w) {
  http::Response r = draining_ ? http::json_error(503, "draining", "overloaded_error")
                               : json_response(200, json::object{{"status", "ok"}, {"model", name_}});
  co_await w.send(std::move(r));
}

awaitable<void> Replica::metrics(const http::Request&, http::ResponseWriter& w) {
  http::Response r = http::Response::text(200, metrics_.render(engine_->stats()), "text/plain; version=0.0.4; charset=utf-8");
  co_await w.send(std::move(r));
}

awaitable<void> Replica::tokenize(const http::Request& req, http::ResponseWriter& w) {
  const json::value body = parse_json_body(req.body);
  const json::object& o = body.as_object();
  std::vector<TokenId> ids;
  const bool add_special = o.contains("add_special_tokens") ? o.at("add_special_tokens").as_bool() : true;
  if (const auto* p = o.if_contains("prompt"); p && p->is_string()) {
    ids = tokenizer_.encode(std::string(p->as_string()), add_special);
  } else if (o.contains("messages")) {
    const ChatRequest chat = parse_chat_request(body);
    if (!chat_template_) throw bad_request("this model has no chat template", "messages");
    ChatTemplateOptions opts;
    opts.add_generation_prompt = chat.add_generation_prompt;
    opts.tools = chat.tools;
    ids = tokenizer_.encode(chat_template_->render(chat.messages, opts), false);
  } else {
    throw bad_request("give 'prompt' (a string) or 'messages'", "prompt");
  }
  http::Response r = json_response(200, json::object{{"tokens", json::value_from(ids)}, {"count", ids.size()},
                                                     {"max_model_len", engine_->max_model_len()}});
  co_await w.send(std::move(r));
}

awaitable<void> Replica::detokenize(const http::Request& req, http::ResponseWriter& w) {
  const json::value body = parse_json_body(req.body);
  const auto* tokens = body.as_object().if_contains("tokens");
  if (!tokens || !tokens->is_array()) throw bad_request("'tokens' must be a list of token ids", "tokens");
  std::vector<TokenId> ids;
  for (const auto& t : tokens->as_array()) {
    if (!t.is_int64() || t.as_int64() < 0 || t.as_int64() >= static_cast<std::int64_t>(tokenizer_.vocab_size()))
      throw bad_request("'tokens' must hold token ids of this model's vocabulary", "tokens");
    ids.push_back(static_cast<TokenId>(t.as_int64()));
  }
  http::Response r = json_response(200, json::object{{"prompt", tokenizer_.decode(ids)}});
  co_await w.send(std::move(r));
}

}  // namespace kvfleet::server
