// The channel's JSON bodies (ep/wire.h). Short member names: outputs travel once per token.
#include "engine/ep/wire.h"

#include <bit>
#include <stdexcept>

namespace kvfleet::ep {
namespace json = boost::json;

namespace {

const json::value& at(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  if (!v) throw std::invalid_argument("expert-parallel channel: '" + std::string(key) + "' missing");
  return *v;
}
template <class T>
T num(const json::object& o, std::string_view key) {
  return at(o, key).to_number<T>();
}
// Floats travel as their bits: Boost 1.81's parser may round a decimal double by an ulp.
std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(const json::value& v) { return std::bit_cast<float>(v.to_number<std::uint32_t>()); }
float real(const json::object& o, std::string_view key) { return from_bits(at(o, key)); }
std::string str(const json::object& o, std::string_view key) { return std::string(at(o, key).as_string()); }

json::array ids(const std::vector<TokenId>& v) {
  json::array a;
  a.reserve(v.size());
  for (TokenId t : v) a.emplace_back(t);
  return a;
}
std::vector<TokenId> ids_of(const json::value& v) {
  std::vector<TokenId> out;
  for (const auto& x : v.as_array()) out.push_back(x.to_number<TokenId>());
  return out;
}

}  // namespace

json::object to_json(const GenerationRequest& r) {
  json::array stop, bias;
  for (const auto& s : r.stop) stop.emplace_back(s);
  for (const auto& [id, b] : r.logit_bias) bias.push_back(json::array{id, bits(b)});
  return {{"prompt", ids(r.prompt)},
          {"temperature", bits(r.sampling.temperature)},
          {"top_k", r.sampling.top_k},
          {"top_p", bits(r.sampling.top_p)},
          {"min_p", bits(r.sampling.min_p)},
          {"seed", r.sampling.seed},
          {"max_tokens", r.max_tokens},
          {"ignore_eos", r.ignore_eos},
          {"stop_token_ids", ids(r.stop_token_ids)},
          {"stop", std::move(stop)},
          {"detokenize", r.detokenize},
          {"skip_special", r.skip_special_tokens},
          {"priority", r.priority},
          {"presence", bits(r.penalties.presence)},
          {"frequency", bits(r.penalties.frequency)},
          {"repetition", bits(r.penalties.repetition)},
          {"logprobs", r.logprobs},
          {"logit_bias", std::move(bias)},
          {"cache_salt", r.cache_salt},
          {"prefill_only", r.prefill_only},
          {"resumed", ids(r.resumed_outputs)}};
}

GenerationRequest request_from_json(const json::object& o) {
  GenerationRequest r;
  r.prompt = ids_of(at(o, "prompt"));
  r.sampling.temperature = real(o, "temperature");
  r.sampling.top_k = num<std::int32_t>(o, "top_k");
  r.sampling.top_p = real(o, "top_p");
  r.sampling.min_p = real(o, "min_p");
  r.sampling.seed = num<std::uint64_t>(o, "seed");
  r.max_tokens = num<std::int32_t>(o, "max_tokens");
  r.ignore_eos = at(o, "ignore_eos").as_bool();
  r.stop_token_ids = ids_of(at(o, "stop_token_ids"));
  for (const auto& s : at(o, "stop").as_array()) r.stop.emplace_back(s.as_string());
  r.detokenize = at(o, "detokenize").as_bool();
  r.skip_special_tokens = at(o, "skip_special").as_bool();
  r.priority = num<std::int32_t>(o, "priority");
  r.penalties = {real(o, "presence"), real(o, "frequency"), real(o, "repetition")};
  r.logprobs = num<std::int32_t>(o, "logprobs");
  for (const auto& b : at(o, "logit_bias").as_array())
    r.logit_bias.emplace_back(b.as_array().at(0).to_number<TokenId>(),
                              from_bits(b.as_array().at(1)));
  r.cache_salt = str(o, "cache_salt");
  r.prefill_only = at(o, "prefill_only").as_bool();
  r.resumed_outputs = ids_of(at(o, "resumed"));
  return r;
}

json::object to_json(const RequestOutput& o) {
  json::object j{{"tok", ids(o.new_tokens)}, {"text", o.text}};
  if (o.finished) {
    j["fin"] = static_cast<int>(o.finish_reason);
    j["stop_string"] = o.stop_string;
    j["error"] = o.error;
    j["pin"] = o.pin;
  }
  j["np"] = o.num_prompt_tokens;
  j["nc"] = o.num_cached_tokens;
  j["qt"] = o.queue_time_s;
  if (!o.resumed_text.empty()) j["resumed_text"] = o.resumed_text;
  if (!o.logprobs.empty()) {
    json::array lps;
    for (const auto& lp : o.logprobs) {
      json::array top;
      for (const auto& t : lp.top) top.push_back(json::array{t.id, bits(t.logprob)});
      lps.push_back(json::object{{"lp", bits(lp.logprob)}, {"top", std::move(top)}});
    }
    j["lps"] = std::move(lps);
  }
  return j;
}

RequestOutput output_from_json(const json::object& j) {
  RequestOutput o;
  o.new_tokens = ids_of(at(j, "tok"));
  o.text = str(j, "text");
  if (const auto* fin = j.if_contains("fin")) {
    o.finished = true;
    const int reason = fin->to_number<int>();
    if (reason < 0 || reason > static_cast<int>(FinishReason::aborted))
      throw std::invalid_argument("expert-parallel channel: bad finish reason");
    o.finish_reason = static_cast<FinishReason>(reason);
    o.stop_string = str(j, "stop_string");
    o.error = str(j, "error");
    o.pin = num<std::uint64_t>(j, "pin");
  }
  o.num_prompt_tokens = num<std::int32_t>(j, "np");
  o.num_cached_tokens = num<std::int32_t>(j, "nc");
  o.queue_time_s = num<double>(j, "qt");
  if (j.contains("resumed_text")) o.resumed_text = str(j, "resumed_text");
  if (const auto* lps = j.if_contains("lps")) {
    for (const auto& v : lps->as_array()) {
      const auto& lp = v.as_object();
      RequestOutput::Logprobs l;
      l.logprob = real(lp, "lp");
      for (const auto& t : at(lp, "top").as_array())
        l.top.push_back({t.as_array().at(0).to_number<TokenId>(), from_bits(t.as_array().at(1))});
      o.logprobs.push_back(std::move(l));
    }
  }
  return o;
}

json::object to_json(const EngineStats& s) {
  const auto& k = s.scheduler.kv;
  json::array finished, experts;
  for (auto f : s.finished) finished.emplace_back(f);
  for (auto e : s.moe.expert_tokens) experts.emplace_back(e);
  return {{"running", s.scheduler.num_running}, {"waiting", s.scheduler.num_waiting},
          {"preemptions", s.scheduler.num_preemptions}, {"sched_steps", s.scheduler.num_steps},
          {"blocks", k.num_blocks}, {"free", k.num_free_blocks}, {"cached", k.num_cached_blocks},
          {"usage", k.usage}, {"query_tokens", k.prefix_query_tokens}, {"hit_tokens", k.prefix_hit_tokens},
          {"evicted", k.evicted_blocks}, {"prompt_tokens", s.prompt_tokens},
          {"generated", s.generated_tokens}, {"steps", s.steps}, {"step_s", s.step_seconds},
          {"forward_s", s.forward_seconds}, {"finished", std::move(finished)}, {"experts", std::move(experts)},
          {"moe_steps", s.moe.steps}, {"imbalance", s.moe.last_imbalance}, {"imbalance_sum", s.moe.imbalance_sum}};
}

EngineStats stats_from_json(const json::object& o) {
  EngineStats s;
  auto& k = s.scheduler.kv;
  s.scheduler.num_running = num<std::int32_t>(o, "running");
  s.scheduler.num_waiting = num<std::int32_t>(o, "waiting");
  s.scheduler.num_preemptions = num<std::uint64_t>(o, "preemptions");
  s.scheduler.num_steps = num<std::uint64_t>(o, "sched_steps");
  k.num_blocks = num<std::int32_t>(o, "blocks");
  k.num_free_blocks = num<std::int32_t>(o, "free");
  k.num_cached_blocks = num<std::int32_t>(o, "cached");
  k.usage = num<double>(o, "usage");
  k.prefix_query_tokens = num<std::uint64_t>(o, "query_tokens");
  k.prefix_hit_tokens = num<std::uint64_t>(o, "hit_tokens");
  k.evicted_blocks = num<std::uint64_t>(o, "evicted");
  s.prompt_tokens = num<std::uint64_t>(o, "prompt_tokens");
  s.generated_tokens = num<std::uint64_t>(o, "generated");
  s.steps = num<std::uint64_t>(o, "steps");
  s.step_seconds = num<double>(o, "step_s");
  s.forward_seconds = num<double>(o, "forward_s");
  const auto& finished = at(o, "finished").as_array();
  for (std::size_t i = 0; i < s.finished.size() && i < finished.size(); ++i) s.finished[i] = finished[i].to_number<std::uint64_t>();
  for (const auto& e : at(o, "experts").as_array()) s.moe.expert_tokens.push_back(e.to_number<std::uint64_t>());
  s.moe.steps = num<std::uint64_t>(o, "moe_steps");
  s.moe.last_imbalance = num<double>(o, "imbalance");
  s.moe.imbalance_sum = num<double>(o, "imbalance_sum");
  return s;
}

json::object kv_state_json(Scheduler& s) {
  const std::string problem = s.check_integrity();
  const KvCacheStats kv = s.kv().stats();
  return json::object{{"integrity", problem.empty() ? "ok" : problem}, {"num_blocks", kv.num_blocks},
                      {"free_blocks", kv.num_free_blocks}, {"cached_blocks", kv.num_cached_blocks},
                      {"pins", s.kv().num_pins()}, {"running", s.running().size()}, {"waiting", s.waiting().size()}};
}

}  // namespace kvfleet::ep
