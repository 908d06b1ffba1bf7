// The sampler's passes over a whole row (sampler.cpp, sample/buckets.cpp): the range, every id's weight and
// bucket with each bucket's weight sum, bucket counts, the ids of a run of buckets, greedy's search. Each
// has an AVX-512 path (chosen at run time when the CPU has AVX-512 F/BW/VL/DQ and the CPU kernels are not
// told otherwise: KVFLEET_CPU_ISA, kernels/cpu/cpu_isa.h) and a generic one the compiler vectorises for the
// build's -march, and the two passes the compiler cannot vectorise (collect, first_equal) an AVX2 one; all
// give the same results and the same bits as the scalar sampler_detail::weight() (tested), so the path
// changes speed only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::sampler_detail {

constexpr int kBuckets = 1024;  // over a row's x = (l - max) / T, at most [-88, 0]

// The largest and the smallest ordered logit (NaN as -inf).
struct Range {
  float max, min;
};
Range row_range(std::span<const float> logits);

// Bucket b holds the x with b = floor(min(x * -to_bucket, kBuckets - 1)), x = (ordered(l) - max_l) / t, that
// is x in (-(b + 1), -b] * span / kBuckets (below -span: the last bucket): monotone in the logit (a larger
// logit never gets a larger bucket) whatever the rounding, since x <= 0 and every step is monotone.
struct Bucketing {
  float max_l, t, span, to_bucket;
};
// span = min(88, (max - min) / t) (1 for a constant row); max must be finite.
Bucketing make_bucketing(Range range, float t);

// Every id's weight (sample/weights.h's weight(), bit for bit) into w and bucket into bucket, and each
// bucket's weight sum (in double; `sum` has kBuckets entries, overwritten).
// `prefetch`, when not null, is a row of as many floats read next (SamplerScratch::next_row): pulled toward
// L2 a cache line per 16 ids as this one is weighed.
void weigh_and_bucket(std::span<const float> logits, const Bucketing& g, float* w, std::uint16_t* bucket, double* sum,
                      const float* prefetch = nullptr);
// Every id's bucket into bucket and each bucket's number of ids into count (kBuckets entries, overwritten).
void count_buckets(std::span<const float> logits, const Bucketing& g, std::uint16_t* bucket, std::uint32_t* count,
                   const float* prefetch = nullptr);
// Appends to out, ascending, every id i < n with lo <= bucket[i] <= hi.
void collect_buckets(const std::uint16_t* bucket, std::size_t n, int lo, int hi, std::vector<TokenId>& out);
// The lowest i with logits[i] == v (-0 == +0); logits.size() if none.
std::size_t first_equal(std::span<const float> logits, float v);

// weight(l, max_l, t) as this file's passes see it: built without contracted multiply-adds (a test's own
// inline copy of weight() may not be).
float scalar_weight(float l, float max_l, float t);

// Which path the passes take: AVX-512 where the CPU has it and cpu_isa() is avx512 (or avx512bf16); else
// AVX2 (the passes GCC leaves scalar: collect_buckets, first_equal) unless cpu_isa() is scalar; else the
// generic one. Tests force each in turn (not thread-safe; an unsupported path falls back to generic).
enum class ScanPath { generic, avx2, avx512 };
bool scan_path_supported(ScanPath path);
ScanPath scan_path();
void set_scan_path(ScanPath path);

}  // namespace kvfleet::sampler_detail
