// Prompt -> block hashes -> policy decision, and the router's own load bookkeeping.
#include <algorithm>
#include <boost/json.hpp>

#include "kvfleet/block_hash.h"
#include "kvfleet/chat_content.h"
#include "kvfleet/chat_tokens.h"
#include "kvfleet/chat_tools.h"
#include "kvfleet/request_defaults.h"
#include "router/gateway/gateway.h"

namespace kvfleet::router {
namespace json = boost::json;

namespace {

// Content given as parts ([{"type":"text","text":...}]) joined into one string by the replica's rule,
// so that both render the same template text. A part the replica refuses throws ContentPartError: the
// request then routes without hashes and the replica answers the 400.
json::array normalize_messages(const json::array& messages) {
  json::array out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) throw std::invalid_argument("a message is not an object");
    json::object msg = messages[i].as_object();
    if (json::value* c = msg.if_contains("content"); c && c->is_array())
      *c = join_content_parts(c->as_array(), "messages[" + std::to_string(i) + "].content");
    out.push_back(std::move(msg));
  }
  return out;
}

// A forced tool_choice (required, a named function) lists the tools as JSON where neither the template nor
// a --tool-call-parser has a format for them, as the replica does (all forced parsers list them alike).
const tools::ToolParser* forced_tools_parser(const json::object& body) {
  static const std::unique_ptr<tools::ToolParser> list = tools::make_call_list_parser();  // immutable
  const json::value* choice = body.if_contains("tool_choice");
  if (!choice) choice = body.if_contains("function_call");  // the legacy field: {"name": ...} forces a call
  const bool forced = choice && (choice->is_object() || (choice->is_string() && choice->as_string() == "required"));
  return forced ? list.get() : nullptr;
}

}  // namespace

// A prompt the router cannot tokenize (no template, odd shapes) still routes, with no hashes: the
// replica answers the error itself.
RoutePlan Gateway::plan(std::string_view path, const json::object& body, const http::Request& request) const {
  std::vector<TokenId> tokens;
  try {
    if (path == "/v1/chat/completions") {
      const auto* messages = body.if_contains("messages");
      if (chat_template_ && messages && messages->is_array()) {
        ChatTemplateOptions opts;
        if (const auto* g = body.if_contains("add_generation_prompt"); g && g->is_bool()) opts.add_generation_prompt = g->as_bool();
        // The replica's rendering: content parts joined, tools where the template (or the parser) puts them.
        json::array normalized = normalize_messages(messages->as_array());
        tools::prepare_chat_tools(normalized, opts, tools::request_tools(body), template_renders_tools_,
                                  tool_parser_ ? tool_parser_.get() : forced_tools_parser(body));
        tokens = tokenize_chat(*chat_template_, tokenizer_, normalized, opts, config_.special_tokens_in_content);
      }
    } else if (path == "/v1/responses") {
      tokens = responses_prompt(body);
    } else if (const auto* prompt = body.if_contains("prompt")) {
      // A list of prompts routes by its first one.
      const json::value* p = prompt;
      if (p->is_array() && !p->as_array().empty() && !p->as_array()[0].is_number()) p = &p->as_array()[0];
      if (p->is_string()) {
        tokens = tokenizer_.encode(std::string(p->as_string()), true);
      } else if (p->is_array()) {
        for (const auto& t : p->as_array())
          if (t.is_int64()) tokens.push_back(static_cast<TokenId>(t.as_int64()));
      }
    }
  } catch (const std::exception&) {
    tokens.clear();
  }
  RoutePlan plan;
  // A tenant's cache_salt is part of its namespace (Contract 1): the replica hashes its blocks the same way.
  std::string_view salt;
  if (const auto* s = body.if_contains("cache_salt"); s && s->is_string()) salt = s->as_string();
  plan.hashes = block_hashes(block_hash_root(name_, salt), tokens, config_.block_size);
  plan.prompt_tokens = tokens.size();
  std::uint64_t max_tokens = kDefaultMaxTokens;  // the replica's default (unless its flag changed it)
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (const auto* m = body.if_contains(key); m && m->is_int64() && m->as_int64() > 0) max_tokens = m->as_int64();
  plan.expected_tokens = plan.prompt_tokens + max_tokens;
  const std::shared_ptr<Policy> policy = this->policy();
  std::string_view header = policy->session_header();
  if (header.empty()) header = config_.session_header;
  if (!header.empty())
    if (const std::string* v = request.headers.find(header)) plan.session_key = *v;
  if (plan.session_key.empty() && config_.session_from_user)
    if (const auto* u = body.if_contains("user"); u && u->is_string()) plan.session_key = u->as_string();
  return plan;
}

