// Reading YAML settings files (replica.yaml, router.yaml): every error names the file and the key.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace kvfleet::settings {

[[noreturn]] inline void bad(const std::string& source, const std::string& key, const std::string& why) {
  throw std::invalid_argument(source + ": '" + key + "' " + why);
}

template <class T>
T scalar(const YAML::Node& n, const std::string& source, const std::string& key) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    bad(source, key, "has a bad value '" + (n.IsScalar() ? n.Scalar() : std::string("<not a scalar>")) + "'");
  }
}

template <class T>
T positive(const YAML::Node& n, const std::string& source, const std::string& key) {
  const auto v = scalar<std::int64_t>(n, source, key);
  if (v <= 0) bad(source, key, "must be positive");
  return static_cast<T>(v);
}

// The document as a mapping of settings; a null node for an empty document.
inline YAML::Node load_mapping(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(source + ": not valid YAML: " + e.what());
  }
  if (!root.IsNull() && !root.IsMap()) throw std::invalid_argument(source + ": must be a mapping of settings");
  return root;
}

}  // namespace kvfleet::settings
