// The replica's part in prefill/decode disaggregation (Contract 3): the role decides which side it serves.
//   prefill, mixed: POST /internal/prefill, GET /internal/prefill/blocks, POST /internal/prefill/release
//                   (engine/pd/prefill_service.h); a decode replica answers them 403.
//   decode, mixed:  a completion or chat request with `x-kvfleet-prefill-from: URL` first fetches the
//                   prompt's KV from that prefill replica (engine/pd/decode_fetcher.h); any failure means a
//                   local prefill, never a failed request. A prefill replica ignores the header.
//   every role:     GET /internal/kv_state, the engine-thread integrity check and the pin/lease counts (an
//                   expert-parallel group: every rank's, in "ranks" with its dp_rank; EpGroup::kv_state).
#include <boost/json.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <span>
#include <string_view>

#include "engine/pd/decode_fetcher.h"
#include "engine/pd/prefill_service.h"
#include "engine/pd/ucx/worker.h"
#include "engine/ep/wire.h"
#include "engine/server/replica.h"
#include "kvfleet/ep_group.h"
#include "kvfleet/http/async_queue.h"
#include "kvfleet/http/json_error.h"

namespace kvfleet::server {
namespace json = boost::json;
using boost::asio::awaitable;

void Replica::start_pd() {
  const pd::KvLayout layout = pd::layout_of(model_, *engine_);
  pd_metrics_ = std::make_unique<pd::PdMetrics>(metrics_.registry());
  if (config_.role != "decode") pd_prefill_ = std::make_unique<pd::PrefillService>(*engine_, layout, config_.pd);
  config_.pd.peer_api_key = config_.internal_api_key.empty() ? config_.api_key : config_.internal_api_key;
  if (config_.role != "prefill") pd_fetch_ = std::make_unique<pd::DecodeFetcher>(*engine_, layout, config_.pd, pd_metrics_.get());
  start_pd_ucx();
}

// The ucx transport, when pd_transports lists it: one UCP worker for both sides. When UCX cannot start
// (or P cannot listen), the replica says so and speaks tcp alone; it never fails to start for it.
void Replica::start_pd_ucx() {
  const auto& ts = config_.pd.transports;
  if (std::find(ts.begin(), ts.end(), "ucx") == ts.end()) return;
  std::string why;
  std::shared_ptr<pd::UcxWorker> worker = pd::UcxWorker::create(why);
  if (!worker) {
    std::fprintf(stderr, "kvfleet-replica: no UCX KV transport (%s); tcp only\n", why.c_str());
    return;
  }
  if (pd_prefill_) {
    try {
      pd_prefill_->enable_ucx(worker, config_.host, config_.pd.ucx_port, config_.pd.peer_api_key);
      std::fprintf(stderr, "kvfleet-replica: KV transfers over UCX on %s:%u\n", config_.host.c_str(), pd_prefill_->ucx_port());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvfleet-replica: no UCX listener (%s); P offers tcp only\n", e.what());
    }
  }
  if (pd_fetch_) pd_fetch_->enable_ucx(worker);
}

namespace {

// Passes everything through to the connection's writer and remembers the status it answered with: P's
// handlers write their own answers (410, 409, a stream of frames), and kvfleet_http_requests_total
// counts what each request really got.
class StatusRecorder final : public http::ResponseWriter {
 public:
  explicit StatusRecorder(http::ResponseWriter& inner) : inner_(inner) {}
  int status() const { return status_; }

  awaitable<bool> send(http::Response response) override {
    status_ = response.status;
    co_return co_await inner_.send(std::move(response));
  }
  awaitable<bool> begin_stream(int status, http::Headers headers) override {
    status_ = status;
    co_return co_await inner_.begin_stream(status, std::move(headers));
  }
  awaitable<bool> write(std::string_view piece) override { return inner_.write(piece); }
  awaitable<bool> write_pieces(std::span<const std::string_view> pieces) override { return inner_.write_pieces(pieces); }
  awaitable<bool> finish() override { return inner_.finish(); }
  bool client_gone() const override { return inner_.client_gone(); }
  void on_disconnect(std::function<void()> callback) override { inner_.on_disconnect(std::move(callback)); }
  bool started() const override { return inner_.started(); }

