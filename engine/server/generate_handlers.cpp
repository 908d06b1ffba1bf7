// POST /v1/completions and /v1/chat/completions: requests become engine requests (n choices per prompt),
// whose tokens come back through the job's OutputInbox (woken once per engine step, output/relay.h) and
// leave as one JSON response or as SSE chunks (one write per step for all of a job's choices).
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <random>

#include "engine/pd/decode_fetcher.h"
#include "engine/server/api/request.h"
#include "engine/server/output/choice_stream.h"
#include "engine/server/output/relay.h"
#include "engine/server/reasoning_grammar.h"
#include "engine/server/replica.h"
#include "kvfleet/chat_output.h"
#include "kvfleet/http/json_error.h"

namespace kvfleet::server {
namespace json = boost::json;
using boost::asio::awaitable;
using Clock = std::chrono::steady_clock;

struct Replica::Job {
  bool chat = false;
  std::string id;
  std::int64_t created = 0;  // the request's arrival (unix seconds)
  GenerateParams params;
  // Chat answers taken apart (reasoning, tool calls); `parse` false: the text is the content.
  bool parse = false;
  tools::ChatOutputOptions output;
  std::shared_ptr<const tools::ToolParser> forced_tools;  // a forced tool_choice's parser (output.tools)
  bool strip_final_special = false;  // special tokens kept for a parser: drop the stop token's text
  struct Choice {
    GenerationRequest request;
    std::unique_ptr<ChoiceStream> stream;
    RequestId rid = 0;
    int rank = 0;            // --ep-size N: the rank that runs it
    std::string echo;        // completions with echo: the prompt's text, sent before the output
    std::size_t prompt = 0;  // which prompt it belongs to
    bool role_sent = false;
    Clock::time_point last_token;
    std::unique_ptr<tools::ChatOutputStream> parser;  // streams of parsed chat answers
    std::size_t logprobs_sent = 0;
  };
  std::vector<Choice> choices;
  Reservation reservation;  // one sequence per choice, released as each finishes
  std::shared_ptr<OutputInbox> inbox;  // the engine thread's outputs, tagged with the choice
  Clock::time_point arrival = Clock::now();
  // Tracing: the request's span (null: not traced), and the first choice's phases so far.
  trace::Span* span = nullptr;
  std::uint64_t submitted_ns = 0, first_token_ns = 0;
};

namespace {

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

std::uint64_t random_seed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

std::string sse(const json::value& v) { return "data: " + json::serialize(v) + "\n\n"; }

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

GenerationRequest Replica::make_request(const std::vector<TokenId>& prompt, const GenerateParams& p, int choice,
                                        bool chat) const {
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling = p.sampling;
  // Each choice draws its own numbers: seed + choice when seeded (reproducible), else a random seed.
  r.sampling.seed = p.seeded ? p.sampling.seed + static_cast<std::uint64_t>(choice) : random_seed();
  const auto room = engine_->max_model_len() - static_cast<std::int64_t>(prompt.size());
  if (room < 1)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(engine_->max_model_len()) +
                            " tokens; the prompt has " + std::to_string(prompt.size()),
                   "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded");
  if (p.max_tokens && *p.max_tokens > room)
    throw ApiError(400, "max_tokens (" + std::to_string(*p.max_tokens) + ") plus the prompt (" +
                            std::to_string(prompt.size()) + " tokens) exceed the context length of " +
                            std::to_string(engine_->max_model_len()) + " tokens",
                   "invalid_request_error", "max_tokens", "context_length_exceeded");
  r.max_tokens = p.max_tokens ? *p.max_tokens
                              : static_cast<std::int32_t>(chat ? room : std::min<std::int64_t>(room, config_.default_max_tokens));
  r.ignore_eos = p.ignore_eos;
  r.stop = p.stop;
  r.detokenize = true;  // the engine decodes once; ChoiceStream streams RequestOutput::text
  r.skip_special_tokens = p.skip_special_tokens;
  r.stop_token_ids = p.stop_token_ids;
  r.penalties = {p.presence_penalty, p.frequency_penalty, p.repetition_penalty};
  r.logprobs = p.logprobs ? *p.logprobs : -1;
  r.logit_bias = p.logit_bias;
  r.cache_salt = p.cache_salt;
  r.priority = p.priority;
  if (p.resume) r.resumed_outputs = p.resume->output_token_ids;
  return r;
}

void Replica::check_params(const GenerateParams& p) const {
  const int ranks = ep_ ? ep_->size() : 1;  // a replica without ranks is rank 0 of 1
  if (p.dp_rank && *p.dp_rank >= ranks)
    throw bad_request("data_parallel_rank " + std::to_string(*p.dp_rank) + " is out of range [0, " + std::to_string(ranks) +
                          ")", "data_parallel_rank");
  if (p.priority != 0 && !config_.engine.scheduler.use_priority)
    throw bad_request("'priority' needs a replica started with --scheduling-policy priority (this one serves first "
                      "come, first served)", "priority");
  check_token_ids(p.stop_token_ids, "stop_token_ids");
  if (p.resume) check_token_ids(p.resume->output_token_ids, "kvfleet_resume.output_token_ids");
  std::vector<TokenId> biased;
  for (const auto& [id, bias] : p.logit_bias) biased.push_back(id);
  check_token_ids(biased, "logit_bias");
}

trace::Span Replica::start_request_span(const http::Request& req, const char* operation) const {
  const auto parent = trace::parse_traceparent(req.headers.find("traceparent"), req.headers.find("tracestate"));
  trace::Span span = trace::start_span(parent, "replica.request", trace::SpanKind::server);
  span.set("url.path", std::string(req.path()));
  span.set("gen_ai.operation.name", operation);
  span.set("gen_ai.request.model", name_);
  return span;
}

void Replica::end_span(trace::Span& span) {
  span.end_ns = trace::unix_nanos_now();
  if (spans_) spans_->export_span(std::move(span));
}

// The first choice's phases as spans under the request's: queue (submit to its first scheduled step), prefill
// (to its first token, an event on the request span too), decode (to its last output), and each load of its
// prefix from a lower KV tier (inside its queue time: the sequence waits for them).
void Replica::trace_phases(Job& job, const RequestOutput& out) {
  const std::uint64_t now = trace::unix_nanos_now();
  const std::uint64_t scheduled = job.submitted_ns + static_cast<std::uint64_t>(out.queue_time_s * 1e9);
  auto phase = [&](const char* name, std::uint64_t start, std::uint64_t end) {
    trace::Span s = trace::child_span(*job.span, name);
    s.start_ns = start;
    s.end_ns = std::max(start, end);
    return s;
  };
  for (const KvTierLoad& load : out.kv_tier_loads) {  // the first output's: its prefix from lower KV tiers
    trace::Span s = phase("replica.kv_load", load.start_ns, load.end_ns);
    s.set("kvfleet.kv_tier.medium", to_string(load.medium));
    s.set("kvfleet.kv_tier.blocks", static_cast<std::int64_t>(load.blocks));
    if (spans_) spans_->export_span(std::move(s));
  }
  if (!out.new_tokens.empty() && job.first_token_ns == 0) {
    job.first_token_ns = now;
    job.span->events.push_back({"first_token", now});
    trace::Span queue = phase("replica.queue", job.submitted_ns, scheduled);
    if (spans_) spans_->export_span(std::move(queue));
    trace::Span prefill = phase("replica.prefill", scheduled, now);
    prefill.set("gen_ai.usage.input_tokens", static_cast<std::int64_t>(out.num_prompt_tokens));
    prefill.set("kvfleet.cached_tokens", static_cast<std::int64_t>(out.num_cached_tokens));
    if (spans_) spans_->export_span(std::move(prefill));
  }
  if (!out.finished) return;
  if (job.first_token_ns == 0) {  // ended before any token (an error, an abort): only its wait
    trace::Span queue = phase("replica.queue", job.submitted_ns, scheduled);
    if (spans_) spans_->export_span(std::move(queue));
    job.span->error = !out.error.empty();
    return;
  }
  trace::Span decode = phase("replica.decode", job.first_token_ns, now);
  const Job::Choice& ch = job.choices.front();
  decode.set("gen_ai.usage.output_tokens", static_cast<std::int64_t>(ch.stream ? ch.stream->tokens().size() : 0));
  if (spans_) spans_->export_span(std::move(decode));
  job.span->set("gen_ai.response.id", job.id);
  job.span->set("gen_ai.usage.input_tokens", static_cast<std::int64_t>(out.num_prompt_tokens));
  job.span->set("gen_ai.usage.output_tokens", static_cast<std::int64_t>(ch.stream ? ch.stream->tokens().size() : 0));
  job.span->error = !out.error.empty();
}

awaitable<void> Replica::completions(const http::Request& req, http::ResponseWriter& w) {
  trace::Span span = start_request_span(req, "text_completion");
  const SpanEnd end_span_guard{*this, span};
  const std::int64_t arrival = unix_now();
  CompletionRequest r = parse_completion_request(parse_json_body(req.body));
  apply_dp_rank_header(req.headers.find("x-data-parallel-rank"), r.params);
  apply_token_ids_header(req.headers.find("x-kvfleet-token-ids"), r.params);
  check_model(r.model);
  check_params(r.params);
  const auto grammar = co_await compile_constraint(r.params);
  Job job;
  job.span = &span;
  job.reservation = admit(static_cast<std::int64_t>(r.prompts.size()) * r.params.n, "n");
  job.id = random_id("cmpl-");
  job.created = arrival;
  continue_stream(job, r.params);
  job.params = r.params;
  for (std::size_t p = 0; p < r.prompts.size(); ++p) {
    const auto& prompt = r.prompts[p];
    const std::vector<TokenId> ids = prompt.text ? tokenizer_.encode(*prompt.text, true) : prompt.ids;
    if (!prompt.text) check_token_ids(ids, "prompt");
    if (ids.empty()) throw bad_request("the prompt is empty after tokenization", "prompt");
    for (int c = 0; c < r.params.n; ++c) {
      Job::Choice ch;
      ch.request = make_request(ids, r.params, c, false);
      ch.request.grammar = grammar;
      ch.prompt = p;
      if (r.echo) ch.echo = prompt.text ? *prompt.text : tokenizer_.decode(ids);
      job.choices.push_back(std::move(ch));
    }
  }
  std::vector<std::vector<TokenId>> prompts;  // x-kvfleet-prefill-from: fetch their KV first (Contract 3)
  for (const auto& ch : job.choices)
    if (prompts.empty() || prompts.back() != ch.request.prompt) prompts.push_back(ch.request.prompt);
  const auto fetched = co_await pd_prefetch(req, prompts, r.params.cache_salt, w, span);  // holds them until the job ends
  if (w.client_gone()) co_return;
  co_await run_job(job, w);
}

awaitable<void> Replica::chat(const http::Request& req, http::ResponseWriter& w) {
  trace::Span span = start_request_span(req, "chat");
  const SpanEnd end_span_guard{*this, span};
  co_await run_chat(req, w, span);
}

awaitable<void> Replica::run_chat(const http::Request& req, http::ResponseWriter& w, trace::Span& span) {
  const std::int64_t arrival = unix_now();
  ChatRequest r = parse_chat_request(parse_json_body(req.body));
  apply_dp_rank_header(req.headers.find("x-data-parallel-rank"), r.params);
  apply_token_ids_header(req.headers.find("x-kvfleet-token-ids"), r.params);
  check_model(r.model);
  check_params(r.params);
  if (!chat_template_) throw bad_request("this model has no chat template (tokenizer_config.json)", "messages");
  Job job;
  job.span = &span;
  const ToolCallPlan calls = plan_tool_calls(r);
  auto grammar = co_await compile_constraint(r.params);
  if (grammar && reasoning_parser_)  // the answer after the reasoning is constrained, not the reasoning
    if (const auto tokens = reasoning_tokens(reasoning_parser_->name(), tokenizer_)) grammar = after_reasoning(grammar, *tokens);
  job.forced_tools = calls.forced;
  job.output.reasoning = reasoning_parser_.get();
  if (calls.parser) {
    job.output.tools = calls.parser;
    job.output.parallel_tool_calls = r.parallel_tool_calls;
    // Markers that are special tokens must survive decoding (vLLM's parsers ask the same).
    if (calls.parser->needs_special_tokens() && r.params.skip_special_tokens) {
      r.params.skip_special_tokens = false;
      job.strip_final_special = true;
    }
  }
  job.parse = job.output.reasoning || job.output.tools;
  job.reservation = admit(r.params.n, "n");
  const std::vector<TokenId> ids = chat_prompt(r, calls.forced.get());
  job.chat = true;
  job.id = random_id("chatcmpl-");
  job.created = arrival;
  continue_stream(job, r.params);
  job.params = r.params;
  for (int c = 0; c < r.params.n; ++c) {
    Job::Choice ch;
    ch.request = make_request(ids, r.params, c, true);
    ch.request.grammar = grammar;
    job.choices.push_back(std::move(ch));
  }
  const std::vector<std::vector<TokenId>> prompts{ids};
  const auto fetched = co_await pd_prefetch(req, prompts, r.params.cache_salt, w, span);  // x-kvfleet-prefill-from (Contract 3)
  if (w.client_gone()) co_return;
  co_await run_job(job, w);
}

// kvfleet_resume: the stream goes on under the id and created its client already has.
void Replica::continue_stream(Job& job, const GenerateParams& p) {
  if (!p.resume) return;
  if (p.resume->id) job.id = *p.resume->id;
  if (p.resume->created) job.created = *p.resume->created;
}

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

json::value finish_value(const ChoiceStream& s) {
  return s.finished() ? json::value(s.finish_reason()) : json::value(nullptr);
}

// What a stream sends when it cannot go on: its status (200) is gone, so the error travels as an event.
std::string error_event(const std::string& message) {
  return sse(json::object{{"error", json::object{{"message", message}, {"type", "server_error"}, {"param", nullptr},
                                                 {"code", nullptr}}}});
}

// With special tokens kept for a parser, a finished answer ends in its stop token's text: its length.
std::size_t special_tail(const Replica::Job& job, const ChoiceStream& s, const Tokenizer& tok) {
  if (!job.strip_final_special || !s.finished() || s.finish_reason() != "stop" || s.tokens().empty()) return 0;
  const TokenId last = s.tokens().back();
  if (!tok.is_special(last)) return 0;
  const std::string text = tok.decode(std::span(&last, 1));
  return s.text().ends_with(text) ? text.size() : 0;
}

json::array tool_calls_json(const std::vector<tools::ToolCall>& calls) {
  json::array out;
  for (const auto& c : calls)
    out.push_back(json::object{{"id", c.id}, {"type", "function"},
                               {"function", json::object{{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

// One tool-call delta as the OpenAI API streams it: index, id, type and name first, then arguments.
json::object tool_call_delta(const tools::ToolCallDelta& d) {
  json::object fn{{"arguments", d.arguments}};
  json::object call{{"index", d.index}};
  if (d.id) {
    call["id"] = *d.id;
    call["type"] = "function";
    fn["name"] = *d.name;
  }
  call["function"] = std::move(fn);
  return call;
}

// Usage: each prompt counted once, every choice's tokens.
json::object usage_of(const Replica::Job& job) {
  std::int64_t prompt_tokens = 0, completion_tokens = 0, cached = 0;
  std::vector<bool> counted(job.choices.size() + 1, false);
  for (const auto& ch : job.choices) {
    completion_tokens += static_cast<std::int64_t>(ch.stream->tokens().size());
    if (counted[ch.prompt]) continue;
    counted[ch.prompt] = true;
    prompt_tokens += static_cast<std::int64_t>(ch.request.prompt.size());
    cached += ch.stream->num_cached_tokens();
  }
  return {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", json::object{{"cached_tokens", cached}}}};
}

}  // namespace

std::string Replica::take_output(Job& job, std::size_t i, const RequestOutput& out) {
  Job::Choice& ch = job.choices.at(i);
  const auto now = Clock::now();
  if (!out.new_tokens.empty()) {
    if (ch.last_token == Clock::time_point{}) metrics_.observe_ttft(seconds(now - job.arrival));
    else metrics_.observe_itl(seconds(now - ch.last_token));
    ch.last_token = now;
  }
  std::string piece = ch.stream->push(out);
  if (i == 0 && job.span) trace_phases(job, out);
  if (out.finished) {
    job.reservation.release(1);
    metrics_.observe_e2e(seconds(now - job.arrival));
    metrics_.observe_queue(out.queue_time_s);
  }
  return piece;
}

awaitable<void> Replica::run_job(Job& job, http::ResponseWriter& w) {
  job.inbox = std::make_shared<OutputInbox>(co_await boost::asio::this_coro::executor);
  for (auto& ch : job.choices) {
    ch.stream = std::make_unique<ChoiceStream>();
    if (job.params.resume) {  // the client has the stream's first chunk (role, echo) from the first replica
      ch.stream->resume(job.params.resume->output_token_ids, job.params.logprobs.has_value());
      ch.role_sent = true;
      ch.echo.clear();
    }
  }
  // On every way out, an exception included: unhook the disconnect callback (it refers to this frame and
  // to `job`) and abort what still runs, so that nothing outlives the request.
  struct Hook {
    Engine& engine;
    EpGroup* ep;
    Job& job;
    http::ResponseWriter& w;
    void abort_unfinished() {
      for (auto& ch : job.choices) {
        if (!ch.rid || ch.stream->finished()) continue;
        if (ep) ep->abort({ch.rank, ch.rid});
        else engine.abort(ch.rid);
      }
    }
    ~Hook() {
      w.on_disconnect([] {});
      abort_unfinished();
    }
  } hook{*engine_, ep_.get(), job, w};
  job.submitted_ns = trace::unix_nanos_now();
  try {
    for (std::size_t i = 0; i < job.choices.size(); ++i) {
      OutputCallback on_output = relay_->callback(job.inbox, i);
      if (ep_) {
        const auto s = ep_->submit(job.choices[i].request, std::move(on_output), job.params.dp_rank.value_or(-1));
        job.choices[i].rank = s.rank;
        job.choices[i].rid = s.id;
      } else {
        job.choices[i].rid = engine_->submit(job.choices[i].request, std::move(on_output));
      }
    }
  } catch (const std::invalid_argument& e) {
    throw bad_request(e.what(), job.chat ? "messages" : "prompt");
  }
  w.on_disconnect([&hook] { hook.abort_unfinished(); });  // a client that goes away frees its blocks at once
  if (job.params.stream) {
    co_await stream_job(job, w);
    co_return;
  }
  std::vector<OutputInbox::Item> items;  // the engine always ends every request with a final output
  for (std::size_t remaining = job.choices.size(); remaining > 0;) {
    co_await job.inbox->take(items);
    for (const auto& [i, out] : items) {
      take_output(job, i, out);
      if (out.finished) --remaining;
    }
  }
  json::array choices;
  for (std::size_t i = 0; i < job.choices.size(); ++i) {
    const Job::Choice& ch = job.choices[i];
    const ChoiceStream& s = *ch.stream;
    if (!s.error().empty()) throw ApiError(500, s.error(), "server_error");
    json::object c{{"index", i}, {"finish_reason", finish_value(s)}, {"logprobs", nullptr}};
    if (job.params.logprobs)
      c["logprobs"] = job.chat ? chat_logprobs(tokenizer_, s.tokens(), s.logprobs())
                               : completion_logprobs(tokenizer_, s.tokens(), s.logprobs(), ch.echo.size());
    if (job.chat && job.parse) {
      const std::string_view text = std::string_view(s.text()).substr(0, s.text().size() - special_tail(job, s, tokenizer_));
      const tools::ChatOutputParts parts = tools::parse_chat_output(text, job.output);
      json::object message{{"role", "assistant"}, {"content", parts.content ? json::value(*parts.content) : nullptr}};
      if (parts.reasoning) message["reasoning_content"] = *parts.reasoning;
      if (!parts.calls.empty()) {
        message["tool_calls"] = tool_calls_json(parts.calls);
        if (s.finish_reason() != "abort") c["finish_reason"] = "tool_calls";
      }
      c["message"] = std::move(message);
    } else if (job.chat) {
      c["message"] = json::object{{"role", "assistant"}, {"content", s.text()}};
    } else {
      c["text"] = ch.echo + s.text();
    }
    choices.push_back(std::move(c));
  }
  http::Response response = http::json_response(
      200, json::object{{"id", job.id}, {"object", job.chat ? "chat.completion" : "text_completion"},
                        {"created", job.created}, {"model", name_}, {"choices", choices}, {"usage", usage_of(job)}});
  if (ep_) response.headers.set("x-kvfleet-dp-rank", std::to_string(job.choices.front().rank));
  co_await w.send(std::move(response));
}

awaitable<void> Replica::stream_job(Job& job, http::ResponseWriter& w) {
  // (GCC 12 rejects string literals inside co_await expressions: build arguments first.)
  http::Headers sse_headers{{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}};
  if (ep_) sse_headers.set("x-kvfleet-dp-rank", std::to_string(job.choices.front().rank));  // the rank that runs it
  if (!co_await w.begin_stream(200, std::move(sse_headers))) co_return;  // gone: run_job's hook aborts
  const char* object = job.chat ? "chat.completion.chunk" : "text_completion";
  auto chunk = [&](std::size_t i, const std::string& piece, std::size_t lp_from) {
    Job::Choice& ch = job.choices[i];
    const ChoiceStream& s = *ch.stream;
    json::object c{{"index", i}, {"finish_reason", finish_value(s)}, {"logprobs", nullptr}};
    const auto from = static_cast<std::ptrdiff_t>(std::min(lp_from, s.tokens().size()));
    const std::vector<TokenId> toks(s.tokens().begin() + from, s.tokens().end());
    const std::vector<RequestOutput::Logprobs> lps(
        s.logprobs().begin() + static_cast<std::ptrdiff_t>(std::min(lp_from, s.logprobs().size())), s.logprobs().end());
    if (job.params.logprobs)
      c["logprobs"] = job.chat ? chat_logprobs(tokenizer_, toks, lps)
                               : completion_logprobs(tokenizer_, toks, lps, s.text().size() - piece.size());
    if (job.chat) {
      json::object delta;
      if (!ch.role_sent) delta["role"] = "assistant";
      if (!piece.empty() || !ch.role_sent) delta["content"] = piece;
      ch.role_sent = true;
      c["delta"] = std::move(delta);
    } else {
      c["text"] = ch.echo + piece;
      ch.echo.clear();
    }
    json::object out{{"id", job.id}, {"object", object}, {"created", job.created}, {"model", name_},
                     {"choices", json::array{std::move(c)}}};
    if (job.params.stream_token_ids) out["kvfleet_token_ids"] = ch.stream->take_token_ids();  // last (Contract 4)
    return out;
  };
  // A parsed chat answer's pieces: the role first, then reasoning, content and tool-call deltas each in a
  // chunk of its own, and a last chunk with the finish reason. Logprobs ride on the next chunk that goes.
  auto parsed_chunks = [&](std::size_t i, std::string piece, bool finished) {
    Job::Choice& ch = job.choices[i];
    const ChoiceStream& s = *ch.stream;
    if (!ch.parser) ch.parser = std::make_unique<tools::ChatOutputStream>(job.output);
    if (finished) piece.resize(piece.size() - std::min(piece.size(), special_tail(job, s, tokenizer_)));
    tools::ChatDelta d = ch.parser->push(piece);
    if (finished) {
      tools::ChatDelta rest = ch.parser->finish();
      d.reasoning += rest.reasoning;
      d.content += rest.content;
      d.calls.insert(d.calls.end(), rest.calls.begin(), rest.calls.end());
    }
    std::string out;
    auto emit = [&](json::object delta, json::value finish) {
      json::object c{{"index", i}, {"finish_reason", std::move(finish)}, {"logprobs", nullptr}};
      if (job.params.logprobs && ch.logprobs_sent < s.logprobs().size()) {
        const auto from = static_cast<std::ptrdiff_t>(ch.logprobs_sent);
        const std::vector<TokenId> toks(s.tokens().begin() + from, s.tokens().end());
        const std::vector<RequestOutput::Logprobs> lps(s.logprobs().begin() + from, s.logprobs().end());
        c["logprobs"] = chat_logprobs(tokenizer_, toks, lps);
        ch.logprobs_sent = s.logprobs().size();
      }
      c["delta"] = std::move(delta);
      out += sse(json::object{{"id", job.id}, {"object", object}, {"created", job.created}, {"model", name_},
                              {"choices", json::array{std::move(c)}}});
    };
    if (!ch.role_sent) {
      ch.role_sent = true;
      emit(json::object{{"role", "assistant"}, {"content", ""}}, nullptr);
    }
    if (!d.reasoning.empty()) emit(json::object{{"reasoning_content", d.reasoning}}, nullptr);
    if (!d.content.empty()) emit(json::object{{"content", d.content}}, nullptr);
    for (const auto& call : d.calls) emit(json::object{{"tool_calls", json::array{tool_call_delta(call)}}}, nullptr);
    if (finished)
      emit(json::object{}, json::value(ch.parser->called() && s.finish_reason() != "abort" ? "tool_calls"
                                                                                          : s.finish_reason()));
    return out;
  };
  // Every way this loop ends leaves `tail` to send: an error event when something failed, the usage
  // chunk when asked for, and always [DONE].
  std::string tail;
  try {
    std::vector<OutputInbox::Item> items;  // the engine always ends every request with a final output
    std::string lines;                     // one step's events for all the job's choices: one write
    for (std::size_t remaining = job.choices.size(); remaining > 0;) {
      co_await job.inbox->take(items);
      lines.clear();
      for (const auto& [i, out] : items) {
        Job::Choice& ch = job.choices.at(i);
        const std::size_t lp_from = ch.stream->logprobs().size();
        const std::string piece = take_output(job, i, out);
        if (out.finished) --remaining;
        if (out.finished && !ch.stream->error().empty()) lines += error_event(ch.stream->error());
        else if (job.parse) lines += parsed_chunks(i, piece, out.finished);
        else if (!piece.empty() || out.finished || (job.chat && !ch.role_sent)) lines += sse(chunk(i, piece, lp_from));
      }
      if (lines.empty()) continue;
      const bool sent = co_await w.write(lines);
      if (!sent) co_return;  // the client is gone
    }
    if (tail.empty() && job.params.include_usage)
      tail = sse(json::object{{"id", job.id}, {"object", object}, {"created", job.created}, {"model", name_},
                              {"choices", json::array{}}, {"usage", usage_of(job)}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvfleet-replica: a stream failed: %s\n", e.what());
    tail = error_event(std::string("internal error: ") + e.what());
  }
  tail += "data: [DONE]\n\n";
  if (co_await w.write(tail)) co_await w.finish();
}

}  // namespace kvfleet::server
