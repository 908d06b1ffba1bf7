#include "bench/kvfleet_bench/progress.h"

#include <fmt/format.h>
#include <memory>

namespace kvfleet::bench {

std::string progress_bar(const Progress& p, int width) {
  const double share = p.total == 0 ? 1.0 : static_cast<double>(p.done) / static_cast<double>(p.total);
  const int filled = static_cast<int>(share * width);
  std::string bar = std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(width - filled), '.');
  const double rate = p.elapsed > 0 ? static_cast<double>(p.done) / p.elapsed : 0;
  return fmt::format("[{}] {}/{} {:3.0f}% | {} in flight | {} failed | {:.1f}s | {:.2f} req/s", bar, p.done, p.total,
                     share * 100, p.in_flight, p.failed, p.elapsed, rate);
}

std::function<void(const Progress&)> progress_printer(std::ostream& out, bool terminal) {
  auto last_decile = std::make_shared<int>(-1);
  return [&out, terminal, last_decile](const Progress& p) {
    const bool finished = p.done == p.total;
    if (terminal) {
      out << "\r" << progress_bar(p, 30) << "\033[K" << (finished ? "\n" : "") << std::flush;  // K: clear the rest
      return;
    }
    const int decile = p.total == 0 ? 10 : static_cast<int>(p.done * 10 / p.total);
    if (decile == *last_decile) return;
    *last_decile = decile;
    out << "progress: " << progress_bar(p, 20) << "\n" << std::flush;
  };
}

}  // namespace kvfleet::bench
