// Small file helpers shared by the loaders. Errors name the file.
#pragma once

#include <boost/json/value.hpp>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace kvfleet {

class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The whole file as bytes; throws FileError("PATH: cannot read ...").
std::string read_text_file(const std::filesystem::path& path);

// The file parsed as JSON; throws FileError("PATH: not valid JSON: ...").
boost::json::value read_json_file(const std::filesystem::path& path);

}  // namespace kvfleet
