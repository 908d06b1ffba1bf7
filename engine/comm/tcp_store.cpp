// The rendezvous store (tcp_store.h). The server is one Asio thread with a session per connection; the
// client is synchronous with socket-level send/receive timeouts, so a server that stops answering fails
// the call instead of hanging it.
#include "engine/comm/tcp_store.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "kvfleet/communicator.h"

namespace kvfleet::comm {
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr std::uint32_t kMaxKey = 4096;
constexpr std::uint32_t kMaxValue = 1 << 20;

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint32_t get_u32(const unsigned char* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}

using Table = std::map<std::string, std::vector<char>>;

// One connection: reads a request, answers it, reads the next. Any malformed request ends the session.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket s, Table& table, std::mutex& mu) : socket_(std::move(s)), table_(table), mu_(mu) {}
  void start() { read_head(); }

 private:
  void read_head() {
    asio::async_read(socket_, asio::buffer(head_, 5), [self = shared_from_this()](auto ec, std::size_t) {
      if (ec) return;
      const std::uint32_t n = get_u32(self->head_ + 1);
      if ((self->head_[0] != 'S' && self->head_[0] != 'G') || n > kMaxKey) return;
      self->key_.resize(n);
      asio::async_read(self->socket_, asio::buffer(self->key_), [self](auto ec2, std::size_t) {
        if (ec2) return;
        if (self->head_[0] == 'G') return self->answer_get();
        self->read_value();
      });
    });
  }
  void read_value() {
    asio::async_read(socket_, asio::buffer(len_, 4), [self = shared_from_this()](auto ec, std::size_t) {
      if (ec) return;
      const std::uint32_t n = get_u32(self->len_);
      if (n > kMaxValue) return;
      self->value_.resize(n);
      asio::async_read(self->socket_, asio::buffer(self->value_), [self](auto ec2, std::size_t) {
        if (ec2) return;
        {
          std::lock_guard lock(self->mu_);
          self->table_[self->key_] = self->value_;
        }
        self->reply(std::string(1, '\1'));
      });
    });
  }
  void answer_get() {
    std::string out;
    {
      std::lock_guard lock(mu_);
      const auto it = table_.find(key_);
      if (it == table_.end()) {
        out.push_back('\0');
      } else {
        out.push_back('\1');
        put_u32(out, static_cast<std::uint32_t>(it->second.size()));
        out.append(it->second.data(), it->second.size());
      }
    }
    reply(std::move(out));
  }
  void reply(std::string bytes) {
    out_ = std::move(bytes);
    asio::async_write(socket_, asio::buffer(out_), [self = shared_from_this()](auto ec, std::size_t) {
      if (!ec) self->read_head();
    });
  }

  tcp::socket socket_;
  Table& table_;
  std::mutex& mu_;
  unsigned char head_[5]{};
  unsigned char len_[4]{};
  std::string key_, out_;
  std::vector<char> value_;
};

void set_timeouts(tcp::socket& s, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

}  // namespace

std::pair<std::string, unsigned short> parse_host_port(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw std::invalid_argument("expected HOST:PORT, got \"" + text + "\"");
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    std::size_t used = 0;
    port = std::stoi(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 1 || port > 65535) throw std::invalid_argument("bad port in \"" + text + "\"");
  return {host, static_cast<unsigned short>(port)};
}

struct TcpStoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  Table table;
  std::mutex mu;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;  // closed: shutting down
      std::make_shared<Session>(std::move(s), table, mu)->start();
      accept();
    });
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, unsigned short port) : impl_(std::make_unique<Impl>()) {
  boost::system::error_code numeric;
  const auto address = asio::ip::make_address(host, numeric);
  const tcp::endpoint ep = !numeric ? tcp::endpoint(address, port)
                                    : *tcp::resolver(impl_->io).resolve(host, std::to_string(port)).begin();
  impl_->acceptor.open(ep.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(ep);
  impl_->acceptor.listen();
  impl_->accept();
  impl_->thread = std::thread([m = impl_.get()] { m->io.run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->io.stop();
  impl_->thread.join();
}

unsigned short TcpStoreServer::port() const { return impl_->acceptor.local_endpoint().port(); }

struct TcpStoreClient::Impl {
  asio::io_context io;
  tcp::socket socket{io};
  std::string where;
};

TcpStoreClient::TcpStoreClient(const std::string& host, unsigned short port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), timeout_(timeout) {
  impl_->where = host + ":" + std::to_string(port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  tcp::resolver resolver(impl_->io);
  std::string last;
  for (;;) {
    try {
      asio::connect(impl_->socket, resolver.resolve(host, std::to_string(port)));
      set_timeouts(impl_->socket, timeout);
      impl_->socket.set_option(tcp::no_delay(true));
      return;
    } catch (const std::exception& e) {
      last = e.what();
      boost::system::error_code ignored;
      impl_->socket.close(ignored);
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 may not listen yet
  }
  throw CommunicatorError("expert-parallel rendezvous: cannot reach the master " + impl_->where + " within " +
                          std::to_string(timeout.count()) + " ms (" + last + ")");
}

TcpStoreClient::~TcpStoreClient() = default;

void TcpStoreClient::set(const std::string& key, const std::vector<char>& value) {
  if (key.size() > kMaxKey || value.size() > kMaxValue) throw std::invalid_argument("store: key or value too large");
  std::string msg(1, 'S');
  put_u32(msg, static_cast<std::uint32_t>(key.size()));
  msg += key;
  put_u32(msg, static_cast<std::uint32_t>(value.size()));
  msg.append(value.data(), value.size());
  try {
    asio::write(impl_->socket, asio::buffer(msg));
    unsigned char ok = 0;
    asio::read(impl_->socket, asio::buffer(&ok, 1));
  } catch (const std::exception& e) {
    throw CommunicatorError("expert-parallel rendezvous: the master " + impl_->where + " failed (" + e.what() + ")");
  }
}

bool TcpStoreClient::try_get(const std::string& key, std::vector<char>& value) {
  if (key.size() > kMaxKey) throw std::invalid_argument("store: key too large");
  std::string msg(1, 'G');
  put_u32(msg, static_cast<std::uint32_t>(key.size()));
  msg += key;
  try {
    asio::write(impl_->socket, asio::buffer(msg));
    unsigned char found = 0;
    asio::read(impl_->socket, asio::buffer(&found, 1));
    if (!found) return false;
    unsigned char len[4];
    asio::read(impl_->socket, asio::buffer(len, 4));
    value.resize(get_u32(len));
    asio::read(impl_->socket, asio::buffer(value));
    return true;
  } catch (const std::exception& e) {
    throw CommunicatorError("expert-parallel rendezvous: the master " + impl_->where + " failed (" + e.what() + ")");
  }
}

std::vector<char> TcpStoreClient::get(const std::string& key) { return get(key, timeout_); }

std::vector<char> TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  std::vector<char> value;
  if (!try_get(key, value)) throw CommunicatorError("expert-parallel rendezvous: key " + key + " vanished");
  return value;
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<char> ignored;
  for (const auto& key : keys) {
    while (!try_get(key, ignored)) {
      if (std::chrono::steady_clock::now() >= deadline)
        throw CommunicatorError("expert-parallel rendezvous: timed out after " + std::to_string(timeout.count()) +
                                " ms waiting for " + key + " at " + impl_->where +
                                " (a rank did not start, or --ep-size differs between ranks)");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

}  // namespace kvfleet::comm
