#include "router/gateway/discovery.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kvfleet::router {

Discovery::Discovery(RouterConfig::Discovery config, Resolver resolver, Apply apply)
    : config_(std::move(config)), target_(parse_discovery_target(config_.dns)), resolver_(std::move(resolver)),
      apply_(std::move(apply)) {}

Discovery::~Discovery() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Discovery::start() { thread_ = std::thread([this] { run(); }); }

void Discovery::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    lookup_once();
    lock.lock();
    wake_.wait_for(lock, config_.interval, [this] { return stop_; });
  }
}

void Discovery::lookup_once() {
  std::string error;
  std::vector<std::string> urls;
  try {
    urls = to_urls(resolver_(target_.host), target_.port);
    if (urls.empty()) error = "no address";
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (error != last_error_) {
    if (!error.empty())
      std::fprintf(stderr, "kvfleet-router: discovery: %s: %s; keeping the replicas found before\n", config_.dns.c_str(),
                   error.c_str());
    else if (!last_error_.empty())
      std::fprintf(stderr, "kvfleet-router: discovery: %s resolves again\n", config_.dns.c_str());
    last_error_ = error;
  }
  if (error.empty()) apply_(urls);
}

std::vector<std::string> Discovery::to_urls(const std::vector<std::string>& addresses, std::uint16_t port) {
  std::vector<std::string> urls;
  for (const std::string& a : addresses) {
    const std::string host = a.find(':') != std::string::npos ? "[" + a + "]" : a;
    std::string url = "http://" + host + ":" + std::to_string(port);
    try {
      parse_replica_url(url);
    } catch (const std::invalid_argument&) {
      continue;  // not an address we can use
    }
    urls.push_back(std::move(url));
  }
  std::sort(urls.begin(), urls.end());
  urls.erase(std::unique(urls.begin(), urls.end()), urls.end());
  return urls;
}

Discovery::Resolver Discovery::system_resolver() {
  return [](const std::string& name) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found); rc != 0)
      throw std::runtime_error(std::string("lookup failed: ") + gai_strerror(rc));
    std::vector<std::string> out;
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* where = a->ai_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                                                  : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
      if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) && inet_ntop(a->ai_family, where, text, sizeof text))
        out.emplace_back(text);
    }
    freeaddrinfo(found);
    return out;
  };
}

// Lines "ADDRESS NAME [NAME...] [# comment]"; every address one of whose names is `name` (any case).
Discovery::Resolver Discovery::hosts_file_resolver(std::string path) {
  return [path](const std::string& name) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read hosts file " + path);
    auto lower = [](std::string s) {
      std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
      return s;
    };
    const std::string want = lower(name);
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line)) {
      line = line.substr(0, line.find('#'));
      std::istringstream words(line);
      std::string address, alias;
      if (!(words >> address)) continue;
      while (words >> alias)
        if (lower(alias) == want) out.push_back(address);
    }
    if (out.empty()) throw std::runtime_error("'" + name + "' is not in " + path);
    return out;
  };
}

}  // namespace kvfleet::router
