// What ucx/worker.cpp and ucx/pieces.cpp share inside engine/pd: an endpoint's state (worker thread).
#pragma once

#include <atomic>

#if KVFLEET_UCX
#include <ucp/api/ucp.h>
#endif

namespace kvfleet::pd {

#if KVFLEET_UCX
struct UcxEpState {
  ucp_ep_h ep = nullptr;  // worker thread only
  std::atomic<bool> broken{false};
};
#else
struct UcxEpState {};
#endif

}  // namespace kvfleet::pd
