#include "router/policy_knobs.h"

#include <sstream>
#include <stdexcept>

namespace kvfleet::router {
namespace {

std::string show(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

}  // namespace

Knobs::Knobs(std::string_view policy, const YAML::Node& node) : policy_(policy), node_(node) {
  known_.insert("name");
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
    throw std::invalid_argument("policy '" + policy_ + "': knobs must be a map");
  }
}

void Knobs::fail(const std::string& key, const std::string& what) const {
  throw std::invalid_argument("policy '" + policy_ + "': knob '" + key + "' " + what);
}

YAML::Node Knobs::lookup(const std::string& key) {
  known_.insert(key);
  if (!node_.IsDefined() || !node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  return node_[key];
}

double Knobs::number(const std::string& key, double fallback, double min, double max) {
  const YAML::Node v = lookup(key);
  if (!v.IsDefined() || v.IsNull()) return fallback;
  double x = 0;
  if (!v.IsScalar() || !YAML::convert<double>::decode(v, x)) fail(key, "must be a number");
  if (!(x >= min && x <= max)) {
    fail(key, "must be in [" + show(min) + ", " + show(max) + "], got " + v.Scalar());
  }
  return x;
}

std::uint64_t Knobs::integer(const std::string& key, std::uint64_t fallback, std::uint64_t min, std::uint64_t max) {
  const std::optional<std::uint64_t> v = optional_integer(key);
  if (!v) return fallback;
  if (*v < min || *v > max) {
    fail(key, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + std::to_string(*v));
  }
  return *v;
}

std::optional<std::uint64_t> Knobs::optional_integer(const std::string& key) {
  const YAML::Node v = lookup(key);
  if (!v.IsDefined() || v.IsNull()) return std::nullopt;
  std::uint64_t x = 0;
  // yaml-cpp would read "-1" as a huge unsigned value: refuse a sign explicitly.
  if (!v.IsScalar() || v.Scalar().starts_with('-') || !YAML::convert<std::uint64_t>::decode(v, x)) {
    fail(key, "must be a non-negative integer");
  }
  return x;
}

std::string Knobs::text(const std::string& key, const std::string& fallback) {
  const YAML::Node v = lookup(key);
  if (!v.IsDefined() || v.IsNull()) return fallback;
  if (!v.IsScalar() || v.Scalar().empty()) fail(key, "must be a non-empty string");
  return v.Scalar();
}

void Knobs::finish() const {
  if (!node_.IsDefined() || !node_.IsMap()) return;
  for (const auto& kv : node_) {
    const std::string key = kv.first.as<std::string>();
    if (known_.count(key) != 0) continue;
    std::string list;
    for (const std::string& k : known_) {
      if (k == "name") continue;
      list += list.empty() ? k : ", " + k;
    }
    throw std::invalid_argument("policy '" + policy_ + "': unknown knob '" + key + "' (known: " +
                                (list.empty() ? std::string("none") : list) + ")");
  }
}

}  // namespace kvfleet::router
