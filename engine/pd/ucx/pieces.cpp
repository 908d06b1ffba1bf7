// UcxEndpoint::receive_pieces: D's receive of a pull's answer ahead of its reader (ucx/worker.h), on the
// worker thread: the receive of a piece's bytes, at their place in the pull's buffer, and of the next
// length are posted back to back, and the next pair from the completion of that length, so a receive is
// always posted while the answer arrives. (UCX's stream API copies data that arrives with no receive posted
// into a buffer of its own and later again into the receive: half of the UCX memcpy samples on D before.)
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <memory>
#include <mutex>
#include <string>

#include "engine/pd/pull_reader.h"
#include "engine/pd/ucx/state.h"
#include "engine/pd/ucx/worker.h"
#include "kvfleet/http/async_queue.h"

namespace kvfleet::pd {
using boost::asio::awaitable;

#if KVFLEET_UCX

struct PieceReceive {
  // Any thread, under mu: what came so far, and the reader's wake-up (null once the reader detached).
  std::mutex mu;
  PieceProgress progress;
  bool timed_out = false;
  std::shared_ptr<http::AsyncQueue<int>> wake;
  // Worker thread only.
  std::shared_ptr<UcxEpState> s;
  std::shared_ptr<void> keep;  // the memory's owner, while a receive is posted
  char* base = nullptr;
  std::size_t capacity = 0, received = 0;
  std::size_t posted_end = 0;  // where the bytes of the receives posted so far end
  int outstanding = 0;     // receives posted and not completed
  bool ended = false;
  std::uint64_t next = 0;  // the length of the next piece, as received

  void report() {
    std::lock_guard lock(mu);
    progress.received = received;
    if (wake) wake->push(0);
  }
  // Done (the closing length came) or failed; the first call counts.
  void end(bool done, const char* reason = "", std::string why = {}) {
    if (ended) return;
    ended = true;
    if (outstanding == 0) keep.reset();  // (else the last completion lets it go)
    std::lock_guard lock(mu);
    progress.received = received;
    progress.done = done;
    if (*reason) {
      progress.reason = timed_out ? "timeout" : reason;
      progress.why = timed_out ? "UCX: no progress before the deadline" : std::move(why);
    }
    if (wake) wake->push(0);
  }
};

namespace {

void on_piece(void* request, ucs_status_t status, std::size_t, void* user);

// One posted receive of a PieceReceive: a piece's bytes (`bytes` of them, at base + at) or the next length.
struct PieceOp {
  std::shared_ptr<PieceReceive> r;
  std::size_t bytes = 0;  // 0: the length
  std::size_t at = 0;
};

// A receive of `op` completed (worker thread). True when the next length came and another piece follows.
bool piece_arrived(PieceReceive& r, const PieceOp& op) {
  if (op.bytes > 0) {
    r.received = op.at + op.bytes;
    r.report();  // the reader may check these bytes while the rest comes
    return false;
  }
  if (r.next == 0) {
    r.end(true);
    return false;
  }
  if (r.next > r.capacity - r.posted_end) {
    r.end(false, "malformed", "UCX piece of " + std::to_string(r.next) + " bytes after " + std::to_string(r.posted_end) +
                                  " does not fit the pull's buffer");
    return false;
  }
  return true;
}

// Posts one receive; true when it completed at once (UCX then calls no callback).
bool post_one(PieceOp* op, bool& failed) {
  PieceReceive& r = *op->r;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
  p.cb.recv_stream = on_piece;
  p.user_data = op;
  std::size_t got = 0;
  void* into = op->bytes > 0 ? static_cast<void*>(r.base + op->at) : static_cast<void*>(&r.next);
  const ucs_status_ptr_t req = ucp_stream_recv_nbx(r.s->ep, into, op->bytes > 0 ? op->bytes : sizeof r.next, &got, &p);
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
    ++r.outstanding;
    return false;
  }
  if (UCS_PTR_IS_ERR(req)) {
    failed = true;
    r.end(false, "peer_closed", std::string("UCX: ") + ucs_status_string(UCS_PTR_STATUS(req)));
  }
  return true;
}

// Posts the receive of the next `n` payload bytes (none for the first length) and of the length after them,
// back to back (UCX fills a stream's receives in the order posted), so a receive is always posted while
// the answer comes; loops over receives that complete at once. Worker thread, also from on_piece.
void post_piece(const std::shared_ptr<PieceReceive>& r, std::size_t n) {
  for (;;) {
    if (r->ended) return;
    if (!r->s->ep || r->s->broken) {
      r->end(false, "peer_closed", "UCX: endpoint closed");
      return;
    }
    bool failed = false;
    if (n > 0) {
      auto data = std::make_unique<PieceOp>(PieceOp{r, n, r->posted_end});
      r->posted_end += n;
      if (post_one(data.get(), failed)) {
        if (failed) return;
        piece_arrived(*r, *data);
      } else {
        data.release();  // on_piece owns it now
      }
    }
    auto length = std::make_unique<PieceOp>(PieceOp{r, 0, 0});
    if (!post_one(length.get(), failed)) {
      length.release();
      return;  // in flight: on_piece goes on
    }
    if (failed || !piece_arrived(*r, *length)) return;
    n = static_cast<std::size_t>(r->next);
  }
}

void on_piece(void* request, ucs_status_t status, std::size_t, void* user) {
  const std::unique_ptr<PieceOp> op(static_cast<PieceOp*>(user));
  ucp_request_free(request);
  PieceReceive& r = *op->r;
  --r.outstanding;
  if (status != UCS_OK) r.end(false, "peer_closed", std::string("UCX: ") + ucs_status_string(status));
  else if (!r.ended && piece_arrived(r, *op)) post_piece(op->r, static_cast<std::size_t>(r.next));
  if (r.ended && r.outstanding == 0) r.keep.reset();  // no receive posted any more: the memory may go
}

}  // namespace

