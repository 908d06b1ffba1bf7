#include "bench/kvfleet_bench/mooncake_trace.h"

#include <boost/json.hpp>
#include <istream>
#include <stdexcept>
#include <unordered_map>

namespace kvfleet::bench {
namespace {

namespace json = boost::json;

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::int64_t whole_number(const json::object& o, const char* key, const std::string& where) {
  const json::value* v = o.if_contains(key);
  if (!v) throw std::invalid_argument(where + ": '" + key + "' is required");
  if (v->is_int64() && v->as_int64() >= 0) return v->as_int64();
  if (v->is_uint64() && v->as_uint64() <= static_cast<std::uint64_t>(INT64_MAX)) return static_cast<std::int64_t>(v->as_uint64());
  throw std::invalid_argument(where + ": '" + key + "' must be a whole number >= 0");
}

}  // namespace

bool is_mooncake_line(const std::string& line) { return line.find("\"input_length\"") != std::string::npos; }

TraceRequest parse_mooncake_line(const std::string& line, const std::string& where) {
  boost::system::error_code ec;
  const json::value v = json::parse(line, ec);
  if (ec || !v.is_object()) throw std::invalid_argument(where + ": not a JSON object");
  const json::object& o = v.as_object();
  TraceRequest r;
  const json::value* ts = o.if_contains("timestamp");
  if (!ts || !ts->is_number() || ts->to_number<double>() < 0)
    throw std::invalid_argument(where + ": 'timestamp' (milliseconds, >= 0) is required");
  r.timestamp_ms = ts->to_number<double>();
  r.input_length = whole_number(o, "input_length", where);
  r.output_length = whole_number(o, "output_length", where);
  if (r.input_length == 0) throw std::invalid_argument(where + ": 'input_length' must be at least 1");
  if (r.output_length == 0) throw std::invalid_argument(where + ": 'output_length' must be at least 1");
  const json::value* ids = o.if_contains("hash_ids");
  if (!ids || !ids->is_array()) throw std::invalid_argument(where + ": 'hash_ids' (a list of integers) is required");
  for (const json::value& id : ids->as_array()) {
    if (!id.is_int64() && !id.is_uint64()) throw std::invalid_argument(where + ": 'hash_ids' must hold integers only");
    r.hash_ids.push_back(id.to_number<std::int64_t>());
  }
  const auto blocks = static_cast<std::int64_t>(r.hash_ids.size());
  const std::int64_t want = (r.input_length + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens;
  if (blocks != want)
    throw std::invalid_argument(where + ": 'input_length' " + std::to_string(r.input_length) + " needs " +
                                std::to_string(want) + " hash_ids of " + std::to_string(kMooncakeBlockTokens) +
                                " tokens, the line has " + std::to_string(blocks));
  return r;
}

std::vector<TraceRequest> parse_mooncake_trace(std::istream& in, const std::string& source, std::size_t max_lines) {
  std::vector<TraceRequest> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (max_lines > 0 && out.size() >= max_lines) break;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.push_back(parse_mooncake_line(line, source + ":" + std::to_string(n)));
  }
  return out;
}

std::vector<std::int32_t> block_lengths(const TraceRequest& r, std::int32_t block_tokens) {
  std::vector<std::int32_t> out(r.hash_ids.size(), block_tokens);
  if (out.empty()) return out;
  const std::int64_t last = r.input_length - static_cast<std::int64_t>(out.size() - 1) * kMooncakeBlockTokens;
  out.back() = static_cast<std::int32_t>(std::max<std::int64_t>(1, last * block_tokens / kMooncakeBlockTokens));
  return out;
}

std::vector<TokenId> block_token_ids(std::int64_t hash_id, std::int32_t n, const std::vector<TokenId>& vocabulary,
                                     std::uint64_t seed) {
  if (vocabulary.empty()) throw std::invalid_argument("no token ids to build trace blocks from");
  std::vector<TokenId> out(static_cast<std::size_t>(std::max(0, n)));
  const std::uint64_t base = mix(seed ^ mix(static_cast<std::uint64_t>(hash_id)));
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = vocabulary[mix(base + j) % vocabulary.size()];
  return out;
}

std::vector<TokenId> trace_prompt(const TraceRequest& r, std::int32_t block_tokens, const std::vector<TokenId>& vocabulary,
                                  std::uint64_t seed) {
  std::vector<TokenId> out;
  const std::vector<std::int32_t> lengths = block_lengths(r, block_tokens);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const std::vector<TokenId> block = block_token_ids(r.hash_ids[b], lengths[b], vocabulary, seed);
    out.insert(out.end(), block.begin(), block.end());
  }
  return out;
}

InfiniteCache infinite_cache(const std::vector<TraceRequest>& trace, std::int32_t block_tokens) {
  // Chain hash of a run of ids -> the most tokens of its last block any request sent so far.
  std::unordered_map<std::uint64_t, std::int32_t> seen;
  InfiniteCache c;
  for (const TraceRequest& r : trace) {
    const std::vector<std::int32_t> lengths = block_lengths(r, block_tokens);
    std::uint64_t chain = 0;
    bool hitting = true;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      chain = mix(chain ^ mix(static_cast<std::uint64_t>(r.hash_ids[b]) + b));
      c.prompt_tokens += lengths[b];
      std::int32_t& stored = seen[chain];
      if (hitting) {
        c.hit_tokens += std::min(stored, lengths[b]);
        hitting = stored >= lengths[b];
      }
      stored = std::max(stored, lengths[b]);
    }
  }
  return c;
}

}  // namespace kvfleet::bench
