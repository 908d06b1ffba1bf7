// Expert parallelism on device memory (a communicator whose device_memory() is true: NCCL). The same
// exchange as forward_ep (moe_expert_parallel.cpp), but the hidden states never leave the device; the
// host sees only the routing (rows * top_k expert ids) and the per-rank item counts:
//   route on the device -> ids to the host -> the plan: per destination rank its pairs in pair order (the
//   send slot's source row, the expert's index on its owner, each pair's slot in the reply) -> the plan
//   uploaded -> gather_rows into the send buffer -> all-gather of the item counts -> all_to_all_v_device
//   of the rows and of the local expert ids -> the grouped experts over what arrived (top_k 1, weight 1:
//   0 + 1 * y is y) -> all_to_all_v_device back -> moe_combine on the device in top-k rank order.
// The combine and the experts are the single-rank kernels, so logits do not depend on ep_size.
#include <chrono>

#include "engine/runner/moe_layers.h"

namespace kvfleet {
namespace {

std::vector<std::size_t> times(std::vector<std::size_t> v, std::size_t factor) {
  for (std::size_t& x : v) x *= factor;
  return v;
}

}  // namespace

void MoeLayers::forward_ep_device(std::int64_t li, const float* d_x, std::int64_t rows, float* d_out) {
  const MoeConfig& m = config_.moe;
  const Layer& l = layers_[static_cast<std::size_t>(li)];
  const std::int64_t h = config_.hidden_size, k = m.top_k, pairs = rows * k;
  const auto ranks = static_cast<std::size_t>(ep_->size()), me = static_cast<std::size_t>(ep_->rank());
  const auto np = static_cast<std::size_t>(pairs);
  std::vector<std::int32_t> ids(np);
  if (rows > 0) {
    backend_.linear(d_x, rows, h, l.router, m.num_experts, {}, logits_);
    backend_.moe_route(logits_, rows, m.num_experts, k, m.norm_topk_prob, ids_, weights_);
    backend_.to_host(ids.data(), ids_, np * sizeof(std::int32_t));
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  // plan = [source row per send slot | local expert id per send slot | reply slot per pair]
  std::vector<std::int32_t> plan(3 * np);
  std::vector<std::int64_t> items(ranks, 0);
  std::int32_t slot = 0;
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t p = 0; p < np; ++p) {
      const std::int32_t e = ids[p];
      if (static_cast<std::size_t>(e / local_experts_) != r) continue;
      plan[static_cast<std::size_t>(slot)] = static_cast<std::int32_t>(p / static_cast<std::size_t>(k));
      plan[np + static_cast<std::size_t>(slot)] = e - static_cast<std::int32_t>(static_cast<std::int64_t>(r) * local_experts_);
      plan[2 * np + p] = slot++;
      ++items[r];
    }
  auto* d_plan = static_cast<std::int32_t*>(staging(4, plan.size() * sizeof(std::int32_t)));
  if (np) backend_.to_device(d_plan, plan.data(), plan.size() * sizeof(std::int32_t));
  const std::size_t row_bytes = static_cast<std::size_t>(h) * sizeof(float);
  auto* d_send = static_cast<float*>(staging(5, np * row_bytes));
  backend_.gather_rows(d_x, d_plan, pairs, h, d_send);

  std::vector<std::int64_t> matrix(ranks * ranks);  // matrix[src][dst]: items src sends dst
  ep_->all_gather(items.data(), ranks * sizeof(std::int64_t), matrix.data());
  std::vector<std::size_t> send_items(ranks), recv_items(ranks);
  std::size_t n = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    send_items[r] = static_cast<std::size_t>(items[r]);
    n += recv_items[r] = static_cast<std::size_t>(matrix[r * ranks + me]);
  }
  auto* d_rx = static_cast<float*>(staging(0, n * row_bytes));
  auto* d_rid = static_cast<std::int32_t*>(staging(1, n * sizeof(std::int32_t)));
  void* stream = backend_.stream_handle();
  ep_->all_to_all_v_device(d_send, times(send_items, row_bytes), d_rx, times(recv_items, row_bytes), stream);
  ep_->all_to_all_v_device(d_plan + np, times(send_items, sizeof(std::int32_t)), d_rid,
                           times(recv_items, sizeof(std::int32_t)), stream);
  const auto t1 = Clock::now();
  auto* d_y = static_cast<float*>(staging(3, n * row_bytes));
  if (n > 0) {
    auto* d_ones = static_cast<float*>(staging(2, n * sizeof(float)));
    const std::vector<float> ones(n, 1.0f);
    backend_.to_device(d_ones, ones.data(), n * sizeof(float));
    const auto f = static_cast<std::size_t>(first_expert_);
    const MoeExpertWeights experts{l.gate.data() + f, l.up.data() + f, l.down.data() + f, local_experts_,
                                   m.expert_intermediate};
    backend_.moe_experts(d_rx, static_cast<std::int64_t>(n), h, d_rid, d_ones, 1, experts, d_y,
                         counts_ + li * m.num_experts + first_expert_);
  }
  const auto t2 = Clock::now();  // on a GPU the experts run asynchronously: the wait lands in the reply
  auto* d_back = static_cast<float*>(staging(6, np * row_bytes));
  ep_->all_to_all_v_device(d_y, times(recv_items, row_bytes), d_back, times(send_items, row_bytes), stream);
  if (rows > 0) backend_.moe_combine(d_back, d_plan + 2 * np, weights_, rows, k, h, d_out);
  exchange_seconds_ += std::chrono::duration<double>(t1 - t0 + (Clock::now() - t2)).count();
}

}  // namespace kvfleet
