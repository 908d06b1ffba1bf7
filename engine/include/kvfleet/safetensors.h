// Memory-mapped safetensors checkpoints: one file, or shards listed by model.safetensors.index.json.
// Every error names the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvfleet/dtype.h"

namespace kvfleet {

class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A read-only view of one tensor inside a mapped file.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::string name;
  std::string file;  // for error messages

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
};

// One mapped .safetensors file. Move-only; unmaps on destruction.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// All tensors of a model directory, whether in one file or sharded.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& model_dir);

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Throws ModelError naming the tensor (and the files searched) when it is missing, or when its shape
  // differs from `expected_shape` (if given).
  const TensorView& get(const std::string& name, const std::vector<std::int64_t>& expected_shape = {}) const;
  std::vector<std::string> names() const;
  std::size_t total_bytes() const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

// Writes tensors (name -> dtype, shape, raw little-endian bytes) as one .safetensors file.
struct TensorData {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
};
void write_safetensors(const std::filesystem::path& path, const std::map<std::string, TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace kvfleet
