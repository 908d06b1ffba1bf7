// Summary statistics the way `vllm bench serve` computes them (numpy semantics), so our numbers
// compare with theirs: percentiles interpolate linearly between order statistics
// (numpy.percentile's default), std is the population standard deviation (numpy.std, ddof=0).
#pragma once

#include <cstddef>
#include <vector>

namespace kvfleet::bench {

struct Summary {
  std::size_t count = 0;
  double mean = 0, median = 0, std = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};

// p in [0, 100]; `sorted` ascending and non-empty (0 for an empty one).
double percentile_sorted(const std::vector<double>& sorted, double p);
double percentile(std::vector<double> values, double p);
// Every field is 0 for an empty input (vllm reports 0 rather than NaN too).
Summary summarize(std::vector<double> values);

}  // namespace kvfleet::bench