 private:
  http::ResponseWriter& inner_;
  int status_ = 500;  // what the server answers for a handler that throws before answering
};

}  // namespace

void Replica::add_pd_routes(http::HttpRouter& r) {
  using Method = awaitable<void> (pd::PrefillService::*)(const http::Request&, http::ResponseWriter&);
  const auto p_side = [this](Method m) -> http::Handler {
    return [this, m](const http::Request& req, http::ResponseWriter& client) -> awaitable<void> {
      StatusRecorder w(client);
      struct Count {  // however the handler ends (a throw included)
        ReplicaMetrics& metrics;
        const http::Request& req;
        const StatusRecorder& w;
        ~Count() { metrics.count_http(std::string(req.path()), w.status()); }
      } count{metrics_, req, w};
      if (!authorized(req, Access::internal)) {
        co_await w.send(refusal(Access::internal));
        co_return;
      }
      if (!pd_prefill_) {
        co_await w.send(http::json_error(403, "this replica's role is " + config_.role + "; it serves no KV transfers",
                                         "invalid_request_error", {}, "wrong_role"));
        co_return;
      }
      if (m != &pd::PrefillService::handle_prefill) {
        co_await (pd_prefill_.get()->*m)(req, w);
        co_return;
      }
      // The handshake, where P prefills the prompt: a span in the decode replica's trace.
      const auto parent = trace::parse_traceparent(req.headers.find("traceparent"), req.headers.find("tracestate"));
      trace::Span span = trace::start_span(parent, "replica.kv_prefill", trace::SpanKind::server);
      span.set("url.path", std::string(req.path()));
      struct End {
        Replica& r;
        trace::Span& span;
        const StatusRecorder& w;
        ~End() {
          span.set("http.response.status_code", static_cast<std::int64_t>(w.status()));
          span.error = w.status() >= 500;
          r.end_span(span);
        }
      } end{*this, span, w};
      co_await (pd_prefill_.get()->*m)(req, w);
    };
  };
  r.post("/internal/prefill", p_side(&pd::PrefillService::handle_prefill));
  r.get("/internal/prefill/blocks", p_side(&pd::PrefillService::handle_pull));
  r.post("/internal/prefill/release", p_side(&pd::PrefillService::handle_release));
  r.get("/internal/kv_state", guarded(&Replica::kv_state, Access::internal));
}

awaitable<std::vector<pd::FetchResult>> Replica::pd_prefetch(const http::Request& req,
                                                             const std::vector<std::vector<TokenId>>& prompts,
                                                             const std::string& cache_salt, http::ResponseWriter& w,
                                                             const trace::Span& parent) {
  std::vector<pd::FetchResult> out;
  const std::string* from = req.headers.find("x-kvfleet-prefill-from");
  if (!from || from->empty() || !pd_fetch_) co_return out;
  for (const auto& prompt : prompts) {
    trace::Span span = trace::child_span(parent, "replica.kv_transfer", trace::SpanKind::client);
    out.push_back(co_await pd_fetch_->fetch(prompt, *from, w, cache_salt, trace::format_traceparent(span.context())));
    const pd::FetchResult& r = out.back();
    span.set("kvfleet.pd.prefill_from", *from);
    span.set("kvfleet.pd.wanted_blocks", static_cast<std::int64_t>(r.wanted_blocks));
    span.set("kvfleet.pd.imported_blocks", static_cast<std::int64_t>(r.imported_blocks));
    span.set("kvfleet.pd.bytes", static_cast<std::int64_t>(r.bytes));
    if (!r.fallback.empty()) span.set("kvfleet.pd.fallback", r.fallback);
    end_span(span);
    if (!r.fallback.empty())
      std::fprintf(stderr, "kvfleet-replica: KV transfer from %s fell back to local prefill (%s): %s\n", from->c_str(),
                   r.fallback.c_str(), r.detail.c_str());
    if (w.client_gone()) break;
  }
  co_return out;
}

awaitable<void> Replica::kv_state(const http::Request&, http::ResponseWriter& w) {
  json::object o;
  if (ep_) {  // every rank's figures (EpGroup::kv_state): in process, or asked over the ranks' channels
    auto answer = std::make_shared<http::AsyncQueue<json::object>>(co_await boost::asio::this_coro::executor);
    ep_->kv_state([answer](json::object a) { answer->push(std::move(a)); });
    std::optional<json::object> got = co_await answer->pop();
    if (got) o = std::move(*got);
  } else {
    auto check = [](Scheduler& s, Backend&) { return ep::kv_state_json(s); };
    o = co_await pd::on_engine_thread(*engine_, std::move(check));  // (named: GCC 12, see client.h)
  }
  o["role"] = config_.role;
  o["leases"] = pd_prefill_ ? pd_prefill_->num_leases() : 0;
  o["leases_expired"] = pd_prefill_ ? pd_prefill_->leases_expired() : 0;
  http::Response r = http::json_response(200, o);
  co_await w.send(std::move(r));
}

}  // namespace kvfleet::server
