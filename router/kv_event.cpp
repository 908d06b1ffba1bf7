#include "router/kv_event.h"

#include <boost/json.hpp>

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <string>

namespace kvfleet::router {
namespace {

namespace json = boost::json;

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("kv event: " + what); }

BlockHash hash_value(const json::value& v, const char* field) {
  if (v.is_uint64()) return v.get_uint64();
  if (v.is_int64()) return static_cast<BlockHash>(v.get_int64());
  if (v.is_string()) {
    std::string_view s = v.get_string();
    int base = 10;
    if (s.starts_with("0x") || s.starts_with("0X")) {
      s.remove_prefix(2);
      base = 16;
    }
    BlockHash h = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), h, base);
    if (ec == std::errc{} && end == s.data() + s.size() && !s.empty()) return h;
  }
  bad(std::string("'") + field + "' must be an unsigned 64-bit integer or a numeric string");
}

std::uint64_t unsigned_field(const json::object& o, const char* field) {
  const json::value* v = o.if_contains(field);
  if (v == nullptr) bad(std::string("missing '") + field + "'");
  if (v->is_uint64()) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<std::uint64_t>(v->get_int64());
  bad(std::string("'") + field + "' must be a non-negative integer");
}

KvEventMessage::Type type_of(const json::object& o) {
  const json::value* v = o.if_contains("type");
  if (v == nullptr || !v->is_string()) bad("missing 'type'");
  const std::string_view t = v->get_string();
  if (t == "config") return KvEventMessage::Type::config;
  if (t == "stored") return KvEventMessage::Type::stored;
  if (t == "removed") return KvEventMessage::Type::removed;
  if (t == "cleared") return KvEventMessage::Type::cleared;
  if (t == "load") return KvEventMessage::Type::load;
  return KvEventMessage::Type::unknown;
}

void parse_load(const json::object& o, KvEventMessage& e) {
  auto count = [&](const char* field) {
    const std::uint64_t v = unsigned_field(o, field);
    if (v > UINT32_MAX) bad(std::string("'") + field + "' is too large");
    return static_cast<std::uint32_t>(v);
  };
  e.waiting = count("waiting");
  e.running = count("running");
  const json::value* u = o.if_contains("kv_usage");
  if (u == nullptr || !u->is_number()) bad("'kv_usage' must be a number");
  e.kv_usage = u->to_number<double>();
  if (!(e.kv_usage >= 0 && e.kv_usage <= 1)) bad("'kv_usage' must be in [0, 1]");
}

// Ranks behind one endpoint are few (an EP group of a few dozen at most); more is malformed.
constexpr std::uint64_t kMaxDpSize = 1024;

void parse_rank(const json::object& o, KvEventMessage& e) {
  if (!o.contains("dp_rank")) return;
  const std::uint64_t r = unsigned_field(o, "dp_rank");
  if (r >= kMaxDpSize) bad("'dp_rank' is too large");
  e.dp_rank = static_cast<std::int32_t>(r);
}

}  // namespace

KvEventMessage parse_kv_event(std::string_view text) {
  boost::system::error_code ec;
  const json::value doc = json::parse(json::string_view(text.data(), text.size()), ec);
  if (ec) bad("not JSON (" + ec.message() + ")");
  if (!doc.is_object()) bad("not a JSON object");
  const json::object& o = doc.get_object();
  KvEventMessage e;
  e.type = type_of(o);
  if (e.type == KvEventMessage::Type::unknown) return e;
  if (e.type == KvEventMessage::Type::load) {
    parse_load(o, e);
    parse_rank(o, e);
    return e;
  }
  e.seq = unsigned_field(o, "seq");
  if (e.type == KvEventMessage::Type::config) {
    e.block_size = unsigned_field(o, "block_size");
    const json::value* root = o.if_contains("root");
    if (root == nullptr) bad("missing 'root'");
    e.root = hash_value(*root, "root");
    if (const json::value* instance = o.if_contains("instance")) e.instance = hash_value(*instance, "instance");
    if (o.contains("dp_size")) {
      const std::uint64_t n = unsigned_field(o, "dp_size");
      if (n < 1 || n > kMaxDpSize) bad("'dp_size' must be in [1, " + std::to_string(kMaxDpSize) + "]");
      e.dp_size = static_cast<std::uint32_t>(n);
    }
    if (const json::value* per_rank = o.if_contains("per_rank")) {
      if (!per_rank->is_bool()) bad("'per_rank' must be true or false");
      e.per_rank = per_rank->get_bool();
    }
    if (const json::value* shared = o.if_contains("shared_tier"); shared && !shared->is_null())
      e.shared_tier = hash_value(*shared, "shared_tier");
    return e;
  }
  parse_rank(o, e);
  if (const json::value* medium = o.if_contains("medium")) {
    if (!medium->is_string()) bad("'medium' must be a string");
    e.medium = medium_from_string(std::string_view(medium->get_string()));
  }
  if (e.type == KvEventMessage::Type::cleared && o.contains("snapshot")) e.snapshot_blocks = unsigned_field(o, "snapshot");
  if (const json::value* snap = o.if_contains("snapshot"); snap && e.type == KvEventMessage::Type::stored) {
    if (!snap->is_bool()) bad("'snapshot' must be true or false");
    e.snapshot = snap->get_bool();
  }
  if (const json::value* hashes = o.if_contains("block_hashes")) {
    if (!hashes->is_array()) bad("'block_hashes' must be an array");
    if (hashes->get_array().size() > kMaxEventHashes)
      bad("'block_hashes' has " + std::to_string(hashes->get_array().size()) + " entries, more than " +
          std::to_string(kMaxEventHashes));
    e.block_hashes.reserve(hashes->get_array().size());
    for (const json::value& h : hashes->get_array()) e.block_hashes.push_back(hash_value(h, "block_hashes"));
  } else if (e.type != KvEventMessage::Type::cleared) {
    bad("missing 'block_hashes'");
  }
  if (const json::value* parent = o.if_contains("parent"); parent != nullptr && !parent->is_null()) {
    e.parent = hash_value(*parent, "parent");
  }
  return e;
}

std::vector<KvEventMessage> split_kv_event(KvEventMessage event, std::size_t max_hashes) {
  std::vector<KvEventMessage> out;
  const bool splittable = event.type == KvEventMessage::Type::stored || event.type == KvEventMessage::Type::removed;
  if (!splittable || max_hashes == 0 || event.block_hashes.size() <= max_hashes) {
    out.push_back(std::move(event));
    return out;
  }
  const std::vector<BlockHash> all = std::move(event.block_hashes);
  for (std::size_t at = 0; at < all.size(); at += max_hashes) {
    KvEventMessage piece = event;
    const std::size_t end = std::min(all.size(), at + max_hashes);
    piece.block_hashes.assign(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(end));
    if (at > 0) {
      piece.continuation = true;
      if (piece.type == KvEventMessage::Type::stored) piece.parent = all[at - 1];
    }
    out.push_back(std::move(piece));
  }
  return out;
}

}  // namespace kvfleet::router
