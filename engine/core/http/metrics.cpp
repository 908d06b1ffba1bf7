#include "kvfleet/http/metrics.h"

#include <prometheus/text_serializer.h>
#include <sstream>
#include <stdexcept>

namespace kvfleet::http {

namespace {

void check_name(const std::string& name, bool counter) {
  if (!name.starts_with("kvfleet_")) {
    throw std::invalid_argument("metric name '" + name + "' must start with kvfleet_");
  }
  if (counter != name.ends_with("_total")) {
    throw std::invalid_argument("metric name '" + name + "': only counters end in _total");
  }
}

}  // namespace

MetricsRegistry::MetricsRegistry() : registry_(std::make_shared<prometheus::Registry>()) {}

prometheus::Counter& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                              const MetricLabels& labels) {
  check_name(name, true);
  return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add(labels);
}

prometheus::Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help,
                                          const MetricLabels& labels) {
  check_name(name, false);
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(labels);
}

prometheus::Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                                  const std::vector<double>& buckets,
                                                  const MetricLabels& labels) {
  check_name(name, false);
  return prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_).Add(labels, buckets);
}

std::string MetricsRegistry::render() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

Response MetricsRegistry::response() const {
  return Response::text(200, render(), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace kvfleet::http
