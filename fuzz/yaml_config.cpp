// The replica's and the router's YAML configuration (engine/server/replica_config.h,
// router/gateway/router_config.h): byte 0 picks which one reads the rest. Oracle: a bad file is
// std::invalid_argument (kvfleet/yaml_settings.h: every error names the file and the key) or a
// yaml-cpp error; nothing else escapes, nothing crashes.
#include <yaml-cpp/exceptions.h>

#include <exception>
#include <string>
#include <typeinfo>

#include "engine/server/replica_config.h"
#include "fuzz/fuzz_support.h"
#include "router/gateway/router_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(kvfleet::fuzz::as_text(data + 1, size - 1));
  try {
    if (data[0] & 1) {
      kvfleet::router::RouterConfig config;
      kvfleet::router::apply_router_yaml(text, "router.yaml", config);
    } else {
      kvfleet::server::ReplicaConfig config;
      kvfleet::server::apply_replica_yaml(text, "replica.yaml", config);
    }
  } catch (const std::invalid_argument&) {
  } catch (const YAML::Exception&) {
  } catch (const std::exception& e) {
    kvfleet::fuzz::finding(std::string("unexpected exception ") + typeid(e).name(), e.what());
  }
  return 0;
}
