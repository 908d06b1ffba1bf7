#include "engine/pd/ucx/worker.h"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "engine/pd/pull_reader.h"
#include "engine/pd/ucx/state.h"
#include "kvfleet/http/async_queue.h"

#if KVFLEET_UCX
#include <netdb.h>
#include <sys/epoll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>
#endif

namespace kvfleet::pd {
using boost::asio::awaitable;

namespace {
struct OpResult {
  bool ok = false;
  std::string why;
};
using OpQueue = http::AsyncQueue<OpResult>;
}  // namespace

#if KVFLEET_UCX

namespace {

struct Listener {
  UcxWorker::Impl* impl = nullptr;
  ucp_listener_h handle = nullptr;
  // Creates the endpoint of a connection request (worker thread).
  std::function<bool(std::shared_ptr<UcxEpState>, ucp_ep_params_t*)> on_accept_raw;  // false: reject
};

// The per-operation context UCX hands back to the completion callback (freed there).
struct PendingOp {
  std::shared_ptr<OpQueue> done;
};

void finish_op(PendingOp* op, ucs_status_t status) {
  op->done->push(OpResult{status == UCS_OK, status == UCS_OK ? "" : ucs_status_string(status)});
  delete op;
}

void on_send(void* request, ucs_status_t status, void* user) {
  finish_op(static_cast<PendingOp*>(user), status);
  ucp_request_free(request);
}

void on_recv(void* request, ucs_status_t status, std::size_t, void* user) {
  finish_op(static_cast<PendingOp*>(user), status);
  ucp_request_free(request);
}

void on_ep_error(void* arg, ucp_ep_h, ucs_status_t) { static_cast<UcxEpState*>(arg)->broken = true; }

void free_request(void* request, ucs_status_t, void*) { ucp_request_free(request); }

bool resolve(const std::string& host, std::uint16_t port, sockaddr_storage& out, socklen_t& len) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (host.empty() ? AI_PASSIVE : 0);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return false;
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  freeaddrinfo(res);
  return true;
}

}  // namespace

struct UcxWorker::Impl {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int epoll_fd = -1;
  std::thread thread;
  std::mutex mu;
  std::deque<std::function<void()>> tasks;  // guarded by mu
  bool stop = false;                        // guarded by mu
  // Worker thread only: the endpoints not yet closed (an error callback's arg must stay valid) and the
  // listeners.
  std::unordered_set<std::shared_ptr<UcxEpState>> live;
  std::vector<std::unique_ptr<Listener>> listeners;

  void close_ep(const std::shared_ptr<UcxEpState>& s) {
    s->broken = true;
    if (!s->ep) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;  // pending operations complete now, with an error
    p.cb.send = free_request;
    const ucs_status_ptr_t r = ucp_ep_close_nbx(s->ep, &p);
    (void)r;  // a request is freed by its callback; an error needs nothing more
    s->ep = nullptr;
    live.erase(s);
  }

  void run() {
    for (;;) {
      std::deque<std::function<void()>> now;
      bool stopping = false;
      {
        std::lock_guard lock(mu);
        now.swap(tasks);
        stopping = stop;
      }
      for (auto& t : now) t();
      if (ucp_worker_progress(worker) != 0 || !now.empty()) continue;
      if (stopping) break;
      if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
      epoll_event ev{};
      epoll_wait(epoll_fd, &ev, 1, 100);  // woken by network events or ucp_worker_signal
    }
    while (!live.empty()) {
      const auto s = *live.begin();  // (a copy: erase must not get a reference into the set)
      close_ep(s);
    }
    for (auto& l : listeners) ucp_listener_destroy(l->handle);
    listeners.clear();
    for (int i = 0; i < 100; ++i) ucp_worker_progress(worker);  // the closes' callbacks
  }
};

