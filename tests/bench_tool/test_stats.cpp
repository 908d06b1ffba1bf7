// Percentiles and summaries match numpy (what vllm uses) on hand-checked data; arrivals have the
// asked-for mean rate and burstiness.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "bench/kvfleet_bench/arrivals.h"
#include "bench/kvfleet_bench/stats.h"

using namespace kvfleet::bench;

TEST_CASE("percentiles interpolate linearly like numpy.percentile") {
  const std::vector<double> v{10, 1, 9, 2, 8, 3, 7, 4, 6, 5};  // 1..10 shuffled
  CHECK(percentile(v, 50) == doctest::Approx(5.5));   // np.percentile(range(1,11), 50)
  CHECK(percentile(v, 90) == doctest::Approx(9.1));
  CHECK(percentile(v, 99) == doctest::Approx(9.91));
  CHECK(percentile(v, 0) == 1);
  CHECK(percentile(v, 100) == 10);
  CHECK(percentile({42}, 99) == 42);
  CHECK(percentile({}, 50) == 0);
}

TEST_CASE("summarize gives mean, median, population std and p90/p99") {
  const Summary s = summarize({4, 1, 3, 2});
  CHECK(s.count == 4);
  CHECK(s.mean == doctest::Approx(2.5));
  CHECK(s.median == doctest::Approx(2.5));
  CHECK(s.std == doctest::Approx(std::sqrt(1.25)));  // np.std([1,2,3,4]) (ddof 0)
  CHECK(s.p90 == doctest::Approx(3.7));
  CHECK(s.p99 == doctest::Approx(3.97));
  CHECK(s.min == 1);
  CHECK(s.max == 4);
  const Summary empty = summarize({});
  CHECK(empty.count == 0);
  CHECK(empty.mean == 0);
}

TEST_CASE("Poisson arrivals: the mean rate is the asked one, and a seed repeats them") {
  const std::size_t n = 20000;
  const auto t = arrival_times(n, 10.0, 1.0, 7);
  REQUIRE(t.size() == n);
  CHECK(t[0] == 0);
  const double rate = static_cast<double>(n - 1) / t.back();
  CHECK(rate == doctest::Approx(10.0).epsilon(0.03));
  CHECK(arrival_times(n, 10.0, 1.0, 7) == t);
  CHECK(arrival_times(n, 10.0, 1.0, 8) != t);
  // Exponential gaps: coefficient of variation 1.
  double sum = 0, squares = 0;
  for (std::size_t i = 1; i < n; ++i) {
    const double g = t[i] - t[i - 1];
    sum += g;
    squares += g * g;
  }
  const double mean = sum / (n - 1), cv = std::sqrt(squares / (n - 1) - mean * mean) / mean;
  CHECK(cv == doctest::Approx(1.0).epsilon(0.05));
}

TEST_CASE("burstiness is the gamma shape: CV of the gaps is 1/sqrt(burstiness), the rate unchanged") {
  const std::size_t n = 20000;
  for (double shape : {0.25, 4.0}) {
    const auto t = arrival_times(n, 5.0, shape, 3);
    double sum = 0, squares = 0;
    for (std::size_t i = 1; i < n; ++i) {
      const double g = t[i] - t[i - 1];
      sum += g;
      squares += g * g;
    }
    const double mean = sum / (n - 1), cv = std::sqrt(squares / (n - 1) - mean * mean) / mean;
    CHECK(1.0 / mean == doctest::Approx(5.0).epsilon(0.05));
    CHECK(cv == doctest::Approx(1.0 / std::sqrt(shape)).epsilon(0.06));
  }
}

TEST_CASE("rate inf sends everything at t = 0; a bad rate is refused") {
  const auto t = arrival_times(5, std::numeric_limits<double>::infinity(), 1.0, 0);
  CHECK(t == std::vector<double>(5, 0.0));
  CHECK_THROWS_AS(arrival_times(5, 0.0, 1.0, 0), std::invalid_argument);
  CHECK_THROWS_AS(arrival_times(5, 1.0, 0.0, 0), std::invalid_argument);
}
