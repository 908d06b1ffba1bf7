// Which instruction set the CPU kernels use, chosen once per process: the best the CPU has (AVX-512 F/BW/VL/DQ,
// else AVX2 + FMA + F16C, else scalar), or the one named by KVFLEET_CPU_ISA=avx512|avx2|scalar|avx512bf16 (a path the CPU
// lacks is refused with a message, never run). Every path computes the same bits (linear_kernels.h), so
// the choice changes speed only; tests force each path in turn through set_cpu_isa.
// avx512bf16 is the exception: an opt-in mode (never the automatic choice) that rounds activations to bf16
// for `vdpbf16ps` on bf16 weights (other weights run the avx512 kernel); it is batch invariant but its
// results differ from the other paths' (linear_avx512bf16.cpp).
#pragma once

#include <string_view>

namespace kvfleet::cpu {

enum class Isa { scalar, avx2, avx512, avx512bf16 };

Isa cpu_isa();                       // the current choice (made on first use)
bool cpu_supports(Isa isa);          // whether this CPU can run that path
void set_cpu_isa(Isa isa);           // throws std::invalid_argument when !cpu_supports(isa); not thread-safe
std::string_view isa_name(Isa isa);  // "avx512", "avx2", "scalar", "avx512bf16"

// The CPU's vendor and family (CPUID leaves 0 and 1), for the few choices tuned per microarchitecture rather
// than per instruction set (the packed GEMV's reading pattern, linear_avx512.cpp). Never changes a bit.
struct CpuModel {
  bool amd = false, intel = false;
  unsigned family = 0;  // base family + extended family (AMD Zen 4: 0x19, Zen 5: 0x1a; Intel: 6)
};
CpuModel cpu_model();

}  // namespace kvfleet::cpu