namespace {

// Our defaults for UCX settings that the user's environment (UCX_<name>) does not set (engine/pd/README.md,
// "Transports" and "Throughput"): bigger tcp segments mean fewer sends, receives and progress rounds per
// byte (8 KiB segments measured clearly worse; 256 KiB against UCX's 64 KiB is below the loaded VM's noise).
// Each entry: the user's variable (UCX_ + the first name) and the name ucp_config_modify takes for it.
// UCX 1.13 hands a name it does not know itself on to each transport's table WITHOUT the table's prefix
// ("TCP_"), so "TCP_TX_SEG_SIZE" matched nothing there and was never applied (UCX warned "invalid
// configurations: TCP_TX_SEG_SIZE=256k" and kept 64 KiB segments; strace showed 65541-byte sendmsg).
struct UcxDefault {
  const char* env;   // after UCX_
  const char* name;  // as ucp_config_modify takes it
  const char* value;
};
// MAX_IOV: P sends a piece (a frame's header, its 16 layer halves from the cache, its trailer, ...) as one
// iov; with UCX's 6 entries per zero-copy send a 256 KiB segment went out in 1-4 sendmsg calls (strace:
// 262149, 196717, 65565 bytes), with 16 each segment is one call (512 instead of about 1270 per 128 MiB).
// (UCX 1.13 asserts at 30 and more: `(max_iov + 1) * sizeof(uct_iov_t) <= 1200`.)
constexpr UcxDefault kUcxDefaults[] = {
    {"TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "256k"},
    {"TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "256k"},
    {"TCP_MAX_IOV", "MAX_IOV", "16"},
};

// The UCP configuration: UCX's own reading of the environment, then our defaults where it says nothing.
ucp_config_t* read_config(std::string& error) {
  ucp_config_t* config = nullptr;
  const ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    error = std::string("ucp_config_read: ") + ucs_status_string(st);
    return nullptr;
  }
  for (const UcxDefault& d : kUcxDefaults) {
    if (std::getenv((std::string("UCX_") + d.env).c_str())) continue;  // the user's setting wins
    const ucs_status_t m = ucp_config_modify(config, d.name, d.value);
    if (m != UCS_OK) std::fprintf(stderr, "kvfleet: UCX setting %s=%s not applied: %s\n", d.env, d.value, ucs_status_string(m));
  }
  return config;
}

}  // namespace

std::shared_ptr<UcxWorker> UcxWorker::create(std::string& error) {
  auto impl = std::make_unique<Impl>();
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
  ucp_config_t* config = read_config(error);
  if (!config) return nullptr;
  ucs_status_t st = ucp_init(&params, config, &impl->context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    error = std::string("ucp_init: ") + ucs_status_string(st);
    return nullptr;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(impl->context, &wp, &impl->worker);
  int efd = -1;
  if (st == UCS_OK) st = ucp_worker_get_efd(impl->worker, &efd);
  if (st != UCS_OK) {
    error = std::string("ucp_worker: ") + ucs_status_string(st);
    if (impl->worker) ucp_worker_destroy(impl->worker);
    ucp_cleanup(impl->context);
    return nullptr;
  }
  impl->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, efd, &ev);
  std::shared_ptr<UcxWorker> w(new UcxWorker());
  w->impl_ = std::move(impl);
  w->impl_->thread = std::thread([i = w->impl_.get()] { i->run(); });
  return w;
}

UcxWorker::~UcxWorker() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  ucp_worker_signal(impl_->worker);
  impl_->thread.join();
  ucp_worker_destroy(impl_->worker);
  ucp_cleanup(impl_->context);
  close(impl_->epoll_fd);
}

void UcxWorker::post(std::function<void()> task) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->tasks.push_back(std::move(task));
  }
  ucp_worker_signal(impl_->worker);
}

