#include <cmath>
#include <numbers>

#include "kvfleet/model_runner.h"

namespace kvfleet {

// Mirrors transformers' modeling_rope_utils: _compute_default_rope_parameters, the linear variant
// (inv_freq / factor) and _compute_llama3_parameters (frequency-dependent scaling with a smooth ramp).
std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const std::int64_t d = c.head_dim;
  std::vector<float> inv(static_cast<std::size_t>(d / 2));
  for (std::int64_t i = 0; i < d / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(d);
    inv[static_cast<std::size_t>(i)] = 1.0f / std::pow(static_cast<float>(c.rope_theta), exponent);
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.kind == RopeScaling::Kind::linear) {
    for (auto& f : inv) f = static_cast<float>(f / s.factor);
  } else if (s.kind == RopeScaling::Kind::llama3) {
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      double scaled = wavelen > low_wavelen ? f / s.factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        scaled = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
      }
      f = static_cast<float>(scaled);
    }
  }
  return inv;
}

}  // namespace kvfleet
