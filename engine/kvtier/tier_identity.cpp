#include "engine/kvtier/tier_identity.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

namespace kvfleet::kvtier {

namespace fs = std::filesystem;

namespace {

std::uint64_t read_id(const fs::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text)) return 0;
  std::uint64_t id = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id, 16);
  return ec == std::errc{} && end == text.data() + text.size() ? id : 0;
}

}  // namespace

std::uint64_t folder_identity(const fs::path& folder) {
  const fs::path file = folder / ".tier-id";
  if (const std::uint64_t id = read_id(file)) return id;
  std::random_device rd;
  std::uint64_t id = 0;
  while (id == 0) id = (std::uint64_t{rd()} << 32) ^ rd();
  char text[24];
  std::snprintf(text, sizeof text, "%016llx\n", static_cast<unsigned long long>(id));
  const fs::path tmp = folder / (".tier-id." + std::to_string(id) + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.flush()) return read_id(file);
  }
  // link() fails when the name exists: the first replica's id stays, everyone reads it.
  ::link(tmp.c_str(), file.c_str());
  std::error_code ec;
  fs::remove(tmp, ec);
  return read_id(file);
}

}  // namespace kvfleet::kvtier