std::shared_ptr<UcxEndpoint> UcxWorker::connect(const std::string& host, std::uint16_t port) {
  auto state = std::make_shared<UcxEpState>();
  post([impl = impl_.get(), state, host, port] {
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (!resolve(host, port, addr, len)) {
      state->broken = true;
      return;
    }
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    p.sockaddr.addrlen = len;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = on_ep_error;
    p.err_handler.arg = state.get();
    if (ucp_ep_create(impl->worker, &p, &state->ep) != UCS_OK) {
      state->ep = nullptr;
      state->broken = true;
      return;
    }
    impl->live.insert(state);
  });
  return std::make_shared<UcxEndpoint>(shared_from_this(), std::move(state));
}


std::uint16_t UcxWorker::listen(const std::string& host, std::uint16_t port,
                                std::function<void(std::shared_ptr<UcxEndpoint>)> on_accept) {
  std::promise<std::uint16_t> bound;
  auto result = bound.get_future();
  // The listener's connection callback creates the endpoint on the worker thread, registers it and
  // hands a UcxEndpoint to on_accept. (A weak reference: the listener lives inside the worker.)
  auto accept = [impl = impl_.get(), weak = weak_from_this(), on_accept = std::move(on_accept)](
                    std::shared_ptr<UcxEpState> state, ucp_ep_params_t* params) {
    auto self = weak.lock();
    if (!self) return false;  // the worker is going away
    if (ucp_ep_create(impl->worker, params, &state->ep) != UCS_OK) return true;
    impl->live.insert(state);
    on_accept(std::make_shared<UcxEndpoint>(std::move(self), std::move(state)));
    return true;
  };
  post([impl = impl_.get(), host, port, accept = std::move(accept), &bound]() mutable {
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (!resolve(host, port, addr, len)) {
      bound.set_exception(std::make_exception_ptr(std::runtime_error("cannot resolve '" + host + "'")));
      return;
    }
    auto l = std::make_unique<Listener>();
    l->impl = impl;
    ucp_listener_params_t p{};
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    p.sockaddr.addrlen = len;
    p.conn_handler.cb = [](ucp_conn_request_h request, void* arg) {
      auto* l = static_cast<Listener*>(arg);
      auto state = std::make_shared<UcxEpState>();
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.conn_request = request;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = on_ep_error;
      ep.err_handler.arg = state.get();
      if (!l->on_accept_raw(std::move(state), &ep)) ucp_listener_reject(l->handle, request);
    };
    p.conn_handler.arg = l.get();
    l->on_accept_raw = std::move(accept);
    const ucs_status_t st = ucp_listener_create(impl->worker, &p, &l->handle);
    if (st != UCS_OK) {
      bound.set_exception(std::make_exception_ptr(std::runtime_error(std::string("ucp_listener_create: ") + ucs_status_string(st))));
      return;
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    std::uint16_t got = port;
    if (ucp_listener_query(l->handle, &attr) == UCS_OK)
      got = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
    impl->listeners.push_back(std::move(l));
    bound.set_value(got);
  });
  return result.get();
}

void UcxEndpoint::close() { close_by_force(worker_, state_); }

awaitable<void> UcxEndpoint::run(Op op, char* buffer, std::size_t n, Clock::time_point deadline) {
  const auto ex = co_await boost::asio::this_coro::executor;
  auto done = std::make_shared<OpQueue>(ex);
  worker_->post([s = state_, done, op, buffer, n] {
    if (!s->ep || s->broken) {
      done->push(OpResult{false, "endpoint closed"});
      return;
    }
    auto* pending = new PendingOp{done};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.user_data = pending;
    ucs_status_ptr_t r;
    if (op == Op::send || op == Op::send_iov) {
      p.cb.send = on_send;
      if (op == Op::send_iov) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        p.datatype = ucp_dt_make_iov();
      }
      r = ucp_stream_send_nbx(s->ep, buffer, n, &p);
    } else {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
      p.cb.recv_stream = on_recv;
      std::size_t got = 0;
      r = ucp_stream_recv_nbx(s->ep, buffer, n, &got, &p);
    }
    if (r == nullptr) finish_op(pending, UCS_OK);
    else if (UCS_PTR_IS_ERR(r)) finish_op(pending, UCS_PTR_STATUS(r));
    // else: in flight; on_send / on_recv complete it (a forced close completes it with an error)
  });
  auto expired = std::make_shared<std::atomic<bool>>(false);
  boost::asio::steady_timer timer(ex);
  timer.expires_at(deadline);
  timer.async_wait([expired, s = state_, w = worker_](const boost::system::error_code& ec) {
    if (ec) return;
    *expired = true;
    close_by_force(w, s);
  });
  const std::optional<OpResult> result = co_await done->pop();  // always comes: completion or forced close
  timer.cancel();
  if (*expired) throw PdFailure("timeout", "UCX: no progress before the deadline");
  if (!result || !result->ok) {
    state_->broken = true;
    throw PdFailure("peer_closed", "UCX: " + (result ? result->why : std::string("no answer")));
  }
}

