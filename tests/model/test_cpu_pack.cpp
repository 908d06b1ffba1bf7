// The CPU backend's packed weights (the default; KVFLEET_CPU_PACK=0 reads the plain weights): a model's logits
// are the same bits with and without the packed copies, on every ISA path this CPU has, for prompts (the
// GEMM) and for one row (the GEMV: it reads the packed panels too).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kvfleet/backend.h"
#include "kvfleet/make_model.h"
#include "runner_helpers.h"
#include "support/temp_dir.h"

using namespace kvfleet;

TEST_CASE("CPU backend: packed weights give the plain weights' logits bit for bit") {
  const char* env = std::getenv("KVFLEET_CPU_PACK");
  const std::string saved = env ? env : "";
  const cpu::Isa saved_isa = cpu::cpu_isa();
  for (DType dt : {DType::bf16, DType::f32}) {
    test::TempDir dir;
    MakeModelOptions o;
    o.dtype = dt;
    o.vocab = 200;
    o.arch = "qwen2";  // attention biases too
    make_model(o, dir.path());
    const Model model = Model::load(dir.path());
    std::vector<TokenId> ids(45), one{17};
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<TokenId>((i * 11 + 3) % 200);
    for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
      if (!cpu::cpu_supports(isa)) continue;
      CAPTURE(cpu::isa_name(isa));
      CAPTURE(dtype_name(dt));
      cpu::set_cpu_isa(isa);
      setenv("KVFLEET_CPU_PACK", "0", 1);
      const auto plain = test::all_logits(model, ids), plain_one = test::all_logits(model, one);
      setenv("KVFLEET_CPU_PACK", "1", 1);
      const auto packed = test::all_logits(model, ids), packed_one = test::all_logits(model, one);
      REQUIRE(plain.size() == packed.size());
      CHECK(std::memcmp(plain.data(), packed.data(), plain.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(plain_one.data(), packed_one.data(), plain_one.size() * sizeof(float)) == 0);
    }
  }
  cpu::set_cpu_isa(saved_isa);
  if (env) setenv("KVFLEET_CPU_PACK", saved.c_str(), 1);
  else unsetenv("KVFLEET_CPU_PACK");
}

// The packed copy is the only one read once made: with the plain weight's pages made unreadable after the
// first call (which packs it), the GEMV and the GEMM still run, and give the first call's bits. A read of
// the plain weight would be a SIGSEGV here.
TEST_CASE("CPU backend: once packed, the plain weight is never read (GEMV and GEMM)") {
  const char* env = std::getenv("KVFLEET_CPU_PACK");
  const std::string saved = env ? env : "";
  setenv("KVFLEET_CPU_PACK", "1", 1);
  const std::int64_t in = 200, out = 70;  // a tail block and a part-filled last panel
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = (static_cast<std::size_t>(in * out) * 2 + page - 1) / page * page;
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* w = static_cast<std::uint16_t*>(map);
  for (std::int64_t i = 0; i < in * out; ++i) w[i] = f32_to_bf16(static_cast<float>((i * 37) % 101 - 50) / 64.0f);
  std::vector<float> x(static_cast<std::size_t>(8 * in));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) / 7.0f - 0.9f;
  {
    auto backend = make_cpu_backend(2);
    const DeviceWeight dw{map, DType::bf16};
    std::vector<float> first(static_cast<std::size_t>(8 * out)), again(first.size());
    backend->linear(x.data(), 8, in, dw, out, {}, first.data());  // packs
    REQUIRE(::mprotect(map, bytes, PROT_NONE) == 0);
    backend->linear(x.data(), 8, in, dw, out, {}, again.data());
    CHECK(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) == 0);
    std::vector<float> one(static_cast<std::size_t>(out));
    backend->linear(x.data(), 1, in, dw, out, {}, one.data());
    CHECK(std::memcmp(first.data(), one.data(), one.size() * sizeof(float)) == 0);  // row 0 alone: same bits
  }
  ::munmap(map, bytes);
  if (env) setenv("KVFLEET_CPU_PACK", saved.c_str(), 1);
  else unsetenv("KVFLEET_CPU_PACK");
}

namespace {

// The resident set of the mapping that starts at `addr`, in KiB (/proc/self/smaps); -1 if not found.
long mapping_rss_kib(const void* addr) {
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(addr));
  std::ifstream smaps("/proc/self/smaps");
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2)  // a mapping's first line; "Rss:" etc. follow it
      in = line.rfind(start, 0) == 0;
    else if (in && line.rfind("Rss:", 0) == 0)
      return std::stol(line.substr(4));
  }
  return -1;
}

}  // namespace

// The checkpoint is a read-only private mapping of its file: giving a packed weight's plain pages back
// must take them out of this process's resident set but leave them in the page cache, so that the next
// process loading the model (a restarted replica, a test's next one) reads them from memory, not the disk.
TEST_CASE("CPU backend: packing a weight mapped from a file leaves its pages in the page cache, not in the RSS") {
  const char* env = std::getenv("KVFLEET_CPU_PACK");
  const std::string saved = env ? env : "";
  setenv("KVFLEET_CPU_PACK", "1", 1);
  const std::int64_t in = 512, out = 256;  // 256 KiB of bf16: 64 pages
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t bytes = static_cast<std::size_t>(in * out) * 2;
  REQUIRE(bytes % page == 0);
  test::TempDir dir;
  const std::string path = (dir / "w.bin").string();
  {
    std::vector<std::uint16_t> w(static_cast<std::size_t>(in * out));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(static_cast<float>((i * 37) % 101 - 50) / 64.0f);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, w.data(), bytes) == static_cast<ssize_t>(bytes));
    REQUIRE(::fsync(fd) == 0);  // clean pages: nothing keeps them in the cache but their use
    ::close(fd);
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  REQUIRE(map != MAP_FAILED);
  volatile std::uint32_t sum = 0;
  for (std::size_t at = 0; at < bytes; at += page) sum = sum + static_cast<const std::uint8_t*>(map)[at];
  CHECK(mapping_rss_kib(map) == static_cast<long>(bytes / 1024));
  std::vector<float> x(static_cast<std::size_t>(in), 0.25f), first(static_cast<std::size_t>(out)), again(first.size());
  {
    auto backend = make_cpu_backend(1);
    const DeviceWeight dw{map, DType::bf16};
    backend->linear(x.data(), 1, in, dw, out, {}, first.data());  // packs, then gives the plain pages back
    CHECK(mapping_rss_kib(map) == 0);
    std::vector<unsigned char> resident(bytes / page);
    REQUIRE(::mincore(map, bytes, resident.data()) == 0);  // a file mapping: whether the page cache holds it
    std::size_t cached = 0;
    for (unsigned char r : resident) cached += r & 1;
    CHECK(cached == resident.size());  // MADV_PAGEOUT evicted them (the old behaviour): 0
    backend->linear(x.data(), 1, in, dw, out, {}, again.data());
    CHECK(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)) == 0);
  }
  ::munmap(map, bytes);
  if (env) setenv("KVFLEET_CPU_PACK", saved.c_str(), 1);
  else unsetenv("KVFLEET_CPU_PACK");
}
