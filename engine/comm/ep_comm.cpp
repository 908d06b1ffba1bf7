// What every Communicator shares: the host-memory default of the device exchange, and the choice of a
// process rank's communicator (--ep-comm gloo|nccl|auto).
#include <cstring>
#include <stdexcept>

#include "kvfleet/backend.h"
#include "kvfleet/communicator.h"

#ifdef KVFLEET_HAVE_CUDA
#include "kernels/cuda/device_info.h"
#endif

namespace kvfleet {

// "Device" memory the host can address (the CPU backend): the host exchange, then one copy. A caller
// whose recv_bytes disagree with what arrived has a bug in its count exchange: say so, never write past.
void Communicator::all_to_all_v_device(const void* d_send, const std::vector<std::size_t>& send_bytes, void* d_recv,
                                       const std::vector<std::size_t>& recv_bytes, void* /*stream*/) {
  if (static_cast<int>(recv_bytes.size()) != size())
    throw std::invalid_argument("all_to_all_v_device: one receive count per rank expected");
  std::vector<std::size_t> got;
  const std::vector<std::uint8_t> data = all_to_all_v(d_send, send_bytes, got);
  if (got != recv_bytes)
    throw std::logic_error("all_to_all_v_device: the pieces that arrived differ from the expected receive counts");
  if (!data.empty()) std::memcpy(d_recv, data.data(), data.size());
}

std::string resolve_ep_comm(const EpCommOptions& o) {
  check_ep_comm(o);
  if (o.kind == "nccl" && !nccl_available())
    throw std::invalid_argument("--ep-comm nccl: this build has no NCCL (configure with KVFLEET_CUDA on where nccl.h "
                                "and libnccl are found); use --ep-comm gloo or auto");
  if (o.kind == "gloo" || o.kind == "nccl") return o.kind;
  bool cuda_rank = o.backend_kind == "cuda";
#ifdef KVFLEET_HAVE_CUDA
  if (o.backend_kind == "auto") cuda_rank = cuda_device_count() > 0;  // make_backend's own choice
#endif
  return cuda_rank && nccl_available() ? "nccl" : "gloo";  // a build without NCCL stages CUDA ranks over Gloo
}

std::unique_ptr<Communicator> make_ep_communicator(const EpCommOptions& o) {
  if (resolve_ep_comm(o) == "nccl") {
    NcclOptions n;
    n.rank = o.rank;
    n.size = o.size;
    n.master = o.master;
    n.device = o.device;
    n.timeout = o.timeout;
    n.join_timeout = o.join_timeout;
    return make_nccl_communicator(n);
  }
  GlooOptions g;
  g.rank = o.rank;
  g.size = o.size;
  g.master = o.master;
  g.bind_host = o.bind_host;
  g.timeout = o.timeout;
  g.join_timeout = o.join_timeout;
  return make_gloo_communicator(g);
}

std::unique_ptr<Communicator> make_ep_communicator(EpCommOptions o, BackendOptions& backend) {
  o.backend_kind = backend.kind;
  if (resolve_ep_comm(o) == "nccl") {
    if (o.device < 0) o.device = nccl_default_device(o.rank);
    if (o.device >= 0) backend.device = o.device;  // the backend computes on the GPU NCCL exchanges from
  }
  return make_ep_communicator(o);
}

}  // namespace kvfleet
