#include "kernels/cpu/cpu_isa.h"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace kvfleet::cpu {
namespace {

// F16C (CPUID leaf 1, ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}

// AVX-512 BF16 (CPUID leaf 7 sub-leaf 1, EAX bit 5): not every compiler's __builtin_cpu_supports knows it.
bool has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)) != 0;
}

Isa best() {
  if (cpu_supports(Isa::avx512)) return Isa::avx512;
  if (cpu_supports(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

Isa initial() {
  const char* env = std::getenv("KVFLEET_CPU_ISA");
  if (!env || !*env) return best();
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::scalar, Isa::avx512bf16}) {
    if (isa_name(isa) != env) continue;
    if (!cpu_supports(isa))
      throw std::invalid_argument("KVFLEET_CPU_ISA=" + std::string(env) + ": this CPU does not support it");
    return isa;
  }
  throw std::invalid_argument("KVFLEET_CPU_ISA=" + std::string(env) + ": expected avx512, avx2, scalar or avx512bf16");
}

std::atomic<Isa>& current() {
  static std::atomic<Isa> isa{initial()};
  return isa;
}

}  // namespace

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && cpu_supports(Isa::avx2);
    case Isa::avx512bf16: return has_avx512_bf16() && cpu_supports(Isa::avx512);
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case Isa::scalar: return true;
  }
  return false;
}

Isa cpu_isa() { return current().load(std::memory_order_relaxed); }

void set_cpu_isa(Isa isa) {
  if (!cpu_supports(isa)) throw std::invalid_argument("this CPU does not support the " + std::string(isa_name(isa)) + " kernels");
  current().store(isa, std::memory_order_relaxed);
}

CpuModel cpu_model() {
  CpuModel m;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return m;
  char vendor[12];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  m.amd = std::memcmp(vendor, "AuthenticAMD", 12) == 0;
  m.intel = std::memcmp(vendor, "GenuineIntel", 12) == 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    const unsigned base = (a >> 8) & 0xf, ext = (a >> 20) & 0xff;
    m.family = base == 0xf ? base + ext : base;
  }
  return m;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::scalar: return "scalar";
    case Isa::avx512bf16: return "avx512bf16";
  }
  return "?";
}

}  // namespace kvfleet::cpu
