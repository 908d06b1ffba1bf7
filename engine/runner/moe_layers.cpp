#include "engine/runner/moe_layers.h"

#include <stdexcept>
#include <string>

namespace kvfleet {
namespace {

DeviceWeight upload(Backend& b, const TensorView* t) { return t ? b.upload_weight(*t) : DeviceWeight{}; }

}  // namespace

MoeLayers::MoeLayers(const Model& model, Backend& backend, std::int64_t max_rows, Communicator* ep)
    : backend_(backend), config_(model.config()), ep_(ep) {
  const MoeConfig& m = config_.moe;
  if (!m.enabled()) return;
  local_experts_ = m.num_experts;
  if (expert_parallel()) {
    if (m.num_experts % ep_->size() != 0)
      throw std::invalid_argument(std::to_string(m.num_experts) + " experts do not split over ep_size " +
                                  std::to_string(ep_->size()));
    local_experts_ = m.num_experts / ep_->size();
    first_expert_ = ep_->rank() * local_experts_;
  }
  for (const LayerWeights& lw : model.layers()) {
    Layer l;
    const MoeLayerWeights& w = lw.moe;
    if (!w.experts.empty()) {
      l.router = upload(backend, w.router);
      // Only this rank's experts reach the device; the others keep empty slots so ids index directly.
      for (std::size_t i = 0; i < w.experts.size(); ++i) {
        const auto e = static_cast<std::int64_t>(i);
        const bool here = e >= first_expert_ && e < first_expert_ + local_experts_;
        const ExpertWeights& x = w.experts[i];
        l.gate.push_back(here ? backend.upload_weight(x.gate) : DeviceWeight{});
        l.up.push_back(here ? backend.upload_weight(x.up) : DeviceWeight{});
        l.down.push_back(here ? backend.upload_weight(x.down) : DeviceWeight{});
      }
      l.shared_gate = upload(backend, w.shared_gate);
      l.shared_up = upload(backend, w.shared_up);
      l.shared_down = upload(backend, w.shared_down);
      l.shared_expert_gate = upload(backend, w.shared_expert_gate);
    }
    layers_.push_back(std::move(l));
  }
  auto alloc = [&](std::int64_t n, std::size_t elem) {
    void* p = backend.allocate(static_cast<std::size_t>(n) * elem);
    owned_.push_back(p);
    return p;
  };
  const std::int64_t t = max_rows, f = sizeof(float);
  logits_ = static_cast<float*>(alloc(t * m.num_experts, f));
  weights_ = static_cast<float*>(alloc(t * m.top_k, f));
  ids_ = static_cast<std::int32_t*>(alloc(t * m.top_k, sizeof(std::int32_t)));
  counts_ = static_cast<std::int32_t*>(alloc(config_.num_layers * m.num_experts, sizeof(std::int32_t)));
  if (m.shared_intermediate > 0) {
    shared_g_ = static_cast<float*>(alloc(t * m.shared_intermediate, f));
    shared_u_ = static_cast<float*>(alloc(t * m.shared_intermediate, f));
    shared_out_ = static_cast<float*>(alloc(t * config_.hidden_size, f));
    gate_logit_ = static_cast<float*>(alloc(t, f));
  }
}

MoeLayers::~MoeLayers() {
  for (void* p : owned_) backend_.deallocate(p);
  for (void* p : ep_buf_)
    if (p) backend_.deallocate(p);
}

bool MoeLayers::sparse(std::int64_t layer) const {
  return !layers_.empty() && !layers_[static_cast<std::size_t>(layer)].gate.empty();
}

void MoeLayers::begin_step() {
  if (!counts_) return;
  const std::vector<std::int32_t> zeros(static_cast<std::size_t>(config_.num_layers * config_.moe.num_experts), 0);
  backend_.to_device(counts_, zeros.data(), zeros.size() * sizeof(std::int32_t));
}

void MoeLayers::forward(std::int64_t li, const float* x, std::int64_t rows, float* out) {
  const MoeConfig& m = config_.moe;
  const Layer& l = layers_[static_cast<std::size_t>(li)];
  const std::int64_t h = config_.hidden_size;
  if (expert_parallel()) {
    forward_ep(li, x, rows, out);
  } else {
    backend_.linear(x, rows, h, l.router, m.num_experts, {}, logits_);
    backend_.moe_route(logits_, rows, m.num_experts, m.top_k, m.norm_topk_prob, ids_, weights_);
    const MoeExpertWeights experts{l.gate.data(), l.up.data(), l.down.data(), m.num_experts, m.expert_intermediate};
    backend_.moe_experts(x, rows, h, ids_, weights_, m.top_k, experts, out, counts_ + li * m.num_experts);
  }
  if (!l.shared_gate.data || rows == 0) return;
  // Qwen2MoeSparseMoeBlock: experts + sigmoid(shared_expert_gate(x)) * shared_expert(x).
  const std::int64_t s = m.shared_intermediate;
  backend_.linear(x, rows, h, l.shared_gate, s, {}, shared_g_);
  backend_.linear(x, rows, h, l.shared_up, s, {}, shared_u_);
  backend_.silu_mul(shared_g_, shared_u_, rows * s);
  backend_.linear(shared_g_, rows, s, l.shared_down, h, {}, shared_out_);
  backend_.linear(x, rows, h, l.shared_expert_gate, 1, {}, gate_logit_);
  backend_.sigmoid_scale_add(out, shared_out_, gate_logit_, rows, h);
}

std::vector<std::int32_t> MoeLayers::step_counts() {
  if (!counts_) return {};
  std::vector<std::int32_t> out(static_cast<std::size_t>(config_.num_layers * config_.moe.num_experts));
  backend_.to_host(out.data(), counts_, out.size() * sizeof(std::int32_t));
  return out;
}

}  // namespace kvfleet
