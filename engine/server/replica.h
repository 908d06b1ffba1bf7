// Replica: the OpenAI-compatible server around one engine (docs/architecture.md, Contract 4). Owns the model, tokenizer,
// chat template, engine, metrics and HTTP server.
//
// Threading: construct, start(), drain() and the destructor on the main thread. Handlers run on the HTTP io
// threads; they talk to the engine through Engine::submit/abort and receive tokens through their job's
// OutputInbox, which the engine thread fills and the relay wakes once per engine step (output/relay.h).
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "engine/server/api/structured_output.h"
#include "engine/server/replica_config.h"
#include "engine/server/replica_metrics.h"
#include "kvfleet/chat_template.h"
#include "kvfleet/reasoning_parser.h"
#include "kvfleet/tool_parser.h"
#include "kvfleet/engine.h"
#include "kvfleet/ep_group.h"
#include "kvfleet/http/server.h"
#include "kvfleet/tokenizer.h"
#include "kvfleet/trace/exporter.h"

namespace kvfleet::pd {
class PdMetrics;
class PrefillService;
class DecodeFetcher;
struct FetchResult;
}  // namespace kvfleet::pd

namespace kvfleet::server {

struct CompletionRequest;
struct ChatRequest;
class ResponseStore;
struct GenerateParams;
class OutputRelay;

// A grammar error's param under a forced tool_choice's call-list schema ("tools.items.anyOf.2.properties.
// parameters.x") as the request names it ("tools[2].function.parameters.x"); other params unchanged.
std::string tool_schema_param(const std::string& param);

class Replica {
 public:
  // Loads the model, tokenizer and chat template and starts the engine; throws with a clear message when the
  // model directory is unusable.
  explicit Replica(ReplicaConfig config);
  ~Replica();

  void start();
  std::uint16_t port() const;
  // The grammar engine behind structured outputs (response_format, structured_outputs, guided_*): compiles a
  // request's constraint into a grammar over this replica's vocabulary. Set it before start(). Without one,
  // a constrained request is a 400 naming its field.
  void set_grammar_compiler(GrammarCompiler compiler) { grammar_compiler_ = std::move(compiler); }
  const std::string& model_name() const { return name_; }

  // Refuses new work with 503, lets running requests finish within drain_timeout, then stops the server.
  // Returns true when everything finished in time.
  bool drain();

  struct Job;  // opaque: one API request's choices while they run (generate_handlers.cpp)
  // The engine, for in-process tests that inspect the KV cache (Engine::run_kv_task); rank 0's under
  // expert parallelism.
  Engine& engine() { return *engine_; }
  // --ep-size N > 1: the group of N in-process ranks that serves this endpoint (null otherwise).
  EpGroup* ep_group() { return ep_.get(); }

 private:
  http::HttpRouter routes();
  using Awaitable = boost::asio::awaitable<void>;
  Awaitable completions(const http::Request& req, http::ResponseWriter& w);
  Awaitable chat(const http::Request& req, http::ResponseWriter& w);
  // A chat completion whose replica.request span is `span` (the Responses API's own, or chat()'s).
  Awaitable run_chat(const http::Request& req, http::ResponseWriter& w, trace::Span& span);
  Awaitable models(const http::Request& req, http::ResponseWriter& w);
  Awaitable health(const http::Request& req, http::ResponseWriter& w);
  Awaitable metrics(const http::Request& req, http::ResponseWriter& w);
  Awaitable tokenize(const http::Request& req, http::ResponseWriter& w);
  Awaitable detokenize(const http::Request& req, http::ResponseWriter& w);
  Awaitable kv_events(const http::Request& req, http::ResponseWriter& w);
  // The Responses API (responses/handler.cpp): POST /v1/responses runs as a chat completion; GET and
  // DELETE /v1/responses/{id} read the store.
  void add_responses_routes(http::HttpRouter& r);
  Awaitable responses(const http::Request& req, http::ResponseWriter& w);
  Awaitable response_by_id(const http::Request& req, http::ResponseWriter& w);
  boost::json::array resolve_references(const boost::json::array& items);
  void truncate_to_fit(boost::json::array& messages, const boost::json::object& chat) const;
  // KV transfer (Contract 3, pd_handlers.cpp): P's endpoints, D's fetch before a request runs, and
  // GET /internal/kv_state (integrity check, pins, leases) that the fault tests read.
  void start_pd();
  void add_pd_routes(http::HttpRouter& r);
  void start_pd_ucx();
  Awaitable kv_state(const http::Request& req, http::ResponseWriter& w);
  boost::asio::awaitable<std::vector<pd::FetchResult>> pd_prefetch(const http::Request& req,
                                                                   const std::vector<std::vector<TokenId>>& prompts,
                                                                   const std::string& cache_salt,
                                                                   http::ResponseWriter& w, const trace::Span& parent);

