// Expert parallelism inside one sparse layer (see moe_layers.h): route here, dispatch pairs to the ranks
// that own their experts, compute, send back, combine in top-k rank order.
#include <chrono>
#include <cstring>

#include "engine/runner/moe_layers.h"
#include "kernels/cpu/moe.h"

namespace kvfleet {

void* MoeLayers::staging(std::size_t which, std::size_t bytes) {
  if (ep_cap_[which] < bytes) {
    if (ep_buf_[which]) backend_.deallocate(ep_buf_[which]);
    ep_cap_[which] = std::max<std::size_t>(bytes, 2 * ep_cap_[which]);
    ep_buf_[which] = backend_.allocate(ep_cap_[which]);
  }
  return ep_buf_[which];
}

void MoeLayers::idle_step() {
  for (std::int64_t li = 0; li < config_.num_layers; ++li)
    if (sparse(li)) forward_ep(li, nullptr, 0, nullptr);
}

// y[i] = expert_{ids[i]}(x[i]) for the pairs this rank received (ids global, all owned here): the same
// grouped path as the single-rank case, with top_k 1 and weight 1 (0 + 1 * y is y, bit for bit).
void MoeLayers::experts_here(std::int64_t li, const std::vector<float>& x, const std::vector<std::int32_t>& ids,
                             std::vector<float>& y) {
  const MoeConfig& m = config_.moe;
  const Layer& l = layers_[static_cast<std::size_t>(li)];
  const auto n = static_cast<std::int64_t>(ids.size());
  const std::int64_t h = config_.hidden_size;
  y.assign(static_cast<std::size_t>(n * h), 0.0f);
  if (n == 0) return;
  std::vector<std::int32_t> local(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) local[i] = ids[i] - static_cast<std::int32_t>(first_expert_);
  const std::vector<float> ones(ids.size(), 1.0f);
  auto* dx = static_cast<float*>(staging(0, x.size() * sizeof(float)));
  auto* di = static_cast<std::int32_t*>(staging(1, local.size() * sizeof(std::int32_t)));
  auto* dw = static_cast<float*>(staging(2, ones.size() * sizeof(float)));
  auto* dy = static_cast<float*>(staging(3, y.size() * sizeof(float)));
  backend_.to_device(dx, x.data(), x.size() * sizeof(float));
  backend_.to_device(di, local.data(), local.size() * sizeof(std::int32_t));
  backend_.to_device(dw, ones.data(), ones.size() * sizeof(float));
  const auto f = static_cast<std::size_t>(first_expert_);
  const MoeExpertWeights experts{l.gate.data() + f, l.up.data() + f, l.down.data() + f, local_experts_,
                                 m.expert_intermediate};
  backend_.moe_experts(dx, n, h, di, dw, 1, experts, dy, counts_ + li * m.num_experts + first_expert_);
  backend_.to_host(y.data(), dy, y.size() * sizeof(float));
}

void MoeLayers::forward_ep(std::int64_t li, const float* d_x, std::int64_t rows, float* d_out) {
  if (ep_->device_memory()) return forward_ep_device(li, d_x, rows, d_out);
  const MoeConfig& m = config_.moe;
  const Layer& l = layers_[static_cast<std::size_t>(li)];
  const std::int64_t h = config_.hidden_size, k = m.top_k, pairs = rows * k;
  const int ranks = ep_->size();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(pairs));
  std::vector<float> w(static_cast<std::size_t>(pairs)), x(static_cast<std::size_t>(rows * h));
  if (rows > 0) {
    backend_.linear(d_x, rows, h, l.router, m.num_experts, {}, logits_);
    backend_.moe_route(logits_, rows, m.num_experts, k, m.norm_topk_prob, ids_, weights_);
    backend_.to_host(ids.data(), ids_, ids.size() * sizeof(std::int32_t));
    backend_.to_host(w.data(), weights_, w.size() * sizeof(float));
    backend_.to_host(x.data(), d_x, x.size() * sizeof(float));
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // Dispatch: per destination rank, its pairs in pair order, each as [expert id][hidden floats].
  const std::size_t item = sizeof(std::int32_t) + static_cast<std::size_t>(h) * sizeof(float);
  std::vector<std::size_t> send_bytes(static_cast<std::size_t>(ranks), 0);
  std::vector<std::uint8_t> send;
  send.reserve(static_cast<std::size_t>(pairs) * item);
  std::vector<std::int32_t> position(static_cast<std::size_t>(pairs));  // pair -> its slot in the reply
  std::int32_t slot = 0;
  for (int r = 0; r < ranks; ++r)
    for (std::int64_t p = 0; p < pairs; ++p) {
      const std::int32_t e = ids[static_cast<std::size_t>(p)];
      if (e / local_experts_ != r) continue;
      const auto* row = reinterpret_cast<const std::uint8_t*>(x.data() + (p / k) * h);
      send.insert(send.end(), reinterpret_cast<const std::uint8_t*>(&e), reinterpret_cast<const std::uint8_t*>(&e) + 4);
      send.insert(send.end(), row, row + h * static_cast<std::int64_t>(sizeof(float)));
      send_bytes[static_cast<std::size_t>(r)] += item;
      position[static_cast<std::size_t>(p)] = slot++;
    }
  std::vector<std::size_t> recv_bytes;
  const std::vector<std::uint8_t> recv = ep_->all_to_all_v(send.data(), send_bytes, recv_bytes);
  const std::size_t n = recv.size() / item;
  std::vector<std::int32_t> rid(n);
  std::vector<float> rx(n * static_cast<std::size_t>(h)), ry;
  for (std::size_t i = 0; i < n; ++i) {
    std::memcpy(&rid[i], recv.data() + i * item, 4);
    std::memcpy(rx.data() + i * static_cast<std::size_t>(h), recv.data() + i * item + 4, item - 4);
  }
  const auto t1 = Clock::now();
  experts_here(li, rx, rid, ry);
  const auto t2 = Clock::now();
  // Combine: the outputs go back to their sources in the order they came; ours arrive in dispatch order.
  std::vector<std::size_t> back_bytes(recv_bytes.size());
  for (std::size_t r = 0; r < recv_bytes.size(); ++r) back_bytes[r] = recv_bytes[r] / item * static_cast<std::size_t>(h) * sizeof(float);
  std::vector<std::size_t> got_bytes;
  const std::vector<std::uint8_t> back = ep_->all_to_all_v(ry.data(), back_bytes, got_bytes);
  if (rows > 0) {
    std::vector<float> out(static_cast<std::size_t>(rows * h));
    cpu::moe_combine(reinterpret_cast<const float*>(back.data()), position.data(), w.data(), rows, k, h, out.data());
    backend_.to_device(d_out, out.data(), out.size() * sizeof(float));
  }
  exchange_seconds_ += std::chrono::duration<double>(t1 - t0 + (Clock::now() - t2)).count();
}

}  // namespace kvfleet