void Gateway::targets_locked(const TierMatch& match, const std::vector<ReplicaId>& exclude, Tick now,
                             std::vector<ReplicaState>& states, std::vector<Target>& targets) {
  const Tick stale_after = static_cast<Tick>(config_.kv_events_timeout.count());
  for (std::size_t i = 0; i < links_.size(); ++i) {
    ReplicaLink& l = *links_[i];  // (the breaker's available() may move it to half-open)
    ReplicaState s;
    s.id = l.url;
    s.healthy = l.healthy && std::find(exclude.begin(), exclude.end(), l.slot) == exclude.end() &&
                l.breaker.available(now) && l.pd_pool != ReplicaPool::prefill;  // pd: D from the decode pool
    s.draining = l.draining;
    // The router's own in-flight counts, the cache match and the reported load (when fresh) of a
    // replica or of one of its ranks: ReplicaLink and RankTarget keep the same fields.
    const auto fill = [&](ReplicaState& r, const auto& src, std::size_t slot) {
      r.in_flight_requests = src.in_flight;
      r.in_flight_tokens = src.in_flight_tokens;
      const auto r_slot = static_cast<ReplicaId>(slot);
      r.matched_blocks = match.of(r_slot, Medium::device);
      r.host_blocks = match.of(r_slot, Medium::host);
      r.disk_blocks = match.of(r_slot, Medium::disk);
      r.shared_blocks = match.of(r_slot, Medium::shared);
      if (src.load_reported && now - src.load_at <= stale_after) {
        r.load_reported = true;
        r.reported_waiting = src.reported_waiting;
        r.reported_running = src.reported_running;
        r.kv_usage = src.reported_kv_usage;
      }
    };
    if (l.ranks.empty()) {
      fill(s, l, l.slot);
      states.push_back(std::move(s));
      targets.push_back({i, -1});
      continue;
    }
    // Each rank: the replica's health, the rank's own cache and load. "URL@RANK" (SGLang's dp-aware
    // worker names) is the name rendezvous and consistent hashing key on, the same in every router.
    for (std::size_t k = 0; k < l.ranks.size(); ++k) {
      const RankTarget& t = l.ranks[k];
      ReplicaState r = s;
      r.id = l.url + "@" + std::to_string(k);
      fill(r, t, t.slot);
      states.push_back(std::move(r));
      targets.push_back({i, static_cast<int>(k)});
    }
  }
}

