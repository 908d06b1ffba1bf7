// Backend's MoE ops for backends that do not implement them: a clear error instead of wrong results.
#include <stdexcept>
#include <string>

#include "kvfleet/backend.h"

namespace kvfleet {
namespace {

[[noreturn]] void unsupported(const Backend& b, const char* op) {
  throw std::runtime_error("backend '" + std::string(b.name()) + "' does not implement " + op +
                           " (mixture-of-experts models)");
}

}  // namespace

void Backend::moe_route(const float*, std::int64_t, std::int64_t, std::int64_t, bool, std::int32_t*, float*) {
  unsupported(*this, "moe_route");
}
void Backend::moe_experts(const float*, std::int64_t, std::int64_t, const std::int32_t*, const float*, std::int64_t,
                          const MoeExpertWeights&, float*, std::int32_t*) {
  unsupported(*this, "moe_experts");
}
void Backend::sigmoid_scale_add(float*, const float*, const float*, std::int64_t, std::int64_t) {
  unsupported(*this, "sigmoid_scale_add");
}

}  // namespace kvfleet
