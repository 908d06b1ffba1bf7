// Open-loop arrival times, as `vllm bench serve` draws them: the first request at t = 0, then gaps from
// a gamma distribution with shape = burstiness and mean 1 / rate (burstiness 1 is a Poisson process;
// below 1 burstier, above 1 more regular). rate = infinity sends everything at t = 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvfleet::bench {

// Seconds from the start of the run, ascending. Deterministic for a seed (libstdc++'s distributions).
std::vector<double> arrival_times(std::size_t count, double request_rate, double burstiness, std::uint64_t seed);

}  // namespace kvfleet::bench
