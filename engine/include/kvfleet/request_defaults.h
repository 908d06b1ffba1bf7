// Defaults of OpenAI request fields that the router must apply exactly as the replica does: it
// estimates a request's load (prompt plus tokens to generate) before the replica has seen it.
#pragma once

#include <cstdint>

namespace kvfleet {

// max_tokens of a completions request that gives none (the replica's --default-max-tokens starts here).
inline constexpr std::int32_t kDefaultMaxTokens = 256;

}  // namespace kvfleet
