// Small pieces the proxy (proxy.cpp) and mid-stream failover (failover.cpp) share.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "kvfleet/http/client.h"
#include "kvfleet/http/server.h"
#include "router/gateway/gateway.h"

namespace kvfleet::router {

inline double seconds_now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

inline const std::vector<double>& latency_buckets() {
  static const std::vector<double> b{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return b;
}

// A write to the client that took this long means the client, not the replica, sets the pace: if the
// replica's stream then breaks (its own write deadline ran out), the replica is not blamed.
constexpr auto kClientStall = std::chrono::seconds(1);

// The replica's own word on the rank that ran the request (an expert-parallel replica's answer).
inline void relay_rank_header(const http::ResponseHead& head, http::Headers& out) {
  if (const std::string* rank = head.headers.find("x-kvfleet-dp-rank")) out.set("x-kvfleet-dp-rank", *rank);
}

// Opens the client's stream with the replica's content type and the router's own headers. False: the
// client has left (the replica's connection is closed too).
inline boost::asio::awaitable<bool> begin_client_stream(http::HttpClient& client, const http::ResponseHead& head,
                                                        const std::string& replica_url, http::ResponseWriter& w) {
  http::Headers headers;
  const std::string* type = head.headers.find("content-type");
  headers.set("content-type", type ? *type : "text/event-stream");
  headers.set("cache-control", "no-cache");
  headers.set("x-kvfleet-replica", replica_url);
  relay_rank_header(head, headers);
  if (co_await w.begin_stream(head.status, std::move(headers))) co_return true;
  client.close();
  co_return false;
}

// Only the router names a prefill replica and a data-parallel rank (vLLM's X-data-parallel-rank header,
// which kvfleet replicas read too): the client's headers are dropped, the routing decision's set.
inline const http::Request& with_routing_headers(const http::Request& req, const RoutePlan& plan, http::Request& copy) {
  if (plan.prefill_from.empty() && plan.dp_rank < 0 && !req.headers.find("x-kvfleet-prefill-from") &&
      !req.headers.find("x-data-parallel-rank"))
    return req;
  copy = req;
  copy.headers.erase("x-kvfleet-prefill-from");
  copy.headers.erase("x-data-parallel-rank");
  if (!plan.prefill_from.empty()) copy.headers.set("x-kvfleet-prefill-from", plan.prefill_from);
  if (plan.dp_rank >= 0) copy.headers.set("x-data-parallel-rank", std::to_string(plan.dp_rank));
  return copy;
}

}  // namespace kvfleet::router
