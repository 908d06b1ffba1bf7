#include "kvfleet/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "kvfleet/files.h"

namespace kvfleet {
namespace json = boost::json;

namespace {

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& what) {
  throw ModelError(file.string() + ": " + what);
}

DType parse_dtype(const std::filesystem::path& file, const std::string& tensor, std::string_view s) {
  if (s == "F32") return DType::f32;
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  fail(file, "tensor '" + tensor + "' has dtype " + std::string(s) + " (supported: F32, F16, BF16)");
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

TensorView parse_entry(const std::filesystem::path& file, const std::string& name, const json::value& v,
                       const std::uint8_t* data, std::size_t data_size) {
  const auto* obj = v.if_object();
  if (!obj || !obj->contains("dtype") || !obj->contains("shape") || !obj->contains("data_offsets"))
    fail(file, "bad header: tensor '" + name + "' lacks dtype, shape or data_offsets");
  TensorView t;
  t.name = name;
  t.file = file.string();
  try {
    t.dtype = parse_dtype(file, name, obj->at("dtype").as_string());
    for (const auto& d : obj->at("shape").as_array()) {
      const auto dim = json::value_to<std::int64_t>(d);
      if (dim < 0) fail(file, "bad header: tensor '" + name + "' has a negative dimension");
      t.shape.push_back(dim);
    }
    // No tensor can have more elements than the file has bytes; checking that first keeps numel() and
    // bytes() from overflowing (a shape of [2^62, 4] multiplied out to 0 and passed the size check).
    const bool empty = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
    std::uint64_t elements = 1;
    for (const std::int64_t dim : t.shape) {
      if (empty) break;
      if (elements > data_size / static_cast<std::uint64_t>(dim))
        fail(file, "tensor '" + name + "' has shape " + shape_str(t.shape) + ", more elements than the file has bytes");
      elements *= static_cast<std::uint64_t>(dim);
    }
    const auto& off = obj->at("data_offsets").as_array();
    if (off.size() != 2) fail(file, "bad header: tensor '" + name + "' data_offsets must have two entries");
    const auto begin = json::value_to<std::uint64_t>(off[0]);
    const auto end = json::value_to<std::uint64_t>(off[1]);
    if (begin > end || end > data_size)
      fail(file, "tensor '" + name + "' lies outside the file (offsets " + std::to_string(begin) + ".." +
                     std::to_string(end) + ", data size " + std::to_string(data_size) + "): truncated file?");
    if (end - begin != t.bytes())
      fail(file, "tensor '" + name + "' has " + std::to_string(end - begin) + " bytes but shape " +
                     shape_str(t.shape) + " of " + std::string(dtype_name(t.dtype)) + " needs " +
                     std::to_string(t.bytes()));
    t.data = data + begin;
  } catch (const std::exception& e) {
    if (dynamic_cast<const ModelError*>(&e)) throw;
    fail(file, "bad header: tensor '" + name + "': " + e.what());
  }
  return t;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, "cannot stat");
  }
  f.map_size_ = static_cast<std::size_t>(st.st_size);
  if (f.map_size_ < 8) {
    ::close(fd);
    fail(path, "file is " + std::to_string(f.map_size_) + " bytes, too short for a safetensors header");
  }
  f.map_ = ::mmap(nullptr, f.map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f.map_ == MAP_FAILED) {
    f.map_ = nullptr;
    fail(path, std::string("mmap failed: ") + std::strerror(errno));
  }
  const auto* base = static_cast<const std::uint8_t*>(f.map_);
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > f.map_size_ - 8) fail(path, "header length " + std::to_string(header_len) + " exceeds the file");
  json::value header;
  try {
    header = json::parse(std::string_view(reinterpret_cast<const char*>(base + 8), header_len));
  } catch (const std::exception& e) {
    fail(path, std::string("bad header (not JSON): ") + e.what());
  }
  if (!header.is_object()) fail(path, "bad header: not a JSON object");
  const std::uint8_t* data = base + 8 + header_len;
  const std::size_t data_size = f.map_size_ - 8 - header_len;
  for (const auto& [key, v] : header.as_object()) {
    if (key == "__metadata__") continue;
    std::string name(key);
    f.tensors_.emplace(name, parse_entry(path, name, v, data, data_size));
  }
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_size_(o.map_size_), tensors_(std::move(o.tensors_)) {
  o.map_ = nullptr;
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_size_);
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_size_ = o.map_size_;
    tensors_ = std::move(o.tensors_);
    o.map_ = nullptr;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

Checkpoint Checkpoint::open(const std::filesystem::path& dir) {
  Checkpoint c;
  c.dir_ = dir;
  const auto index_path = dir / "model.safetensors.index.json";
  std::vector<std::filesystem::path> shards;
  if (std::filesystem::exists(index_path)) {
    std::set<std::string> unique;
    try {
      const json::value index = read_json_file(index_path);
      for (const auto& [name, file] : index.at("weight_map").as_object())
        unique.insert(std::string(file.as_string()));
    } catch (const std::exception& e) {
      fail(index_path, std::string("bad index: ") + e.what());
    }
    for (const auto& f : unique) shards.push_back(dir / f);
  } else if (std::filesystem::exists(dir / "model.safetensors")) {
    shards.push_back(dir / "model.safetensors");
  } else {
    fail(dir, "no model.safetensors or model.safetensors.index.json");
  }
  for (const auto& s : shards) {
    c.files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(s)));
    for (const auto& [name, t] : c.files_.back()->tensors()) c.index_[name] = &t;
  }
  return c;
}

const TensorView& Checkpoint::get(const std::string& name, const std::vector<std::int64_t>& expected) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    std::string files;
    for (const auto& f : files_) files += (files.empty() ? "" : ", ") + f->path().filename().string();
    throw ModelError(dir_.string() + ": tensor '" + name + "' not found (searched " + files + ")");
  }
  if (!expected.empty() && it->second->shape != expected)
    throw ModelError(it->second->file + ": tensor '" + name + "' has shape " + shape_str(it->second->shape) +
                     ", expected " + shape_str(expected) + " from config.json");
  return *it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : index_) out.push_back(name);
  return out;
}

std::size_t Checkpoint::total_bytes() const {
  std::size_t n = 0;
  for (const auto& [name, t] : index_) n += t->bytes();
  return n;
}

void write_safetensors(const std::filesystem::path& path, const std::map<std::string, TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json::object header;
  if (!metadata.empty()) {
    json::object meta;
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    json::array shape;
    for (auto d : t.shape) shape.push_back(d);
    header[name] = json::object{{"dtype", dtype_name(t.dtype)}, {"shape", shape},
                                {"data_offsets", json::array{offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = json::serialize(header);
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // keep the data 8-byte aligned
  std::ofstream out(path, std::ios::binary);
  if (!out) throw ModelError(path.string() + ": cannot write");
  const std::uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  if (!out) throw ModelError(path.string() + ": write failed");
}

}  // namespace kvfleet