awaitable<std::shared_ptr<PieceReceive>> UcxEndpoint::receive_pieces(char* base, std::size_t capacity,
                                                                    std::shared_ptr<void> keep) {
  auto r = std::make_shared<PieceReceive>();
  r->wake = std::make_shared<http::AsyncQueue<int>>(co_await boost::asio::this_coro::executor);
  r->s = state_;
  r->keep = std::move(keep);
  r->base = base;
  r->capacity = capacity;
  worker_->post([r] { post_piece(r, 0); });
  co_return r;
}

awaitable<PieceProgress> UcxEndpoint::wait_pieces(std::shared_ptr<PieceReceive> r, std::size_t seen,
                                                  Clock::time_point deadline) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  timer.expires_at(deadline);
  timer.async_wait([r, s = state_, w = worker_](const boost::system::error_code& ec) {
    if (ec) return;
    {
      std::lock_guard lock(r->mu);
      r->timed_out = true;
    }
    close_by_force(w, s);  // ends r's posted receive with an error
  });
  std::shared_ptr<http::AsyncQueue<int>> wake;
  PieceProgress now;
  for (;;) {
    {
      std::lock_guard lock(r->mu);
      now = r->progress;
      wake = r->wake;
    }
    if (now.received > seen || now.done || !now.reason.empty()) break;
    if (!wake) {  // (detached: only its reader's end does that, never while it waits)
      now.reason = "error", now.why = "UCX: the receive ahead has no reader";
      break;
    }
    co_await wake->pop();  // a report always follows: the next piece, the end, or the forced close
  }
  timer.cancel();
  co_return now;
}

void UcxEndpoint::detach(PieceReceive& r) {
  std::shared_ptr<http::AsyncQueue<int>> gone;
  std::lock_guard lock(r.mu);
  gone = std::move(r.wake);  // (destroyed after the lock is released: declared first)
}

#else  // no UCX in this build

struct PieceReceive {};

awaitable<std::shared_ptr<PieceReceive>> UcxEndpoint::receive_pieces(char*, std::size_t, std::shared_ptr<void>) {
  throw PdFailure("connect", "this build has no UCX");
  co_return nullptr;
}
awaitable<PieceProgress> UcxEndpoint::wait_pieces(std::shared_ptr<PieceReceive>, std::size_t, Clock::time_point) {
  throw PdFailure("connect", "this build has no UCX");
  co_return PieceProgress{};
}
void UcxEndpoint::detach(PieceReceive&) {}

#endif

}  // namespace kvfleet::pd
