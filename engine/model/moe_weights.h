// Loading the sparse MoE block of one layer (internal to engine/model).
#pragma once

#include <string>

#include "kvfleet/model.h"

namespace kvfleet {

// The router, experts (either checkpoint layout) and, for qwen2_moe, the shared expert of the layer whose
// tensors start with `layer_prefix` ("model.layers.N."). Throws ModelError naming a missing or misshapen
// tensor.
MoeLayerWeights load_moe_layer(const Checkpoint& ck, const ModelConfig& c, const std::string& layer_prefix);

}  // namespace kvfleet
