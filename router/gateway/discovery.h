// Replica discovery by DNS: NAME:PORT resolved every few seconds to the set of replica addresses (a
// Kubernetes headless Service, Consul's DNS, /etc/hosts all give one), handed to the gateway as
// replica URLs (http://ADDRESS:PORT), which subscribes the new ones and removes the vanished ones
// (Gateway::apply_discovered, the admin API's add/remove path).
//
// A failed lookup, or one that finds no address, leaves the set as it was (a DNS blip must not empty
// the fleet); it is logged once per change of state.
//
// Threading: resolving blocks (getaddrinfo), so it runs on a thread of its own, never on an io
// thread; `apply` runs there too and must be thread-safe. The destructor stops and joins it.
// The resolver is injectable (tests give sets of 127.0.0.x addresses); hosts_file_resolver reads a
// hosts-format file, system_resolver asks the system (getaddrinfo).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "router/gateway/router_config.h"

namespace kvfleet::router {

class Discovery {
 public:
  // NAME -> its addresses (numeric, IPv6 without brackets); throws std::runtime_error on failure.
  using Resolver = std::function<std::vector<std::string>(const std::string& name)>;
  using Apply = std::function<void(const std::vector<std::string>& urls)>;  // the whole set, sorted

  Discovery(RouterConfig::Discovery config, Resolver resolver, Apply apply);
  ~Discovery();
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  void start();  // the first lookup runs at once

  static Resolver system_resolver();
  static Resolver hosts_file_resolver(std::string path);
  // Addresses -> sorted, distinct replica URLs on `port`.
  static std::vector<std::string> to_urls(const std::vector<std::string>& addresses, std::uint16_t port);

 private:
  void run();
  void lookup_once();

  RouterConfig::Discovery config_;
  ReplicaAddress target_;
  Resolver resolver_;
  Apply apply_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;  // guarded by mutex_
  std::string last_error_;
  std::thread thread_;
};

}  // namespace kvfleet::router
