#include "engine/server/replica.h"

#include <boost/asio/steady_timer.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <thread>

#include "engine/pd/decode_fetcher.h"
#include "engine/pd/prefill_service.h"
#include "engine/server/api/request.h"
#include "engine/server/grammar_compiler.h"
#include "engine/server/output/relay.h"
#include "engine/server/responses/store.h"
#include "kvfleet/chat_tokens.h"
#include "kvfleet/chat_tools.h"
#include "kvfleet/ep_group.h"
#include "kvfleet/http/async_queue.h"
#include "kvfleet/http/json_error.h"
#include "kvfleet/secure_compare.h"

namespace kvfleet::server {
namespace json = boost::json;
using boost::asio::awaitable;

Replica::Replica(ReplicaConfig config)
    : config_(std::move(config)), model_(Model::load(config_.model)),
      name_(config_.served_model_name.empty() ? model_.name() : config_.served_model_name),
      tokenizer_(Tokenizer::load(config_.model)),
      metrics_(config_.engine.block_size, {name_, config_.engine.num_blocks, config_.engine.enable_prefix_caching}) {
  std::string why;
  chat_template_ = ChatTemplate::from_model_dir(config_.model, &why);
  if (!chat_template_)
    std::fprintf(stderr, "kvfleet-replica: no usable chat template (%s); /v1/chat/completions will answer 400\n", why.c_str());
  if (chat_template_) template_renders_tools_ = tools::template_renders_tools(*chat_template_);
  if (!config_.tool_call_parser.empty() && !(tool_parser_ = tools::make_tool_parser(config_.tool_call_parser)))
    throw std::invalid_argument("unknown tool call parser '" + config_.tool_call_parser + "' (known: " +
                                tools::tool_parser_names() + ")");
  if (!config_.reasoning_parser.empty() && !(reasoning_parser_ = tools::make_reasoning_parser(config_.reasoning_parser)))
    throw std::invalid_argument("unknown reasoning parser '" + config_.reasoning_parser + "' (known: " +
                                tools::reasoning_parser_names() + ")");
  config_.engine.served_model_name = name_;
  if (!config_.otlp_endpoint.empty()) {
    trace::ExporterConfig ec;
    ec.endpoint = config_.otlp_endpoint;
    ec.service_name = "kvfleet-replica";
    spans_ = std::make_unique<trace::SpanExporter>(ec, metrics_.registry());
  }
  // An expert-parallel group signals no step end (remote ranks' outputs come off channel threads): there each
  // output wakes its job at once.
  relay_ = std::make_unique<OutputRelay>(/*immediate=*/config_.ep_size > 1);
  if (config_.ep_size > 1) {
    if (config_.role != "mixed") throw std::invalid_argument("--ep-size needs role mixed (KV transfer serves one engine)");
    if (config_.ep_processes()) {
      if (config_.ep_rank != 0) throw std::invalid_argument("only rank 0 of an expert-parallel group serves HTTP");
      std::fprintf(stderr, "kvfleet-replica: expert-parallel rank 0 of %d: waiting for the other ranks on %s\n",
                   config_.ep_size, config_.ep_master.c_str());
      ep_ = std::make_unique<EpGroup>(model_, config_.engine, ep_comm_options(config_));
    } else {
      ep_ = std::make_unique<EpGroup>(model_, config_.engine, config_.ep_size);
    }
    ep_->set_tokenizer(&tokenizer_);
    engine_ = &ep_->rank(0);
  } else {
    own_engine_ = std::make_unique<Engine>(model_, config_.engine);
    own_engine_->set_tokenizer(&tokenizer_);
    own_engine_->set_outputs_done([relay = relay_.get()] { relay->flush(); });
    engine_ = own_engine_.get();
    start_pd();
  }
  grammar_compiler_ = make_grammar_compiler(tokenizer_, model_.config().eos_token_ids, model_.config().vocab_size);
  responses_store_ = std::make_unique<ResponseStore>(
      ResponseStore::Limits{config_.responses_store_entries, config_.responses_store_bytes});
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Replica::~Replica() {
  if (server_) server_->stop(std::chrono::milliseconds(0));
  if (compile_pool_) compile_pool_->join();  // a compile in flight hands its result to the io_context first
  // The engine's callbacks fill OutputInboxes bound to the server's io_context: end the engine (its last
  // callbacks run now) before the io_context goes away with the server. KV transfer first: it frees its
  // pins through the engine.
  pd_prefill_.reset();
  pd_fetch_.reset();
  engine_ = nullptr;
  own_engine_.reset();
  ep_.reset();
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
  hc.header_timeout = config_.header_timeout;
  hc.max_connections = config_.max_connections;
  hc.max_connections_per_peer = config_.max_connections_per_peer;
  hc.priority_paths = {"/health", "/metrics"};  // probes answer past the connection caps; they never queue
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
  if (!clean) {
    // Out of time: end every request with an error, so that each stream still closes with an error event
    // and [DONE] (and each waiting client gets a 5xx) before the connections go.
    const char* why = "the replica is shutting down: its drain timeout passed before this request finished";
    if (ep_) ep_->abort_all(why);
    else engine_->abort_all(why);
    const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (in_flight_ > 0 && std::chrono::steady_clock::now() < grace)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server_->stop(std::chrono::milliseconds(clean ? 1000 : 200));
  return clean;
}

bool Replica::authorized(const http::Request& req, Access access) const {
  const std::string& key =
      access == Access::internal && !config_.internal_api_key.empty() ? config_.internal_api_key : config_.api_key;
  if (access == Access::open) return true;
  // No key guards the KV event stream and the prefill API: only clients on this machine get them, unless
  // the operator opens them (open_internal_endpoints) for a trusted network.
  if (key.empty()) return access != Access::internal || req.from_loopback || config_.open_internal_endpoints;
  const std::string* header = req.headers.find("Authorization");
  if (!header || header->size() < 7 || !http::iequals(std::string_view(*header).substr(0, 7), "Bearer ")) return false;
  std::string_view given = std::string_view(*header).substr(7);
  while (!given.empty() && given.front() == ' ') given.remove_prefix(1);
  return secure_equal(given, key);
}

http::Response Replica::refusal(Access access) const {
  if (access == Access::internal && config_.internal_api_key.empty() && config_.api_key.empty())
    return http::json_error(403,
                            "this endpoint is served to loopback clients only while the replica has no key: start it "
                            "with --internal-api-key KEY (and the router with --replica-api-key KEY), or with "
                            "--open-internal-endpoints on a trusted network",
                            "permission_error", "", "internal_endpoint_closed");
  http::Response r = http::json_error(401, "a valid API key is required: send 'Authorization: Bearer KEY'",
                                      "authentication_error", "", "invalid_api_key");
  r.headers.set("WWW-Authenticate", "Bearer");
  return r;
}

namespace {

// The path as a metric label: a resource's id is not a label value (it would make one series per id).
std::string route_label(std::string_view path) {
  constexpr std::string_view responses = "/v1/responses/";
  if (path.size() > responses.size() && path.substr(0, responses.size()) == responses) return "/v1/responses/{id}";
  return std::string(path);
}

}  // namespace

http::Handler Replica::guarded(awaitable<void> (Replica::*handler)(const http::Request&, http::ResponseWriter&),
                               Access access) {
  return [this, handler, access](const http::Request& req, http::ResponseWriter& w) -> awaitable<void> {
    ++in_flight_;
    struct Leave {
      std::atomic<int>& n;
      ~Leave() { --n; }
    } leave{in_flight_};
    std::optional<http::Response> error;
    if (!authorized(req, access)) {
      error = refusal(access);
    } else {
      try {
        co_await (this->*handler)(req, w);
      } catch (const ApiError& e) {
        error = http::json_error(e.status, e.what(), e.type, e.param, e.code);
      } catch (const TemplateError& e) {
        error = http::json_error(400, e.what(), "invalid_request_error", "messages");
      } catch (const std::exception& e) {
        // Input is validated before it gets here: whatever is left is our fault, not the client's.
        std::fprintf(stderr, "kvfleet-replica: %s %s failed: %s\n", req.method.c_str(), std::string(req.path()).c_str(),
                     e.what());
        error = http::json_error(500, std::string("internal error: ") + e.what(), "server_error");
      }
    }
    if (error) {
      metrics_.count_http(route_label(req.path()), error->status);
      if (error->status == 401) error->headers.set("WWW-Authenticate", "Bearer");
      if (!w.started()) co_await w.send(std::move(*error));
    } else {
      metrics_.count_http(route_label(req.path()), 200);
    }
  };
}

http::HttpRouter Replica::routes() {
  http::HttpRouter r;
  r.post("/v1/completions", guarded(&Replica::completions));
  r.post("/v1/chat/completions", guarded(&Replica::chat));
  r.get("/v1/models", guarded(&Replica::models));
  r.get("/health", guarded(&Replica::health, Access::open));
  r.get("/metrics", guarded(&Replica::metrics, Access::open));
  r.post("/tokenize", guarded(&Replica::tokenize));
  r.post("/detokenize", guarded(&Replica::detokenize));
  r.get("/v1/kv_events", guarded(&Replica::kv_events, Access::internal));
  add_responses_routes(r);
  add_pd_routes(r);
  return r;
}

void Replica::check_model(const std::string& requested) const {
  if (!requested.empty() && requested != name_)
    throw ApiError(404, "The model '" + requested + "' does not exist; this replica serves '" + name_ + "'",
                   "not_found_error", "model", "model_not_found");
}

Replica::Reservation& Replica::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    release(held_);
    counter_ = o.counter_;
    held_ = std::exchange(o.held_, 0);
  }
  return *this;
}

void Replica::Reservation::release(std::int64_t n) {
  n = std::min(n, held_);
  if (n <= 0 || !counter_) return;
  held_ -= n;
  counter_->fetch_sub(n);
}

Replica::Reservation Replica::admit(std::int64_t sequences, const char* param) {
  if (draining_) throw ApiError(503, "the replica is draining and takes no new requests", "overloaded_error");
  if (ep_)
    if (const std::string broken = ep_->failure(); !broken.empty()) throw ApiError(503, broken, "server_error");
  // Running plus waiting: what the scheduler runs at once and the queue the replica accepts behind it.
  const auto capacity = static_cast<std::int64_t>(config_.engine.scheduler.max_num_seqs) +
                        static_cast<std::int64_t>(config_.max_waiting_requests);
  if (sequences > capacity)
    throw bad_request("this request needs " + std::to_string(sequences) + " sequences (prompts x n); this replica admits at most " +
                          std::to_string(capacity) + " at once (max_num_seqs + max_waiting_requests)",
                      param);
  std::int64_t now = reserved_sequences_.load();
  do {
    if (now + sequences > capacity)
      throw ApiError(429, "too many requests are running or waiting; retry later", "rate_limit_error");
  } while (!reserved_sequences_.compare_exchange_weak(now, now + sequences));
  return Reservation(&reserved_sequences_, sequences);
}

void Replica::check_token_ids(const std::vector<TokenId>& ids, const char* param) const {
  const auto vocab = model_.config().vocab_size;
  for (TokenId t : ids)
    if (t < 0 || t >= vocab)
      throw bad_request("token id " + std::to_string(t) + " is outside this model's vocabulary (size " +
                            std::to_string(vocab) + ")", param);
}

std::vector<TokenId> Replica::chat_prompt(const ChatRequest& r, const tools::ToolParser* describe_tools) const {
  if (!chat_template_) throw bad_request("this model has no chat template (tokenizer_config.json)", "messages");
  ChatTemplateOptions opts;
  opts.add_generation_prompt = r.add_generation_prompt;
  json::array messages = r.messages;
  try {
    tools::prepare_chat_tools(messages, opts, r.tools, template_renders_tools_,
                              tool_parser_ ? tool_parser_.get() : describe_tools);
  } catch (const tools::ToolsNotRenderable& e) {
    throw bad_request(e.what(), "tools");
  }
  return tokenize_chat(*chat_template_, tokenizer_, messages, opts, config_.special_tokens_in_content);
}

awaitable<void> Replica::models(const http::Request&, http::ResponseWriter& w) {
  // The served name only: the model's local path is nobody's business.
  json::object model{{"id", name_}, {"object", "model"}, {"created", created_}, {"owned_by", "kvfleet"},
                     {"root", name_}, {"max_model_len", engine_->max_model_len()}};
  http::Response r = http::json_response(200, json::object{{"object", "list"}, {"data", json::array{model}}});
  co_await w.send(std::move(r));
}

namespace {

// An expert-parallel group's figures for a scrape: every rank asked now (a remote rank over its channel),
// or, when some rank has not answered within 500 ms (a frozen one, until the timeout fails the group),
// what the ranks last sent (remote ranks' stats frames: at most 200 ms old).
awaitable<EngineStats> ep_stats_now(const EpGroup& group) {
  auto ex = co_await boost::asio::this_coro::executor;
  using Answer = std::shared_ptr<const EngineStats>;  // null: the deadline came first
  auto answer = std::make_shared<http::AsyncQueue<Answer>>(ex);
  group.stats_now([answer](EngineStats s) { answer->push(std::make_shared<const EngineStats>(std::move(s))); });
  auto timer = std::make_shared<boost::asio::steady_timer>(ex, std::chrono::milliseconds(500));
  timer->async_wait([answer, timer](boost::system::error_code ec) {
    if (!ec) answer->push(Answer{});
  });
  std::optional<Answer> got = co_await answer->pop();
  timer->cancel();
  if (got && *got) co_return **got;
  co_return group.stats();
}

}  // namespace

awaitable<void> Replica::health(const http::Request&, http::ResponseWriter& w) {
  const std::string broken = ep_ ? ep_->failure() : std::string();  // a rank of the group is gone
  http::Response r = draining_          ? http::json_error(503, "draining", "overloaded_error")
                     : !broken.empty() ? http::json_error(503, broken, "server_error")
                                       : http::json_response(200, json::object{{"status", "ok"}, {"model", name_}});
  co_await w.send(std::move(r));
}

awaitable<void> Replica::metrics(const http::Request&, http::ResponseWriter& w) {
  EngineStats stats;
  if (ep_) stats = co_await ep_stats_now(*ep_);  // (no co_await inside ?: : GCC 12)
  else stats = engine_->stats();
  http::Response r = http::Response::text(200, metrics_.render(stats), "text/plain; version=0.0.4; charset=utf-8");
  co_await w.send(std::move(r));
}

awaitable<void> Replica::tokenize(const http::Request& req, http::ResponseWriter& w) {
  const TokenizeRequest t = parse_tokenize_request(parse_json_body(req.body));
  const std::vector<TokenId> ids = t.prompt ? tokenizer_.encode(*t.prompt, t.add_special_tokens) : chat_prompt(*t.chat);
  http::Response r = http::json_response(200, json::object{{"tokens", json::value_from(ids)}, {"count", ids.size()},
                                                           {"max_model_len", engine_->max_model_len()}});
  co_await w.send(std::move(r));
}

awaitable<void> Replica::detokenize(const http::Request& req, http::ResponseWriter& w) {
  const std::vector<TokenId> ids = parse_detokenize_request(parse_json_body(req.body));
  check_token_ids(ids, "tokens");
  http::Response r = http::json_response(200, json::object{{"prompt", tokenizer_.decode(ids)}});
  co_await w.send(std::move(r));
}

}  // namespace kvfleet::server
