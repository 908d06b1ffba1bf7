// The decode side's KV transfer metrics (Contract 3), in the replica's registry:
//   kvfleet_pd_transfers_total          transfers that delivered every block asked for
//   kvfleet_pd_transfer_bytes_total     block payload bytes received and imported (partial transfers too)
//   kvfleet_pd_transfer_seconds         handshake to last import, of complete transfers (histogram)
//   kvfleet_pd_fallbacks_total{reason}  transfers given up on; the rest of the prompt was prefilled locally.
//     reason: connect, handshake, checksum, malformed, timeout, peer_closed, lease_expired, client_gone,
//     cache_full, error
//   kvfleet_pd_transport_fallbacks_total{reason}  transfers that agreed on ucx but pulled over tcp instead
//     (reason: connect); a transport downgrade, not a local prefill
//   kvfleet_pd_pulls_total{transport}   pulls answered, by the transport that carried them (tcp, ucx)
// Thread-safe (prometheus-cpp metrics).
#pragma once

#include <string>

#include "kvfleet/http/metrics.h"

namespace kvfleet::pd {

class PdMetrics {
 public:
  explicit PdMetrics(http::MetricsRegistry& registry)
      : registry_(registry),
        transfers_(registry.counter("kvfleet_pd_transfers_total", "KV transfers that delivered every block asked for")),
        bytes_(registry.counter("kvfleet_pd_transfer_bytes_total", "KV block bytes received from prefill replicas")),
        seconds_(registry.histogram("kvfleet_pd_transfer_seconds", "Duration of complete KV transfers",
                                    {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})) {}

  void bytes(double n) { bytes_.Increment(n); }
  void transfer(double seconds) {
    transfers_.Increment();
    seconds_.Observe(seconds);
  }
  void transport_fallback(const std::string& reason) {
    registry_.counter("kvfleet_pd_transport_fallbacks_total", "KV transfers that pulled over tcp instead of ucx, by reason",
                      {{"reason", reason}}).Increment();
  }
  void pull(const std::string& transport) {
    registry_.counter("kvfleet_pd_pulls_total", "KV pulls received, by transport", {{"transport", transport}}).Increment();
  }
  void fallback(const std::string& reason) {
    registry_.counter("kvfleet_pd_fallbacks_total", "KV transfers given up on (local prefill instead), by reason",
                      {{"reason", reason}}).Increment();
  }

 private:
  http::MetricsRegistry& registry_;
  prometheus::Counter& transfers_;
  prometheus::Counter& bytes_;
  prometheus::Histogram& seconds_;
};

}  // namespace kvfleet::pd
