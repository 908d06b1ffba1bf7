// Backend's expert-parallel device ops for backends that do not implement them: a clear error.
#include <stdexcept>
#include <string>

#include "kvfleet/backend.h"

namespace kvfleet {
namespace {

[[noreturn]] void unsupported(const Backend& b, const char* op) {
  throw std::runtime_error("backend '" + std::string(b.name()) + "' does not implement " + op +
                           " (expert parallelism over a device communicator)");
}

}  // namespace

void Backend::gather_rows(const float*, const std::int32_t*, std::int64_t, std::int64_t, float*) {
  unsupported(*this, "gather_rows");
}
void Backend::moe_combine(const float*, const std::int32_t*, const float*, std::int64_t, std::int64_t, std::int64_t,
                          float*) {
  unsupported(*this, "moe_combine");
}

}  // namespace kvfleet
