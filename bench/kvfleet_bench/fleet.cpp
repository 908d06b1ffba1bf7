#include "bench/kvfleet_bench/fleet.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace kvfleet::bench {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

ServerProcess::ServerProcess(const std::vector<std::string>& argv, const std::filesystem::path& log,
                             std::chrono::seconds timeout) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write " + log.string());
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(fd);
  static const std::regex serving("http://127\\.0\\.0\\.1:[0-9]+");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string text = read_file(log);
    std::smatch m;
    if (std::regex_search(text, m, serving)) {
      url_ = m.str();
      return;
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error(argv[0] + " exited at start: " + text.substr(text.size() > 2000 ? text.size() - 2000 : 0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop();
  throw std::runtime_error(argv[0] + " did not print its URL in time (log: " + log.string() + ")");
}

ServerProcess::~ServerProcess() { stop(); }

void ServerProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

Fleet::Fleet(const FleetConfig& c) {
  std::filesystem::create_directories(c.log_dir);
  const auto timeout = std::chrono::seconds(120);
  const std::string name = c.name.empty() ? c.policy : c.name;
  for (int i = 0; i < c.replicas; ++i) {
    std::vector<std::string> argv{(c.bin_dir / "kvfleet-replica").string(), "--model", c.model, "--port", "0"};
    argv.insert(argv.end(), c.replica_flags.begin(), c.replica_flags.end());
    if (static_cast<std::size_t>(i) < c.own_replica_flags.size())
      argv.insert(argv.end(), c.own_replica_flags[i].begin(), c.own_replica_flags[i].end());
    const auto log = c.log_dir / (name + "-replica-" + std::to_string(i) + ".log");
    replicas_.push_back(std::make_unique<ServerProcess>(argv, log, timeout));
  }
  std::vector<std::string> argv{(c.bin_dir / "kvfleet-router").string(), "--model", c.model, "--port", "0",
                                "--policy", c.policy};
  for (const auto& r : replicas_) {
    argv.push_back("--replica");
    argv.push_back(r->url());
  }
  argv.insert(argv.end(), c.router_flags.begin(), c.router_flags.end());
  router_ = std::make_unique<ServerProcess>(argv, c.log_dir / (name + "-router.log"), timeout);
}

std::vector<std::string> Fleet::replica_urls() const {
  std::vector<std::string> urls;
  for (const auto& r : replicas_) urls.push_back(r->url());
  return urls;
}

void Fleet::stop() {
  if (router_) router_->stop();
  for (auto& r : replicas_) r->stop();
}

}  // namespace kvfleet::bench
