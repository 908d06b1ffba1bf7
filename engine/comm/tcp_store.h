// A small TCP key-value store for the rendezvous of an expert-parallel group across processes or machines
// (Gloo 0.5 as Debian ships it has only file, hash, prefix and Redis stores). Rank 0 runs the server on
// --ep-master HOST:PORT; every rank (rank 0 too) is a client. Keys are written once and read by polling.
//
// Wire format, one request per message, answers in order on the same connection:
//   request:  u8 op ('S' set | 'G' get), u32 key_len, key, and for 'S' u32 value_len, value
//   answer:   'S' -> u8 1;  'G' -> u8 found (0|1), and when found u32 value_len, value
// Integers are little-endian. Keys up to 4 KiB, values up to 1 MiB: anything else closes the connection.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kvfleet::comm {

// Splits "HOST:PORT" (throws std::invalid_argument naming the text).
std::pair<std::string, unsigned short> parse_host_port(const std::string& text);

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any; see port()). Serves until destroyed.
  TcpStoreServer(const std::string& host, unsigned short port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  unsigned short port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpStoreClient {
 public:
  // Connects to host:port, retrying while the server is not up yet, for at most `timeout` (then throws
  // CommunicatorError). Every later call also gives up after `timeout`.
  TcpStoreClient(const std::string& host, unsigned short port, std::chrono::milliseconds timeout);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // Waits until the key exists (polling), then returns its value.
  std::vector<char> get(const std::string& key);
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  bool try_get(const std::string& key, std::vector<char>& value);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::chrono::milliseconds timeout_;
};

}  // namespace kvfleet::comm
