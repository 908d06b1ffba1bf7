// POST /v1/completions and /v1/chat/completions: requests become engine requests (n choices per prompt),
// whose tokens stream back through an AsyncQueue and leave as one JSON response or as SSE chunks.
#include <boost/json.hpp>
#include <chrono>
#include <random>

#include "engine/pd/decode_fetcher.h"
#include "engine/server/api_request.h"
#include "engine/server/choice_stream.h"
#include "engine/server/replica.h"
#include "kvfleet/http/async_queue.h"

namespace kvfleet::server {
namespace json = boost::json;
using boost::asio::awaitable;
using Clock = std::chrono::steady_clock;

struct Replica::Job {
  bool chat = false;
  std::string id;
  std::int64_t created = 0;
  GenerateParams params;
  struct Choice {
    GenerationRequest request;
    std::unique_ptr<ChoiceStream> stream;
    RequestId rid = 0;
    std::string echo;        // completions with echo: the prompt's text, sent before the output
    std::size_t prompt = 0;  // which prompt it belongs to
    std::size_t logprobs_sent = 0;
    bool role_sent = false;
    Clock::time_point last_token;
  };
  std::vector<Choice> choices;
  Clock::time_point arrival = Clock::now();
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
  r.stop_token_ids = p.stop_token_ids;
  r.penalties = {p.presence_penalty, p.frequency_penalty, p.repetition_penalty};
  r.logprobs = p.logprobs ? *p.logprobs : -1;
  return r;
}

awaitable<void> Replica::completions(const http::Request& req, http::ResponseWriter& w) {
  const CompletionRequest r = parse_completion_request(parse_json_body(req.body));
  check_model(r.model);
  check_admission();
  Job job;
  job.id = random_id("cmpl-");
  job.created = created_;
  job.params = r.params;
  for (std::size_t p = 0; p < r.prompts.size(); ++p) {
    const auto& prompt = r.prompts[p];
    const std::vector<TokenId> ids = prompt.text ? tokenizer_.encode(*prompt.text, true) : prompt.ids;
    if (ids.empty()) throw bad_request("the prompt is empty after tokenization", "prompt");
    for (int c = 0; c < r.params.n; ++c) {
      Job::Choice ch;
      ch.request = make_request(ids, r.params, c, false);
      ch.prompt = p;
      if (r.echo) ch.echo = prompt.text ? *prompt.text : tokenizer_.decode(ids);
      job.choices.push_back(std::move(ch));
    }
  }
  std::vector<std::vector<TokenId>> prompts;  // x-kvfleet-prefill-from: fetch their KV first (Contract 3)
  for (const auto& ch : job.choices)
    if (prompts.empty() || prompts.back() != ch.request.prompt) prompts.push_back(ch.request.prompt);
  const auto fetched = co_await pd_prefetch(req, prompts, w);  // holds the fetched blocks until the job ends
  if (w.client_gone()) co_return;
  co_await run_job(job, w);
}

awaitable<void> Replica::chat(const http::Request& req, http::ResponseWriter& w) {
  const ChatRequest r = parse_chat_request(parse_json_body(req.body));
  check_model(r.model);
  if (!chat_template_) throw bad_request("this model has no chat template (tokenizer_config.json)", "messages");
  check_admission();
  ChatTemplateOptions opts;
  opts.add_generation_prompt = r.add_generation_prompt;
  opts.tools = r.tools;
  // The template writes the special tokens (BOS included) itself.
  const std::vector<TokenId> ids = tokenizer_.encode(chat_template_->render(r.messages, opts), false);
  Job job;
  job.chat = true;
  job.id = random_id("chatcmpl-");
  job.created = created_;
  job.params = r.params;
  for (int c = 0; c < r.params.n; ++c) {
    Job::Choice ch;
    ch.request = make_request(ids, r.params, c, true);
    job.choices.push_back(std::move(ch));
  }
  const std::vector<std::vector<TokenId>> prompts{ids};
  const auto fetched = co_await pd_prefetch(req, prompts, w);  // x-kvfleet-prefill-from (Contract 3)
  if (w.client_gone()) co_return;
  co_await run_job(job, w);
}

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

json::value finish_value(const ChoiceStream& s) {
  return s.finished() ? json::value(s.finish_reason()) : json::value(nullptr);
}

}  // namespace

