#include "bench/kvfleet_bench/workload.h"

#include <algorithm>
#include <boost/json.hpp>
#include <fstream>
#include <map>
#include <stdexcept>

#include "bench/kvfleet_bench/workload_mixed.h"

namespace kvfleet::bench {
namespace {

constexpr std::size_t kMaxWords = 4000;

bool is_word(const std::string& s) {
  if (s.size() < 3 || s[0] != ' ') return false;
  return std::all_of(s.begin() + 1, s.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

std::int32_t draw_len(std::int32_t mean, double range_ratio, std::mt19937_64& rng) {
  const auto lo = static_cast<std::int32_t>(mean * (1.0 - range_ratio));
  const auto hi = static_cast<std::int32_t>(mean * (1.0 + range_ratio));
  return std::max<std::int32_t>(1, std::uniform_int_distribution<std::int32_t>(lo, hi)(rng));
}

Workload random_workload(const WorkloadOptions& o, const PromptBuilder& p, std::mt19937_64& rng) {
  Workload w{"random", {}};
  for (std::size_t i = 0; i < o.num_prompts; ++i) {
    Turn t;
    t.user_tokens = draw_len(o.random_input_len, o.random_range_ratio, rng);
    t.output_len = draw_len(o.random_output_len, o.random_range_ratio, rng);
    t.user_text = p.text(t.user_tokens, rng);
    Chain c;
    c.turns.push_back(std::move(t));
    w.chains.push_back(std::move(c));
  }
  return w;
}

// SGLang's generated-shared-prefix: groups x prompts per group, one system prompt per group, a fresh
// question per prompt, all shuffled so that groups interleave. With --num-prompts N the run has N
// requests, spread over the groups as evenly as possible (the first N % groups get one more), instead
// of prompts_per_group each.
Workload shared_prefix_workload(const WorkloadOptions& o, const PromptBuilder& p, std::mt19937_64& rng) {
  if (o.num_groups <= 0) throw std::invalid_argument("--shared-prefix-num-groups must be at least 1");
  Workload w{"shared-prefix", {}};
  const auto groups = static_cast<std::size_t>(o.num_groups);
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t prompts = o.num_prompts_set ? o.num_prompts / groups + (g < o.num_prompts % groups ? 1 : 0)
                                                  : static_cast<std::size_t>(std::max(0, o.prompts_per_group));
    if (prompts == 0) continue;
    const std::string system = p.text(o.system_prompt_len, rng);
    for (std::size_t i = 0; i < prompts; ++i) {
      Turn t{p.text(o.question_len, rng), o.question_len, o.output_len};
      w.chains.push_back(Chain{system, o.system_prompt_len, {t}, static_cast<int>(g), std::nullopt});
    }
  }
  std::shuffle(w.chains.begin(), w.chains.end(), rng);
  return w;
}

Workload multi_turn_workload(const WorkloadOptions& o, const PromptBuilder& p, std::mt19937_64& rng) {
  if (o.num_prompts_set)
    throw std::invalid_argument("--num-prompts does not apply to multi-turn: it sends --num-sessions x --turns requests (" +
                                std::to_string(o.num_sessions) + " x " + std::to_string(o.turns) + "); set those instead");
  Workload w{"multi-turn", {}};
  for (int s = 0; s < o.num_sessions; ++s) {
    Chain c;
    c.system_tokens = o.system_prompt_len > 0 ? o.system_prompt_len : 0;
    c.system_text = p.text(c.system_tokens, rng);
    for (int i = 0; i < o.turns; ++i) {
      Turn t;
      t.user_tokens = draw_len(o.random_input_len, o.random_range_ratio, rng);
      t.output_len = draw_len(o.random_output_len, o.random_range_ratio, rng);
      t.user_text = p.text(t.user_tokens, rng);
      c.turns.push_back(std::move(t));
    }
    w.chains.push_back(std::move(c));
  }
  return w;
}

std::int32_t field_int(const boost::json::object& o, const char* key, const std::string& where) {
  const auto* v = o.if_contains(key);
  if (!v || !(v->is_int64() || v->is_uint64())) throw std::invalid_argument(where + ": '" + key + "' must be an integer");
  return static_cast<std::int32_t>(v->to_number<std::int64_t>());
}

// A Mooncake trace (mooncake_trace.h): one chain per line, its prompt as token ids.
Workload mooncake_workload(const WorkloadOptions& o, const PromptBuilder& p, std::istream& in) {
  if (o.trace_block_tokens < 1 || o.trace_block_tokens > kMooncakeBlockTokens)
    throw std::invalid_argument("--trace-block-tokens must be in [1, " + std::to_string(kMooncakeBlockTokens) + "]");
  if (!(o.trace_time_scale >= 0)) throw std::invalid_argument("--trace-time-scale must be >= 0");
  if (o.trace_max_output < 0) throw std::invalid_argument("--trace-max-output must be >= 0 (0: no cap)");
  const std::vector<TraceRequest> trace = parse_mooncake_trace(in, o.trace_file, o.num_prompts_set ? o.num_prompts : 0);
  Workload w{"trace", {}};
  w.infinite_cache = infinite_cache(trace, o.trace_block_tokens);
  const double first = trace.empty() ? 0.0 : trace.front().timestamp_ms;
  for (const TraceRequest& r : trace) {
    Turn t;
    t.prompt_ids = trace_prompt(r, o.trace_block_tokens, p.word_ids(), o.seed);
    t.user_tokens = static_cast<std::int32_t>(t.prompt_ids.size());
    const std::int64_t out = o.trace_max_output > 0 ? std::min<std::int64_t>(r.output_length, o.trace_max_output) : r.output_length;
    t.output_len = static_cast<std::int32_t>(std::min<std::int64_t>(out, INT32_MAX));
    Chain c;
    c.arrival = std::max(0.0, r.timestamp_ms - first) / 1000.0 * o.trace_time_scale;
    c.turns.push_back(std::move(t));
    w.chains.push_back(std::move(c));
  }
  return w;
}

// One request per line; requests with the same prefix_id share their first prefix_len tokens
// (default: half of the first such request's input).
Workload trace_workload(const WorkloadOptions& o, const PromptBuilder& p, std::mt19937_64& rng) {
  std::ifstream in(o.trace_file);
  if (!in) throw std::invalid_argument("cannot read --trace-file " + o.trace_file);
  std::string first_line;
  while (first_line.find_first_not_of(" \t\r") == std::string::npos && std::getline(in, first_line)) {
  }
  in.clear();
  in.seekg(0);
  if (is_mooncake_line(first_line)) return mooncake_workload(o, p, in);
  Workload w{"trace", {}};
  std::map<std::string, std::pair<int, std::string>> prefixes;  // id -> (index, text)
  std::string line;
  double first = 0;
  for (int n = 1; std::getline(in, line); ++n) {
    if (o.num_prompts_set && w.chains.size() >= o.num_prompts) break;  // --num-prompts: the first N lines
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = o.trace_file + ":" + std::to_string(n);
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(line, ec);
    if (ec || !v.is_object()) throw std::invalid_argument(where + ": not a JSON object");
    const auto& obj = v.as_object();
    const auto* ts = obj.if_contains("timestamp");
    if (!ts || !ts->is_number()) throw std::invalid_argument(where + ": 'timestamp' (seconds) is required");
    const double at = ts->to_number<double>();
    if (w.chains.empty()) first = at;
    Chain c;
    c.arrival = std::max(0.0, at - first);
    const std::int32_t input_len = field_int(obj, "input_len", where);
    Turn t{{}, input_len, field_int(obj, "output_len", where)};
    if (const auto* id = obj.if_contains("prefix_id")) {
      const std::string key = id->is_string() ? std::string(id->as_string()) : boost::json::serialize(*id);
      auto it = prefixes.find(key);
      if (it == prefixes.end()) {
        const std::int32_t len = obj.contains("prefix_len") ? field_int(obj, "prefix_len", where) : input_len / 2;
        it = prefixes.emplace(key, std::make_pair(static_cast<int>(prefixes.size()), p.text(len, rng))).first;
      }
      c.group = it->second.first;
      c.system_text = first_words(it->second.second, input_len);
      c.system_tokens = static_cast<std::int32_t>(std::count(c.system_text.begin(), c.system_text.end(), ' '));
    }
    t.user_tokens = input_len - c.system_tokens;
    t.user_text = p.text(t.user_tokens, rng);
    c.turns.push_back(std::move(t));
    w.chains.push_back(std::move(c));
  }
  return w;
}

}  // namespace

bool Workload::sends_token_ids() const {
  for (const auto& c : chains)
    for (const auto& t : c.turns)
      if (!t.prompt_ids.empty()) return true;
  return false;
}

std::size_t Workload::request_count() const {
  std::size_t n = 0;
  for (const auto& c : chains) n += c.turns.size();
  return n;
}

PromptBuilder::PromptBuilder(const Tokenizer& tokenizer) {
  for (std::size_t id = 0; id < tokenizer.vocab_size() && words_.size() < kMaxWords; ++id) {
    const auto token = static_cast<TokenId>(id);
    if (tokenizer.is_special(token)) continue;
    const std::string text = tokenizer.decode(std::span<const TokenId>(&token, 1));
    if (!is_word(text)) continue;
    const std::vector<TokenId> back = tokenizer.encode(text, false);
    if (back.size() != 1 || back[0] != token) continue;
    words_.push_back(text);
    ids_.push_back(token);
  }
  if (words_.size() < 16) throw std::runtime_error("the tokenizer has too few plain word tokens to build prompts");
}

std::string PromptBuilder::text(std::int32_t tokens, std::mt19937_64& rng) const {
  std::uniform_int_distribution<std::size_t> pick(0, words_.size() - 1);
  std::string out;
  for (std::int32_t i = 0; i < tokens; ++i) out += words_[pick(rng)];
  return out;
}

std::string first_words(const std::string& text, std::int32_t tokens) {
  std::size_t pos = 0;
  for (std::int32_t i = 0; i < tokens; ++i) {
    pos = text.find(' ', pos + 1);
    if (pos == std::string::npos) return text;
  }
  return text.substr(0, pos);
}

Workload make_workload(const WorkloadOptions& o, const PromptBuilder& prompts) {
  std::mt19937_64 rng(o.seed);
  if (o.dataset == "random") return random_workload(o, prompts, rng);
  if (o.dataset == "shared-prefix") return shared_prefix_workload(o, prompts, rng);
  if (o.dataset == "multi-turn") return multi_turn_workload(o, prompts, rng);
  if (o.dataset == "trace") return trace_workload(o, prompts, rng);
  if (o.dataset == "mixed-chat") return mixed_chat_workload(o, prompts, rng);
  throw std::invalid_argument("--dataset-name must be random, shared-prefix, multi-turn, trace or mixed-chat");
}

}  // namespace kvfleet::bench
