// Comparing a secret (an API key) with what a client sent, without telling the client through timing how
// much of its guess was right. Shared by the replica's and the router's key checks and the ucx KV pull.
#pragma once

#include <string_view>

namespace kvfleet {

// a == b, in a time that depends on the two lengths only, never on where the first difference is.
bool secure_equal(std::string_view a, std::string_view b);

}  // namespace kvfleet
