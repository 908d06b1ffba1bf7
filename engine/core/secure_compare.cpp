#include "kvfleet/secure_compare.h"

#include <algorithm>

namespace kvfleet {

bool secure_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited and no branch depends on the contents: the differences are
  // OR-ed together and looked at once, at the end.
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace kvfleet
