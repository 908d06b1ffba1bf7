#include "bench/kvfleet_bench/arrivals.h"

#include <cmath>
#include <random>
#include <stdexcept>

namespace kvfleet::bench {

std::vector<double> arrival_times(std::size_t count, double request_rate, double burstiness, std::uint64_t seed) {
  if (!(request_rate > 0)) throw std::invalid_argument("--request-rate must be > 0 (inf: all at once)");
  if (!(burstiness > 0)) throw std::invalid_argument("--burstiness must be > 0");
  std::vector<double> times(count, 0.0);
  if (std::isinf(request_rate)) return times;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  for (std::size_t i = 1; i < count; ++i) times[i] = times[i - 1] + gap(rng);
  return times;
}

}  // namespace kvfleet::bench
