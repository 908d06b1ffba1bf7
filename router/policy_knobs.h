// Reading a policy's knobs from YAML with errors that name the policy and the knob. Every knob a
// policy reads is recorded, so finish() can reject the ones nobody asked for (a typo'd knob must
// fail loudly rather than silently keep its default).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace kvfleet::router {

class Knobs {
 public:
  // `node` is a map of knobs (keys other than "name") or null/undefined for all defaults.
  Knobs(std::string_view policy, const YAML::Node& node);

  double number(const std::string& key, double fallback, double min, double max);
  std::uint64_t integer(const std::string& key, std::uint64_t fallback, std::uint64_t min, std::uint64_t max);
  std::optional<std::uint64_t> optional_integer(const std::string& key);
  std::string text(const std::string& key, const std::string& fallback);
  // Throws std::invalid_argument for the first key that no call above asked for.
  void finish() const;

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  YAML::Node lookup(const std::string& key);

  std::string policy_;
  YAML::Node node_;
  std::set<std::string> known_;
};

}  // namespace kvfleet::router
