// safetensors files as the replica maps them (kvfleet/safetensors.h): the input is the whole file
// (8-byte little-endian header length, JSON header, tensor data), written to a temporary file because
// SafetensorsFile maps a path.
//
// Oracles: open() throws only ModelError; every tensor it returns lies inside the file's data and has
// exactly the bytes its dtype and shape need.
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <typeinfo>

#include "fuzz/fuzz_support.h"
#include "kvfleet/safetensors.h"

namespace {

std::filesystem::path scratch_file() {
  static const std::filesystem::path path = [] {
    std::filesystem::path dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    return dir / ("kvfleet-fuzz-safetensors-" + std::to_string(::getpid()) + ".safetensors");
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path path = scratch_file();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const kvfleet::SafetensorsFile file = kvfleet::SafetensorsFile::open(path);
    for (const auto& [name, t] : file.tensors()) {
      const auto* begin = static_cast<const std::uint8_t*>(t.data);
      // The tensor's bytes are readable: touch the first and the last (ASan/mmap bounds).
      if (t.bytes() > 0) {
        volatile std::uint8_t sink = begin[0];
        sink = begin[t.bytes() - 1];
        (void)sink;
      }
      if (t.numel() < 0) kvfleet::fuzz::finding("negative element count", name);
    }
  } catch (const kvfleet::ModelError&) {
  } catch (const std::exception& e) {
    kvfleet::fuzz::finding(std::string("unexpected exception ") + typeid(e).name(), e.what());
  }
  std::filesystem::remove(path);
  return 0;
}
