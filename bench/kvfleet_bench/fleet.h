// A fleet on loopback for the routing comparison: N kvfleet-replica processes and one kvfleet-router,
// each started with --port 0 and its stdout/stderr in a log file; the URL a server prints is how we
// learn its port. Stopping sends SIGTERM, then SIGKILL after a grace period.
//
// Threading: one thread owns a Fleet.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kvfleet::bench {

class ServerProcess {
 public:
  // Starts argv[0] with its output in `log`, then waits until the log names an http://127.0.0.1:PORT
  // URL; throws std::runtime_error (with the log's tail) when the process exits or `timeout` passes.
  ServerProcess(const std::vector<std::string>& argv, const std::filesystem::path& log, std::chrono::seconds timeout);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& url() const { return url_; }
  void stop();

 private:
  pid_t pid_ = -1;
  std::string url_;
};

struct FleetConfig {
  std::filesystem::path bin_dir;             // holds kvfleet-replica and kvfleet-router
  std::string model;                         // model directory
  int replicas = 4;
  std::string policy = "cache_aware";
  std::vector<std::string> replica_flags;    // e.g. --num-kv-blocks 256 --cpu-threads 1
  std::vector<std::vector<std::string>> own_replica_flags;  // [i]: more flags for replica i only (its disk dir)
  std::string name;                          // log file prefix (default: the policy)
  std::vector<std::string> router_flags;
  std::filesystem::path log_dir;
};

class Fleet {
 public:
  explicit Fleet(const FleetConfig& config);
  const std::string& router_url() const { return router_->url(); }
  std::vector<std::string> replica_urls() const;
  void stop();

 private:
  std::vector<std::unique_ptr<ServerProcess>> replicas_;
  std::unique_ptr<ServerProcess> router_;
};

}  // namespace kvfleet::bench