std::shared_ptr<ReplicaLink> Gateway::route(RoutePlan& plan, const std::vector<ReplicaId>& exclude,
                                            CircuitBreaker::Ticket& ticket) {
  std::shared_ptr<ReplicaLink> chosen;
  Decision decision;
  std::uint32_t matched = 0;
  const char* pd_reason = nullptr;
  const Tick now = now_tick();
  std::shared_ptr<Policy> policy;  // kept alive past the lock for its name
  plan.dp_rank = -1;
  {
    std::lock_guard lock(mutex_);
    policy = policy_;
    const MatchResult match = index_.match(plan.hashes);
    std::vector<ReplicaState> states;
    std::vector<Target> targets;
    states.reserve(links_.size());
    targets_locked(index_.match_tiers(plan.hashes, match), exclude, now, states, targets);
    RoutingRequest request;
    request.prompt_blocks = static_cast<std::uint32_t>(plan.hashes.size());
    request.prompt_tokens = plan.prompt_tokens;
    request.session_key = plan.session_key;
    request.block_hashes = plan.hashes;
    decision = policy->choose(request, states);
    if (decision.ok()) {
      const Target target = targets[decision.replica];
      chosen = links_[target.link];
      ReplicaId slot = chosen->slot;
      if (target.rank >= 0) {
        RankTarget& t = chosen->ranks[static_cast<std::size_t>(target.rank)];
        slot = t.slot;
        t.in_flight += 1;
        t.in_flight_tokens += plan.expected_tokens;
        t.routed += 1;
        plan.dp_rank = target.rank;
        // Under the lock, so that a removal (which forgets the series under it) is final.
        metrics_.counter("kvfleet_router_dp_rank_decisions_total", "Requests routed to each data-parallel rank",
                         {{"replica", chosen->url}, {"dp_rank", std::to_string(target.rank)}})
            .Increment();
      }
      matched = match.of(slot);
      chosen->routed_blocks += plan.hashes.size();
      chosen->matched_blocks += std::min<std::uint64_t>(matched, plan.hashes.size());
      chosen->in_flight += 1;
      chosen->in_flight_tokens += plan.expected_tokens;
      chosen->routed += 1;
      ticket = chosen->breaker.on_dispatch();
      index_.on_routed(slot, plan.hashes, now);
      pd_reason = choose_prefill_locked(plan, *chosen, matched, now);
    }
  }
  plan.reason = decision.reason;
  plan.matched_blocks = matched;
  if (pd_reason)
    metrics_.counter("kvfleet_router_pd_decisions_total", "pd mode: where prompts were prefilled, by reason",
                     {{"reason", pd_reason}}).Increment();
  metrics_.counter("kvfleet_router_decisions_total", "Routing decisions by policy and reason",
                   {{"policy", std::string(policy->name())}, {"reason", std::string(decision.reason)}})
      .Increment();
  if (chosen && !plan.hashes.empty()) {
    static const std::vector<double> buckets{0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1};
    metrics_.histogram("kvfleet_router_prefix_match_ratio", "Share of prompt blocks the chosen replica holds", buckets)
        .Observe(double(matched) / double(plan.hashes.size()));
  }
  return chosen;
}

void Gateway::release(ReplicaLink& link, const RoutePlan& plan, CircuitBreaker::Ticket ticket, Verdict verdict) {
  const Tick now = now_tick();
  std::lock_guard lock(mutex_);
  link.in_flight -= 1;
  link.in_flight_tokens -= plan.expected_tokens;
  // The rank's share (its ranks may have been set anew since: a replica restarted with another shape).
  if (plan.dp_rank >= 0 && static_cast<std::size_t>(plan.dp_rank) < link.ranks.size()) {
    RankTarget& t = link.ranks[static_cast<std::size_t>(plan.dp_rank)];
    if (t.in_flight > 0) t.in_flight -= 1;
    t.in_flight_tokens -= std::min(t.in_flight_tokens, plan.expected_tokens);
  }
  for (const auto& l : links_)  // pd mode: the prefill replica's share of the request ends too
    if (!plan.prefill_from.empty() && l->url == plan.prefill_from && l->in_flight > 0) l->in_flight -= 1;
  switch (verdict) {
    case Verdict::success: link.breaker.on_success(ticket); break;
    case Verdict::failure: link.breaker.on_failure(ticket, now); break;
    case Verdict::unknown: link.breaker.on_abandon(ticket); break;
  }
}

// A replica that refuses connections is out at once (the active checks bring it back). Other
// failures go to its circuit breaker (release()).
void Gateway::note_connect_refused(ReplicaLink& link) {
  std::lock_guard lock(mutex_);
  link.ok_streak = 0;
  link.fail_streak += 1;
  if (link.healthy) note_event(link.url, "down: connection refused");
  link.healthy = false;
}

void Gateway::record_health(ReplicaLink& link, bool ok) {
  std::lock_guard lock(mutex_);
  if (ok) {
    link.fail_streak = 0;
    if (++link.ok_streak >= config_.healthy_after && !link.healthy) {
      link.healthy = true;
      note_event(link.url, "up: health checks pass");
    }
  } else {
    link.ok_streak = 0;
    if (++link.fail_streak >= config_.unhealthy_after && link.healthy) {
      link.healthy = false;
      note_event(link.url, "down: health checks fail");
    }
  }
}

}  // namespace kvfleet::router
