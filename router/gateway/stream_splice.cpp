#include "router/gateway/stream_splice.h"

#include <boost/json.hpp>
#include <charconv>

namespace kvfleet::router {
namespace json = boost::json;

namespace {

// The chunk's ids, always its last member. The pattern cannot occur inside a JSON string (a quote there
// is escaped), so the last occurrence is the member.
constexpr std::string_view kIdsKey = ",\"kvfleet_token_ids\":[";

// Beyond this much without an event boundary the stream is not one the splice understands: passed through.
constexpr std::size_t kMaxPendingEvent = 1 << 20;

// The ids of "1,2,3" into `out`; false when anything else is there.
bool parse_ids(std::string_view text, std::vector<TokenId>& out) {
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    TokenId id = 0;
    const auto [next, ec] = std::from_chars(p, end, id);
    if (ec != std::errc() || id < 0) return false;
    out.push_back(id);
    p = next;
    if (p < end && *p++ != ',') return false;
  }
  return true;
}

// The first event boundary in `text` (a blank line, \n\n or \r\n\r\n): {where the event ends, where the next begins}.
std::pair<std::size_t, std::size_t> boundary(std::string_view text) {
  const std::size_t lf = text.find("\n\n");
  const std::size_t crlf = text.find("\r\n\r\n");
  if (crlf != std::string_view::npos && (lf == std::string_view::npos || crlf < lf)) return {crlf, crlf + 4};
  if (lf != std::string_view::npos) return {lf, lf + 2};
  return {std::string_view::npos, std::string_view::npos};
}

}  // namespace

std::string StreamSplice::feed(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  std::size_t from = 0;
  for (;;) {
    const auto [end, next] = boundary(std::string_view(pending_).substr(from));
    if (end == std::string_view::npos) break;
    out += take_event(std::string_view(pending_).substr(from, end));
    from += next;
  }
  pending_.erase(0, from);
  if (pending_.size() > kMaxPendingEvent) {  // not SSE as the replicas send it
    resumable_ = false;
    out += pending_;
    pending_.clear();
  }
  return out;
}

std::string StreamSplice::finish() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

std::string StreamSplice::take_event(std::string_view event) {
  constexpr std::string_view data = "data: ";
  std::string_view payload = event.substr(std::min(event.size(), data.size()));
  if (!event.starts_with(data) || payload.find('\n') != std::string_view::npos) {
    if (!event.starts_with(":")) resumable_ = false;  // (a comment changes nothing)
    return std::string(event) + "\n\n";
  }
  if (payload.ends_with('\r')) payload.remove_suffix(1);
  if (payload == "[DONE]") {
    ended_ = true;
    return std::string(event) + "\n\n";
  }
  const std::size_t key = payload.rfind(kIdsKey);
  std::string out;
  if (key != std::string_view::npos && payload.ends_with("]}")) {
    const std::size_t from = key + kIdsKey.size();
    if (!parse_ids(payload.substr(from, payload.size() - 2 - from), ids_)) resumable_ = false;
    out.reserve(key + 9);
    out.append(data).append(payload.substr(0, key)).append("}\n\n");
  } else {
    resumable_ = false;  // a chunk whose tokens the router does not know
    out.append(data).append(payload).append("\n\n");
  }
  note_chunk(std::string_view(out).substr(data.size(), out.size() - data.size() - 2));
  return out;
}

// What a chunk says about the stream: its id and created (the first), and whether it ended it.
void StreamSplice::note_chunk(std::string_view text) {
  if (text.starts_with("{\"error\"")) {
    ended_ = true;
    return;
  }
  const std::size_t finish = text.find("\"finish_reason\":");
  if (finish != std::string_view::npos && text.compare(finish + 16, 4, "null") != 0) ended_ = true;
  if (!id_.empty()) return;
  json::error_code ec;
  const json::value v = json::parse(text, ec);
  const json::object* o = !ec ? v.if_object() : nullptr;
  const json::value* id = o ? o->if_contains("id") : nullptr;
  const json::value* created = o ? o->if_contains("created") : nullptr;
  if (!id || !id->is_string() || id->as_string().empty() || !created || !created->is_int64()) {
    resumable_ = false;
    return;
  }
  id_ = std::string(id->as_string());
  created_ = created->as_int64();
}

std::string StreamSplice::resume_body(const json::object& client_body) const {
  json::object body = client_body;
  json::array ids;
  ids.reserve(ids_.size());
  for (TokenId t : ids_) ids.emplace_back(t);
  body["kvfleet_resume"] = json::object{{"output_token_ids", std::move(ids)}, {"id", id_}, {"created", created_}};
  return json::serialize(body);
}

}  // namespace kvfleet::router