awaitable<void> Replica::run_job(Job& job, http::ResponseWriter& w) {
  using Item = std::pair<std::size_t, RequestOutput>;
  auto queue = std::make_shared<http::AsyncQueue<Item>>(co_await boost::asio::this_coro::executor);
  for (auto& ch : job.choices)
    ch.stream = std::make_unique<ChoiceStream>(tokenizer_, ch.request.stop, job.params.skip_special_tokens);
  auto abort_all = [this, &job] {
    for (auto& ch : job.choices)
      if (ch.rid) engine_->abort(ch.rid);
  };
  try {
    for (std::size_t i = 0; i < job.choices.size(); ++i)
      job.choices[i].rid = engine_->submit(job.choices[i].request, [queue, i](const RequestOutput& o) { queue->push({i, o}); });
  } catch (const std::invalid_argument& e) {
    abort_all();
    throw bad_request(e.what());
  }
  w.on_disconnect(abort_all);  // a client that goes away frees its blocks at once
  const bool stream = job.params.stream;
  // (GCC 12 rejects string literals inside co_await expressions: build arguments first.)
  http::Headers sse_headers{{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}};
  if (stream && !co_await w.begin_stream(200, std::move(sse_headers))) {
    abort_all();
    co_return;
  }
  const std::string model = name_;
  auto chunk = [&](std::size_t i, const std::string& piece, std::size_t lp_from) {
    Job::Choice& ch = job.choices[i];
    const ChoiceStream& s = *ch.stream;
    json::object c{{"index", i}, {"finish_reason", finish_value(s)}, {"logprobs", nullptr}};
    const std::vector<TokenId> toks(s.tokens().begin() + static_cast<std::ptrdiff_t>(std::min(lp_from, s.tokens().size())), s.tokens().end());
    const std::vector<RequestOutput::Logprobs> lps(s.logprobs().begin() + static_cast<std::ptrdiff_t>(lp_from), s.logprobs().end());
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
    return json::object{{"id", job.id}, {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", job.created}, {"model", model}, {"choices", json::array{std::move(c)}}};
  };
  std::size_t remaining = job.choices.size();
  while (remaining > 0) {
    auto item = co_await queue->pop();
    if (!item) break;
    const std::size_t i = item->first;
    const RequestOutput& out = item->second;
    Job::Choice& ch = job.choices[i];
    const auto now = Clock::now();
    if (!out.new_tokens.empty()) {
      if (ch.last_token == Clock::time_point{}) metrics_.observe_ttft(seconds(now - job.arrival));
      else metrics_.observe_itl(seconds(now - ch.last_token));
      ch.last_token = now;
    }
    const std::size_t lp_from = ch.stream->logprobs().size();
    const std::string piece = ch.stream->push(out);
    if (out.finished) {
      --remaining;
      metrics_.observe_e2e(seconds(now - job.arrival));
      metrics_.observe_queue(out.queue_time_s);
    }
    if (!stream) continue;
    if (out.finished && !ch.stream->error().empty()) {
      const json::object err{{"error", json::object{{"message", ch.stream->error()}, {"type", "server_error"},
                                                    {"param", nullptr}, {"code", nullptr}}}};
      const std::string line = "data: " + json::serialize(err) + "\n\n";
      if (!co_await w.write(line)) break;
      continue;
    }
    const bool nothing_new = piece.empty() && !out.finished && !(job.chat && !ch.role_sent);
    if (nothing_new) continue;
    const std::string line = sse(chunk(i, piece, lp_from));
    if (!co_await w.write(line)) {
      abort_all();  // the client is gone
      co_return;
    }
  }
  // Usage: each prompt counted once, every choice's tokens.
  std::int64_t prompt_tokens = 0, completion_tokens = 0, cached = 0;
  std::vector<bool> counted(job.choices.size() + 1, false);
  for (const auto& ch : job.choices) {
    completion_tokens += static_cast<std::int64_t>(ch.stream->tokens().size());
    if (counted[ch.prompt]) continue;
    counted[ch.prompt] = true;
    prompt_tokens += static_cast<std::int64_t>(ch.request.prompt.size());
    cached += ch.stream->num_cached_tokens();
  }
  const json::object usage{{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                           {"total_tokens", prompt_tokens + completion_tokens},
                           {"prompt_tokens_details", json::object{{"cached_tokens", cached}}}};
  if (stream) {
    if (job.params.include_usage) {
      const std::string line =
          sse(json::object{{"id", job.id}, {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
                           {"created", job.created}, {"model", model}, {"choices", json::array{}}, {"usage", usage}});
      co_await w.write(line);
    }
    const std::string done = "data: [DONE]\n\n";
    co_await w.write(done);
    co_await w.finish();
    co_return;
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
    if (job.chat) c["message"] = json::object{{"role", "assistant"}, {"content", s.text()}};
    else c["text"] = ch.echo + s.text();
    choices.push_back(std::move(c));
  }
  http::Response response = http::Response::json(
      200, json::serialize(json::object{{"id", job.id}, {"object", job.chat ? "chat.completion" : "text_completion"},
                                        {"created", job.created}, {"model", model}, {"choices", choices},
                                        {"usage", usage}}));
  co_await w.send(std::move(response));
}

}  // namespace kvfleet::server
