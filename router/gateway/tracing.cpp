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

void Gateway::end_upstream_span(trace::Span& span, Outcome outcome, bool failed, int status) {
  span.set("kvfleet.upstream.outcome", outcome == Outcome::done ? "done" : outcome == Outcome::retry ? "retry" : "broke");
  if (status > 0) span.set("http.response.status_code", static_cast<std::int64_t>(status));
  // OTel's error.type: the status when it is an error, else what went wrong.
  if (status >= 400) span.set("error.type", std::to_string(status));
  else if (failed) span.set("error.type", status == 0 ? "no_response" : "response_broken");
  span.error = failed || status >= 400;
  end_span(span);
}

void Gateway::end_request_span(trace::Span& span, int status, bool threw) {
  if (threw && status == 0) status = 500;  // what the server answers for a handler that failed
  if (status > 0) span.set("http.response.status_code", static_cast<std::int64_t>(status));
  if (status >= 500) span.set("error.type", std::to_string(status));
  else if (threw) span.set("error.type", "_OTHER");
  span.error = span.error || threw || status >= 500;
  end_span(span);
}

void Gateway::mark_broken(trace::Span& request_span) {
  request_span.set("error.type", "response_broken");
  request_span.error = true;
}

}  // namespace kvfleet::router
