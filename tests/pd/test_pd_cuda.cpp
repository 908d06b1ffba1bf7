// The CUDA backend's KV transfer path (read_kv_blocks / write_kv_blocks through a pinned staging buffer):
// blocks written from the host read back byte for byte, in the [block][layer] layout, and agree with the
// per-layer read_kv_bytes and the fp32 read_kv_block. Skips, saying so, without a GPU.
#include <doctest/doctest.h>

#ifdef KVFLEET_HAVE_CUDA
#include <random>

#include "cuda/cuda_test_env.h"
#include "kvfleet/backend.h"

using namespace kvfleet;

TEST_CASE("CUDA KV staging: pinned batch writes and reads round-trip byte for byte") {
  KVF_REQUIRE_GPU_OR_SKIP();
  BackendOptions o;
  o.kind = "cuda";
  auto backend = make_backend(o);
  const KvCacheShape shape{3, 8, 16, 2, 32};
  backend->allocate_kv_cache(shape);
  const std::size_t bytes = backend->kv_block_bytes();
  const std::vector<std::int32_t> blocks{5, 1, 6};
  std::string in(blocks.size() * 3 * bytes, '\0');
  std::mt19937 rng(7);
  for (auto& c : in) c = static_cast<char>(rng() & 0x3f);  // finite values in f32 and bf16 alike
  backend->write_kv_blocks(blocks, in.data());
  std::string out(in.size(), '\1');
  backend->read_kv_blocks(blocks, out.data());
  CHECK(out == in);
  std::string one(bytes, '\0');
  backend->read_kv_bytes(2, 1, one.data());  // block 1 is the 2nd of the batch; layer 2 its 3rd slice
  CHECK(one == in.substr((1 * 3 + 2) * bytes, bytes));
  // Strided, as the KV lands in wire frames: block i at i * stride, the gaps left alone.
  const std::size_t block = 3 * bytes, stride = block + 40;
  std::string framed(blocks.size() * stride, '#');
  backend->read_kv_blocks(blocks, framed.data(), stride);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    CHECK(framed.substr(i * stride, block) == in.substr(i * block, block));
    CHECK(framed.substr(i * stride + block, 40) == std::string(40, '#'));
  }
  backend->write_kv_blocks(std::vector<std::int32_t>{6, 5, 1}, framed.data(), stride);  // rotated
  std::string rotated(in.size(), '\0');
  backend->read_kv_blocks(blocks, rotated.data());
  CHECK(rotated.substr(0, block) == in.substr(block, block));   // block 5 got what block 1 had
  CHECK(rotated.substr(2 * block, block) == in.substr(0, block));  // block 6 got block 5's
  std::vector<float> f32(static_cast<std::size_t>(shape.block_elems()));
  backend->read_kv_block(0, 6, f32.data());
  const char* raw = in.data() + (2 * 3 + 0) * bytes;
  if (backend->kv_dtype() == DType::f32) {
    CHECK(std::memcmp(f32.data(), raw, bytes) == 0);
  } else {
    std::uint16_t first = 0;
    std::memcpy(&first, raw, 2);
    CHECK(f32[0] == bf16_to_f32(first));
  }
}
#endif
