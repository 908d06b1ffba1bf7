// The router's reading of a replica's /v1/kv_events stream: SSE bytes (http::SseParser, the parser the
// router's replica links use) -> Contract 2 events (router::parse_kv_event) -> the replica cache
// index and its prefix tree (router::ReplicaCacheIndex), as router/gateway/replica_links.cpp does.
//
// Oracles: the SSE parser yields the same events whether the bytes come whole or in small pieces
// (the first input byte picks the piece size); parse_kv_event throws only std::invalid_argument; the
// index never throws for any event sequence and its tree passes check_integrity() after each event.
#include <exception>
#include <string>
#include <typeinfo>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kvfleet/http/sse.h"
#include "router/kv_event.h"
#include "router/replica_cache_index.h"

namespace {

using kvfleet::fuzz::finding;
using kvfleet::http::SseEvent;

bool same(const SseEvent& a, const SseEvent& b) { return a.event == b.event && a.data == b.data && a.id == b.id; }

std::vector<SseEvent> feed_in_pieces(std::string_view bytes, std::size_t piece) {
  kvfleet::http::SseParser parser;
  std::vector<SseEvent> out;
  for (std::size_t at = 0; at < bytes.size(); at += piece) {
    for (SseEvent& e : parser.feed(bytes.substr(at, piece))) out.push_back(std::move(e));
  }
  return out;
}

void check_parse(const std::string& data) {
  try {
    (void)kvfleet::router::parse_kv_event(data);
  } catch (const std::invalid_argument&) {
  } catch (const std::exception& e) {
    finding(std::string("parse_kv_event threw ") + typeid(e).name(), e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t piece = 1 + data[0] % 16;
  const std::string_view stream = kvfleet::fuzz::as_text(data + 1, size - 1);

  kvfleet::http::SseParser whole_parser;
  const std::vector<SseEvent> whole = whole_parser.feed(stream);
  const std::vector<SseEvent> pieces = feed_in_pieces(stream, piece);
  if (whole.size() != pieces.size()) finding("SSE events differ with the split", std::to_string(piece));
  for (std::size_t i = 0; i < whole.size(); ++i)
    if (!same(whole[i], pieces[i])) finding("SSE event differs with the split", whole[i].data);

  // Two replicas (even and odd events), the router's defaults: block size 16, root 0.
  kvfleet::router::ReplicaCacheIndex index(kvfleet::router::ReplicaCacheConfig{});
  index.add_replica(0);
  index.add_replica(1);
  index.begin_stream(0);
  index.begin_stream(1);
  kvfleet::router::Tick now = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    check_parse(whole[i].data);
    try {
      index.apply_event(static_cast<kvfleet::router::ReplicaId>(i % 2), whole[i].data, ++now);
      index.tree().check_integrity();
    } catch (const std::exception& e) {
      finding(std::string("replica cache index threw ") + typeid(e).name(), e.what());
    }
  }
  return 0;
}
