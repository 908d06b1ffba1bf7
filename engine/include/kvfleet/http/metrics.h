// MetricsRegistry: our metrics over prometheus-cpp's core library, rendered in the Prometheus text
// format for GET /metrics on our own server (prometheus-cpp's pull exposer is not used).
//
// Names follow Prometheus conventions, and the registry enforces the two we rely on: every name
// starts with "kvfleet_", and a counter's name ends in "_total". Use base units in names and
// values (seconds, bytes). Registering a name twice returns the existing family's metric.
//
// Thread-safety: all members may be called from any thread; the returned metrics are thread-safe
// (prometheus-cpp updates them atomically) and live as long as the registry.
#pragma once

#include <map>
#include <memory>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <string>
#include <string_view>
#include <vector>

#include "kvfleet/http/message.h"

namespace kvfleet::http {

using MetricLabels = std::map<std::string, std::string>;

class MetricsRegistry {
 public:
  MetricsRegistry();

  // Throws std::invalid_argument for a name that breaks the conventions above.
  prometheus::Counter& counter(const std::string& name, const std::string& help,
                               const MetricLabels& labels = {});
  prometheus::Gauge& gauge(const std::string& name, const std::string& help,
                           const MetricLabels& labels = {});
  prometheus::Histogram& histogram(const std::string& name, const std::string& help,
                                   const std::vector<double>& buckets, const MetricLabels& labels = {});

  // Every metric in the Prometheus text exposition format (version 0.0.4).
  std::string render() const;
  // render() as a 200 response with the exposition Content-Type.
  Response response() const;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
};

}  // namespace kvfleet::http
