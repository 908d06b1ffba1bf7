// A model's config.json (kvfleet/model_config.h): ModelConfig::parse is what the replica, the router
// and the tools run on a model directory. Oracle: bad input is a ModelError naming the key; nothing
// else escapes.
#include <exception>
#include <string>
#include <typeinfo>

#include "fuzz/fuzz_support.h"
#include "kvfleet/model_config.h"
#include "kvfleet/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    (void)kvfleet::ModelConfig::parse(std::string(kvfleet::fuzz::as_text(data, size)), "config.json");
  } catch (const kvfleet::ModelError&) {
  } catch (const std::exception& e) {
    kvfleet::fuzz::finding(std::string("unexpected exception ") + typeid(e).name(), e.what());
  }
  return 0;
}