void UcxEndpoint::close_by_force(const std::shared_ptr<UcxWorker>& w, const std::shared_ptr<UcxEpState>& s) {
  s->broken = true;
  w->post([impl = w->impl_.get(), s] { impl->close_ep(s); });
}

#else  // no UCX in this build

struct UcxWorker::Impl {};
void UcxEndpoint::close_by_force(const std::shared_ptr<UcxWorker>&, const std::shared_ptr<UcxEpState>&) {}

std::shared_ptr<UcxWorker> UcxWorker::create(std::string& error) {
  error = "this build has no UCX (libucx-dev was not found at configure time)";
  return nullptr;
}
UcxWorker::~UcxWorker() = default;
void UcxWorker::post(std::function<void()>) {}
std::shared_ptr<UcxEndpoint> UcxWorker::connect(const std::string&, std::uint16_t) { return nullptr; }
std::uint16_t UcxWorker::listen(const std::string&, std::uint16_t, std::function<void(std::shared_ptr<UcxEndpoint>)>) {
  throw std::runtime_error("this build has no UCX");
}
void UcxEndpoint::close() {}
awaitable<void> UcxEndpoint::run(Op, char*, std::size_t, Clock::time_point) {
  throw PdFailure("connect", "this build has no UCX");
  co_return;
}

#endif

UcxEndpoint::UcxEndpoint(std::shared_ptr<UcxWorker> worker, std::shared_ptr<UcxEpState> state)
    : worker_(std::move(worker)), state_(std::move(state)) {}

UcxEndpoint::~UcxEndpoint() {
  if (worker_) close();
}

bool UcxEndpoint::broken() const {
#if KVFLEET_UCX
  return state_->broken;
#else
  return true;
#endif
}

awaitable<void> UcxEndpoint::send(std::string_view bytes, Clock::time_point deadline) {
  co_await run(Op::send, const_cast<char*>(bytes.data()), bytes.size(), deadline);
}

awaitable<void> UcxEndpoint::send_gather(std::span<const std::string_view> pieces, Clock::time_point deadline) {
#if KVFLEET_UCX
  std::vector<ucp_dt_iov_t> iov;  // lives in this frame until the operation completed (run awaits it)
  iov.reserve(pieces.size());
  for (const std::string_view p : pieces)
    if (!p.empty()) iov.push_back(ucp_dt_iov_t{const_cast<char*>(p.data()), p.size()});
  if (iov.empty()) co_return;
  co_await run(Op::send_iov, reinterpret_cast<char*>(iov.data()), iov.size(), deadline);
#else
  (void)pieces;
  co_await run(Op::send, nullptr, 0, deadline);
#endif
}

awaitable<void> UcxEndpoint::recv(char* into, std::size_t n, Clock::time_point deadline) {
  co_await run(Op::recv, into, n, deadline);
}

}  // namespace kvfleet::pd
