#include "router/kv_event.h"

#include <boost/json.hpp>

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
  bad("unknown type '" + std::string(t) + "'");
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
  e.seq = unsigned_field(o, "seq");
  if (e.type == KvEventMessage::Type::config) {
    e.block_size = unsigned_field(o, "block_size");
    const json::value* root = o.if_contains("root");
    if (root == nullptr) bad("missing 'root'");
    e.root = hash_value(*root, "root");
    return e;
  }
  if (const json::value* hashes = o.if_contains("block_hashes")) {
    if (!hashes->is_array()) bad("'block_hashes' must be an array");
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

}  // namespace kvfleet::router
