// The expert-parallel request channel (ep/channel.h): framed JSON over one TCP connection, a reader and a
// writer thread, heartbeats both ways. Plain POSIX sockets: poll() gives the reader its deadline.
#include "engine/ep/channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace kvfleet::ep {
namespace json = boost::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint32_t kMaxFrame = 64u << 20;

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

sockaddr_in resolve(const std::string& host, unsigned short port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string h = host.empty() ? "0.0.0.0" : host;
  if (const int rc = ::getaddrinfo(h.c_str(), nullptr, &hints, &res); rc != 0 || !res)
    throw std::runtime_error("cannot resolve " + h + ": " + ::gai_strerror(rc));
  sockaddr_in a = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  a.sin_port = htons(port);
  return a;
}

// Waits until fd is readable (events POLLIN) or writable; false on timeout.
bool wait_fd(int fd, short events, int ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int rc = ::poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0;
  }
}

bool write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace

Channel::Channel(int fd, std::chrono::milliseconds timeout, Handler on_message, Closed on_closed)
    : fd_(fd), timeout_(timeout),
      heartbeat_(std::clamp<std::chrono::milliseconds>(timeout / 4, std::chrono::milliseconds(5), std::chrono::milliseconds(250))),
      on_message_(std::move(on_message)), on_closed_(std::move(on_closed)) {
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small frames: no Nagle delay
}

Channel::~Channel() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  ::shutdown(fd_, SHUT_RDWR);
  cv_.notify_all();
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  ::close(fd_);
}

void Channel::start() {
  reader_ = std::thread([this] { read_loop(); });
  writer_ = std::thread([this] { write_loop(); });
}

bool Channel::closed() const {
  std::lock_guard lock(mu_);
  return ended_ || closing_;
}

void Channel::send(Message message) {
  const std::string body = json::serialize(message);
  std::string frame(4, '\0');
  const auto n = static_cast<std::uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  frame += body;
  {
    std::lock_guard lock(mu_);
    if (ended_ || closing_) return;
    queue_.push_back(std::move(frame));
  }
  cv_.notify_one();
}

void Channel::end(const std::string& why) {
  bool report = false;
  {
    std::lock_guard lock(mu_);
    report = !ended_ && !closing_;
    ended_ = true;
  }
  ::shutdown(fd_, SHUT_RDWR);  // the other thread sees it at once
  cv_.notify_all();
  if (report && on_closed_) on_closed_(why);
}

void Channel::write_loop() {
  auto last = Clock::now();
  for (;;) {
    std::string frame;
    {
      std::unique_lock lock(mu_);
      cv_.wait_until(lock, last + heartbeat_, [&] { return ended_ || closing_ || !queue_.empty(); });
      if (ended_ || closing_) return;
      if (!queue_.empty()) {
        frame = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (frame.empty()) frame = std::string("\x0c\0\0\0{\"t\":\"ping\"}", 16);
    if (!write_all(fd_, frame.data(), frame.size())) return end("the connection broke while sending");
    last = Clock::now();
  }
}

void Channel::read_loop() {
  std::string buf;
  std::size_t used = 0;
  auto last = Clock::now();
  char chunk[65536];
  for (;;) {
    if (closed()) return;
    const auto left = last + timeout_ - Clock::now();
    if (left <= Clock::duration::zero())
      return end("it sent nothing for " + std::to_string(timeout_.count()) + " ms (stopped or unreachable)");
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    if (!wait_fd(fd_, POLLIN, static_cast<int>(std::min<std::int64_t>(wait_ms, 100)))) continue;
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return end("its connection closed (the process exited)");
    if (n < 0 && errno == ECONNRESET) return end("its connection was reset (the process exited)");
    if (n < 0) return end(sys_error("its connection failed"));
    last = Clock::now();
    buf.append(chunk, static_cast<std::size_t>(n));
    while (buf.size() - used >= 4) {
      const auto* p = reinterpret_cast<const unsigned char*>(buf.data() + used);
      const std::uint32_t len = std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
      if (len > kMaxFrame) return end("it sent a frame of " + std::to_string(len) + " bytes");
      if (buf.size() - used < 4 + std::size_t{len}) break;
      boost::system::error_code ec;
      json::value v = json::parse(std::string_view(buf.data() + used + 4, len), ec);
      used += 4 + std::size_t{len};
      if (ec || !v.is_object()) return end("it sent a frame that is not a JSON object");
      auto& m = v.as_object();
      const auto* t = m.if_contains("t");
      if (t && t->is_string() && t->as_string() == "ping") continue;
      try {
        on_message_(m);
      } catch (const std::exception& e) {
        return end(std::string("it sent a message this rank cannot use: ") + e.what());
      }
    }
    if (used == buf.size()) buf.clear(), used = 0;
    else if (used > (1u << 20)) buf.erase(0, used), used = 0;
  }
}

int listen_tcp(const std::string& host, unsigned short& port) {
  sockaddr_in a = resolve(host, port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(sys_error("socket"));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 4) != 0) {
    const std::string err = sys_error("cannot listen on " + host + ":" + std::to_string(port));
    ::close(fd);
    throw std::runtime_error(err);
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

int accept_tcp(int listen_fd, std::chrono::milliseconds timeout) {
  if (!wait_fd(listen_fd, POLLIN, static_cast<int>(timeout.count())))
    throw std::runtime_error("rank 0 did not connect within " + std::to_string(timeout.count()) + " ms");
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) throw std::runtime_error(sys_error("accept"));
  return fd;
}

int connect_tcp(const std::string& host, unsigned short port, std::chrono::milliseconds timeout) {
  const sockaddr_in a = resolve(host, port);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(sys_error("socket"));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return fd;
    const std::string err = sys_error("cannot connect to " + host + ":" + std::to_string(port));
    ::close(fd);
    if (Clock::now() >= deadline) throw std::runtime_error(err);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string reachable_address(const std::string& bind, const std::string& master_host) {
  if (!bind.empty()) return bind;
  if (master_host.rfind("127.", 0) == 0 || master_host == "localhost") return "127.0.0.1";
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "127.0.0.1";
  const sockaddr_in a = resolve(name, 0);
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
  return text;
}

}  // namespace kvfleet::ep
