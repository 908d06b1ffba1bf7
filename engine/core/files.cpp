#include "kvfleet/files.h"

#include <boost/json/parse.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kvfleet {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FileError(path.string() + ": cannot read (" + std::strerror(errno) + ")");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

boost::json::value read_json_file(const std::filesystem::path& path) {
  const std::string text = read_text_file(path);
  try {
    return boost::json::parse(text);
  } catch (const std::exception& e) {
    throw FileError(path.string() + ": not valid JSON: " + e.what());
  }
}

}  // namespace kvfleet
