// Progress on stderr: a redrawn bar when stderr is a terminal, otherwise a plain line every 10%
// of the requests (logs stay readable).
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "bench/kvfleet_bench/runner.h"

namespace kvfleet::bench {

std::string progress_bar(const Progress& p, int width);
std::function<void(const Progress&)> progress_printer(std::ostream& out, bool terminal);

}  // namespace kvfleet::bench