  // The request's structured output compiled into a grammar (null: none), on compile_pool_: a slow compile
  // holds neither an HTTP thread nor the engine's steps (structured_handlers.cpp).
  boost::asio::awaitable<std::shared_ptr<const TokenGrammar>> compile_constraint(const GenerateParams& p);
  Awaitable run_job(Job& job, http::ResponseWriter& w);
  Awaitable stream_job(Job& job, http::ResponseWriter& w);
  // One engine output into its choice (metrics, reservation); returns the text that may be sent now.
  std::string take_output(Job& job, std::size_t choice, const RequestOutput& out);
  void check_params(const GenerateParams& p) const;
  void continue_stream(Job& job, const GenerateParams& p);
  void check_model(const std::string& requested) const;
  // Tracing (kvfleet/trace/span.h): a request's span under the caller's traceparent, and its phases
  // (queue, prefill, decode) from the first choice's outputs. end_span() hands a span to the exporter.
  trace::Span start_request_span(const http::Request& req, const char* operation) const;
  void trace_phases(Job& job, const RequestOutput& out);
  void end_span(trace::Span& span);
  struct SpanEnd {  // a handler's request span ends however the handler does
    Replica& replica;
    trace::Span& span;
    ~SpanEnd() { replica.end_span(span); }
  };

  // Sequences admitted and not finished, counted when a request is admitted (not when the engine next
  // reports): one request's fan-out (prompts x n) is reserved at once or refused. Move-only.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(std::atomic<std::int64_t>* counter, std::int64_t n) : counter_(counter), held_(n) {}
    Reservation(Reservation&& o) noexcept : counter_(o.counter_), held_(std::exchange(o.held_, 0)) {}
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { release(held_); }
    void release(std::int64_t n);

   private:
    std::atomic<std::int64_t>* counter_ = nullptr;
    std::int64_t held_ = 0;
  };
  // 503 when draining; 400 when `sequences` exceed what this replica can ever hold at once; 429 when
  // they do not fit now.
  Reservation admit(std::int64_t sequences, const char* param);
  GenerationRequest make_request(const std::vector<TokenId>& prompt, const GenerateParams& p, int choice, bool chat) const;
  // The chat prompt; `describe_tools` lists the tools for a template without a tools section when this
  // replica has no --tool-call-parser (a forced tool_choice's parser).
  std::vector<TokenId> chat_prompt(const ChatRequest& r, const tools::ToolParser* describe_tools = nullptr) const;
  // How the answer is read for tool calls (tool_choice and the flags, tool_choice.cpp): `parser` null when
  // it is not; a forced tool_choice (required, named) also sets r.params.structured to the JSON Schema of
  // the call(s) and owns its parser in `forced`. 400 for what is not served.
  struct ToolCallPlan {
    const tools::ToolParser* parser = nullptr;
    std::shared_ptr<const tools::ToolParser> forced;
  };
  ToolCallPlan plan_tool_calls(ChatRequest& r) const;
  void check_token_ids(const std::vector<TokenId>& ids, const char* param) const;

  // Who may call a route: anyone (probes, Prometheus), the API key, or the internal key.
  enum class Access { open, api, internal };
  bool authorized(const http::Request& req, Access access) const;
  // The answer to a request authorized() refused: 401 for a wrong or missing key; 403 for an internal
  // endpoint asked from another machine while the replica has no key.
  http::Response refusal(Access access) const;
  // Wraps a handler: checks the key, turns ApiError, bad input and internal failures into OpenAI error
  // bodies (4xx for the client's faults, 5xx for ours); counts requests in flight.
  http::Handler guarded(Awaitable (Replica::*handler)(const http::Request&, http::ResponseWriter&),
                        Access access = Access::api);

  ReplicaConfig config_;
  Model model_;
  std::string name_;
  Tokenizer tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  bool template_renders_tools_ = false;  // the template has a tools section (kvfleet/chat_tools.h)
  std::unique_ptr<tools::ToolParser> tool_parser_;            // --tool-call-parser (null: none)
  std::unique_ptr<tools::ReasoningParser> reasoning_parser_;  // --reasoning-parser (null: none)
  // The engine's outputs to the jobs' inboxes; outlives the engine, whose callbacks and step-end hook use it.
  std::unique_ptr<OutputRelay> relay_;
  // engine_ is the replica's engine: own_engine_, or rank 0 of ep_ (--ep-size N > 1), where requests go to
  // the rank ep_ picks and KV events are ep_'s merged stream.
  std::unique_ptr<Engine> own_engine_;
  std::unique_ptr<EpGroup> ep_;
  Engine* engine_ = nullptr;
  ReplicaMetrics metrics_;
  std::unique_ptr<trace::SpanExporter> spans_;  // null without otlp_endpoint
  std::unique_ptr<pd::PdMetrics> pd_metrics_;
  std::unique_ptr<pd::PrefillService> pd_prefill_;  // roles prefill and mixed
  std::unique_ptr<pd::DecodeFetcher> pd_fetch_;      // roles decode and mixed
  std::unique_ptr<ResponseStore> responses_store_;  // stored responses (thread-safe)
  std::unique_ptr<http::HttpServer> server_;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<std::int64_t> reserved_sequences_{0};
  std::int64_t created_ = 0;
  GrammarCompiler grammar_compiler_;
  std::unique_ptr<boost::asio::thread_pool> compile_pool_;  // made with the first constrained request
  std::once_flag compile_pool_once_;
};

}  // namespace kvfleet::server
