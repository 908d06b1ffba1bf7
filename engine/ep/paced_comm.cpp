// The paced communicators of a group of processes (ep/paced_comm.h).
#include "engine/ep/paced_comm.h"

#include "engine/ep/channel.h"

namespace kvfleet::ep {

template <class F>
auto PacedCommunicator::watched(F&& f) {
  try {
    return f();
  } catch (const CommunicatorError& e) {
    if (broken_) broken_(e.what());
    throw;
  }
}

std::vector<std::uint8_t> PacedCommunicator::all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                                          std::vector<std::size_t>& recv_bytes) {
  return watched([&] { return inner_.all_to_all_v(send, send_bytes, recv_bytes); });
}

void PacedCommunicator::all_to_all_v_device(const void* d_send, const std::vector<std::size_t>& send_bytes, void* d_recv,
                                            const std::vector<std::size_t>& recv_bytes, void* stream) {
  watched([&] { inner_.all_to_all_v_device(d_send, send_bytes, d_recv, recv_bytes, stream); });
}

void PacedCommunicator::barrier() {
  watched([&] { inner_.barrier(); });
}

void PacedCommunicator::set_ring_handler(std::function<void()> handler) {
  std::lock_guard lock(handler_mu_);
  handler_ = std::move(handler);
}

void PacedCommunicator::call_ring_handler() {
  std::lock_guard lock(handler_mu_);
  if (handler_) handler_();
}

void PacedCommunicator::shutdown(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (down_.empty()) down_ = why;
  }
  cv_.notify_all();
  call_ring_handler();  // an engine asleep in an idle group wakes and finds the collective failing
}

void PacedCommunicator::check_down(std::unique_lock<std::mutex>&) const {
  if (!down_.empty()) throw CommunicatorError(down_);
}

FrontCommunicator::FrontCommunicator(Communicator& inner, std::function<void(const std::string&)> broken)
    : PacedCommunicator(inner) {
  broken_ = std::move(broken);
}

void FrontCommunicator::attach(const std::vector<TicketLink*>& remotes) {
  {
    std::lock_guard lock(mu_);
    remotes_ = remotes;
    attached_ = true;
  }
  cv_.notify_all();
  for (TicketLink* r : remotes) r->on_ring([this] { call_ring_handler(); });
}

void FrontCommunicator::all_gather(const void* send, std::size_t bytes, void* recv) {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return attached_ || !down_.empty(); });
    check_down(lock);
    for (TicketLink* r : remotes_) r->send_vote();
  }
  watched([&] { inner_.all_gather(send, bytes, recv); });
}

void WorkerCommunicator::attach(Channel* channel) {
  std::lock_guard lock(mu_);
  channel_ = channel;
}

void WorkerCommunicator::ticket() {
  {
    std::lock_guard lock(mu_);
    ++tickets_;
  }
  cv_.notify_all();
  call_ring_handler();
}

void WorkerCommunicator::all_gather(const void* send, std::size_t bytes, void* recv) {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return tickets_ > 0 || !down_.empty(); });  // no deadline: rank 0 decides when
    check_down(lock);
    --tickets_;
  }
  inner_.all_gather(send, bytes, recv);
}

bool WorkerCommunicator::vote_requested() const {
  std::lock_guard lock(mu_);
  return tickets_ > 0 || !down_.empty();
}

void WorkerCommunicator::ring() {
  std::lock_guard lock(mu_);
  if (channel_) channel_->send(Message{{"t", "ring"}});
}

}  // namespace kvfleet::ep
