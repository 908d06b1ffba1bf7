// The router's trace spans (kvfleet/trace/span.h): a routing decision's and an upstream try's.
#include "router/gateway/gateway.h"

namespace kvfleet::router {

void Gateway::end_span(trace::Span& span) {
  span.end_ns = trace::unix_nanos_now();
  if (spans_) spans_->export_span(std::move(span));
}

std::shared_ptr<ReplicaLink> Gateway::traced_route(const trace::Span& parent, RoutePlan& plan,
                                                   const std::vector<ReplicaId>& exclude, CircuitBreaker::Ticket& ticket,
                                                   int attempt) {
  trace::Span span = trace::child_span(parent, "router.route");
  std::shared_ptr<ReplicaLink> link = route(plan, exclude, ticket);
  span.set("kvfleet.route.replica", link ? link->url : std::string("none"));
  span.set("kvfleet.route.reason", plan.reason);
  span.set("kvfleet.route.matched_blocks", static_cast<std::int64_t>(plan.matched_blocks));
  span.set("kvfleet.route.prompt_blocks", static_cast<std::int64_t>(plan.hashes.size()));
  span.set("kvfleet.route.attempt", static_cast<std::int64_t>(attempt));
  if (plan.dp_rank >= 0) span.set("kvfleet.route.dp_rank", static_cast<std::int64_t>(plan.dp_rank));
  if (!plan.prefill_from.empty()) span.set("kvfleet.route.prefill_from", plan.prefill_from);
  end_span(span);
  return link;
}

trace::Span Gateway::upstream_span(const trace::Span& parent, const ReplicaLink& link, int attempt) {
  trace::Span span = trace::child_span(parent, "router.upstream", trace::SpanKind::client);
  span.set("server.address", link.address.host);
  span.set("server.port", static_cast<std::int64_t>(link.address.port));
  span.set("kvfleet.route.attempt", static_cast<std::int64_t>(attempt));
  return span;
}

void Gateway::end_upstream_span(trace::Span& span, Outcome outcome, bool failed) {
  span.set("kvfleet.upstream.outcome", outcome == Outcome::done ? "done" : outcome == Outcome::retry ? "retry" : "broke");
  span.error = failed;
  end_span(span);
}

}  // namespace kvfleet::router
