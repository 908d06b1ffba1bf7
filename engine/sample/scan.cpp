// The sampler's row passes (sample/scan.h). Built with -ffp-contract=off like sampler.cpp: a weight here is
// the float sampler_detail::weight() computes, op for op (no fused multiply-add in either). The AVX-512 and
// AVX2 functions carry a target attribute instead of this file being built with -mavx512f, so that the
// inline functions they call (the standard library's) keep their default-target copies: the linker may pick
// any one copy of an inline function, and it must run on every CPU.
#include "engine/sample/scan.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "engine/sample/weights.h"
#include "kernels/cpu/cpu_isa.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVFLEET_SAMPLER_X86 1
// GCC 12 warns about the deliberately undefined source register inside its own AVX-512 intrinsics
// (kernels/cpu/linear_avx512.cpp has the same): a false positive that -Werror would make fatal.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define KVFLEET_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define KVFLEET_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define KVFLEET_SAMPLER_X86 0
#endif

namespace kvfleet::sampler_detail {
namespace {

constexpr std::int32_t kPosInfKey = 0x7f800000, kNegInfKey = static_cast<std::int32_t>(0x807fffff);  // keys of +-inf
// A 32-bit key whose signed order is the floats' order (negative floats: magnitude bits flipped); NaN of
// either sign as -inf.
inline std::int32_t order_key(float l) {
  const auto u = std::bit_cast<std::int32_t>(l);
  const std::int32_t key = u ^ ((u >> 31) & 0x7fffffff);
  return key > kPosInfKey || key < kNegInfKey ? kNegInfKey : key;
}
inline float key_float(std::int32_t k) { return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff)); }

// Ids go through the weight pass and then the (scalar) sums in blocks that stay in L1.
constexpr std::size_t kBlock = 2048;

// The generic passes: plain loops the compiler vectorises for the build's -march (no call, no branch).
Range row_range_generic(std::span<const float> logits) {
  std::int32_t hi = kNegInfKey, lo = kPosInfKey;
  for (float l : logits) {
    const std::int32_t key = order_key(l);
    hi = key > hi ? key : hi;
    lo = key < lo ? key : lo;
  }
  return {key_float(hi), key_float(lo)};
}

template <bool kWeights>
void bucket_generic(const float* l, std::size_t n, const Bucketing& g, float* w, std::uint16_t* bucket,
                    const float* prefetch) {
  if (prefetch)
    for (std::size_t i = 0; i < n; i += 16) __builtin_prefetch(prefetch + i, 0, 2);
  const float max_l = g.max_l, t = g.t, neg_to_bucket = -g.to_bucket, last = kBuckets - 1;
  auto one = [&](std::size_t i, float x) {
    if constexpr (kWeights) w[i] = exp_weight(x);
    bucket[i] = static_cast<std::uint16_t>(static_cast<int>(std::min(x * neg_to_bucket, last)));
  };
  if (t == 1.0f) {  // x / 1 == x exactly: the same bits without the division
    for (std::size_t i = 0; i < n; ++i) one(i, ordered(l[i]) - max_l);
  } else {
    for (std::size_t i = 0; i < n; ++i) one(i, (ordered(l[i]) - max_l) / t);
  }
}

std::size_t first_equal_generic(std::span<const float> logits, float v) {
  std::size_t i = 0;
  while (i < logits.size() && logits[i] != v) ++i;
  return i;
}

#if KVFLEET_SAMPLER_X86
KVFLEET_TARGET_AVX512 Range row_range_avx512(std::span<const float> logits) {
  const __m512i pos_inf = _mm512_set1_epi32(kPosInfKey), neg_inf = _mm512_set1_epi32(kNegInfKey);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  __m512i hi = neg_inf, lo = pos_inf;
  const std::size_t n = logits.size();
  for (std::size_t i = 0; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    const __m512i u = _mm512_maskz_loadu_epi32(m, logits.data() + i);
    __m512i key = _mm512_xor_si512(u, _mm512_and_si512(_mm512_srai_epi32(u, 31), magnitude));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(key, pos_inf) | _mm512_cmplt_epi32_mask(key, neg_inf);
    key = _mm512_mask_blend_epi32(nan, key, neg_inf);
    hi = _mm512_mask_max_epi32(hi, m, hi, key);
    lo = _mm512_mask_min_epi32(lo, m, lo, key);
  }
  return {key_float(_mm512_reduce_max_epi32(hi)), key_float(_mm512_reduce_min_epi32(lo))};
}

// exp_weight() on 16 lanes of x <= 0 (x = (l - max) / t with max the row's maximum: never above 0, never
// NaN), the same operations in the same order (sample/weights.h). For such x its clamp to [-87, 0] is
// max(x, -87) (vmaxps returns the larger of two numbers).
KVFLEET_TARGET_AVX512 __m512 exp_weight16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f), big = _mm512_set1_ps(12582912.0f);
  const __mmask16 below = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), big), big);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~below), y, _mm512_castsi512_ps(e));
}

// `prefetch`: the row sampled next (or null), one cache line of it per 16 ids, so that its first pass finds
// it in L2 instead of waiting on the last level (the step's logits are megabytes).
template <bool kWeights>
KVFLEET_TARGET_AVX512 void bucket_avx512(const float* l, std::size_t n, const Bucketing& g, float* w,
                                         std::uint16_t* bucket, const float* prefetch) {
  const __m512 max_l = _mm512_set1_ps(g.max_l), t = _mm512_set1_ps(g.t), neg_to_bucket = _mm512_set1_ps(-g.to_bucket);
  const __m512 last = _mm512_set1_ps(kBuckets - 1), neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const bool unit = g.t == 1.0f;  // x / 1 == x exactly
  for (std::size_t i = 0; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(prefetch + i), _MM_HINT_T1);
    __m512 v = _mm512_maskz_loadu_ps(m, l + i);
    v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v, neg_inf);  // ordered()
    __m512 x = _mm512_sub_ps(v, max_l);
    if (!unit) x = _mm512_div_ps(x, t);
    if constexpr (kWeights) _mm512_mask_storeu_ps(w + i, m, exp_weight16(x));
    // std::min(y, last) is (last < y ? last : y): vminps(y, last) returns last when they are equal, the same value.
    const __m512i b = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_mul_ps(x, neg_to_bucket), last));
    _mm256_mask_storeu_epi16(bucket + i, m, _mm512_cvtepi32_epi16(b));
  }
}

KVFLEET_TARGET_AVX512 void collect_avx512(const std::uint16_t* bucket, std::size_t n, int lo, int hi,
                                          std::vector<TokenId>& out) {
  const __m512i vlo = _mm512_set1_epi16(static_cast<short>(lo)), vhi = _mm512_set1_epi16(static_cast<short>(hi));
  for (std::size_t i = 0; i < n; i += 32) {
    const auto m = static_cast<__mmask32>(n - i >= 32 ? 0xffffffffu : (1u << (n - i)) - 1);
    const __m512i v = _mm512_maskz_loadu_epi16(m, bucket + i);
    std::uint32_t hit = _mm512_mask_cmp_epu16_mask(m, v, vlo, _MM_CMPINT_NLT) & _mm512_cmp_epu16_mask(v, vhi, _MM_CMPINT_LE);
    for (; hit != 0; hit &= hit - 1) out.push_back(static_cast<TokenId>(i + static_cast<std::size_t>(std::countr_zero(hit))));
  }
}

KVFLEET_TARGET_AVX512 std::size_t first_equal_avx512(std::span<const float> logits, float value) {
  const __m512 v = _mm512_set1_ps(value);
  const std::size_t n = logits.size();
  for (std::size_t i = 0; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    const __mmask16 eq = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, logits.data() + i), v, _CMP_EQ_OQ);
    if (eq != 0) return i + static_cast<std::size_t>(std::countr_zero(static_cast<unsigned>(eq)));
  }
  return n;
}

// The AVX2 passes where the generic loops do not vectorise (an early exit, a push_back per hit): 16 buckets
// (8 logits) a compare, a movemask, and only the hits walked.
KVFLEET_TARGET_AVX2 void collect_avx2(const std::uint16_t* bucket, std::size_t n, int lo, int hi,
                                      std::vector<TokenId>& out) {
  const __m256i vlo = _mm256_set1_epi16(static_cast<short>(lo)), vhi = _mm256_set1_epi16(static_cast<short>(hi));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bucket + i));
    // lo <= v <= hi, unsigned: max(v, lo) == v and min(v, hi) == v
    const __m256i in = _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_max_epu16(v, vlo), v),
                                        _mm256_cmpeq_epi16(_mm256_min_epu16(v, vhi), v));
    std::uint32_t hit = static_cast<std::uint32_t>(_mm256_movemask_epi8(in)) & 0x55555555u;  // a bit an id
    for (; hit != 0; hit &= hit - 1) out.push_back(static_cast<TokenId>(i + static_cast<std::size_t>(std::countr_zero(hit)) / 2));
  }
  for (; i < n; ++i)
    if (lo <= bucket[i] && bucket[i] <= hi) out.push_back(static_cast<TokenId>(i));
}

KVFLEET_TARGET_AVX2 std::size_t first_equal_avx2(std::span<const float> logits, float value) {
  const __m256 v = _mm256_set1_ps(value);
  const std::size_t n = logits.size();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(logits.data() + i), v, _CMP_EQ_OQ));
    if (eq != 0) return i + static_cast<std::size_t>(std::countr_zero(static_cast<unsigned>(eq)));
  }
  while (i < n && logits[i] != value) ++i;
  return i;
}
#endif

ScanPath& path_flag() {
  static ScanPath path = [] {
    const cpu::Isa isa = cpu::cpu_isa();  // KVFLEET_CPU_ISA can narrow what the CPU has
    if (scan_path_supported(ScanPath::avx512) && (isa == cpu::Isa::avx512 || isa == cpu::Isa::avx512bf16))
      return ScanPath::avx512;
    if (scan_path_supported(ScanPath::avx2) && isa != cpu::Isa::scalar) return ScanPath::avx2;
    return ScanPath::generic;
  }();
  return path;
}
bool avx512_on() { return path_flag() == ScanPath::avx512; }
bool avx2_on() { return path_flag() == ScanPath::avx2; }

// One block's weights (or not) and buckets, and their sums (or counts).
template <bool kWeights>
void bucket_block(const float* l, std::size_t n, const Bucketing& g, float* w, std::uint16_t* bucket, double* sum,
                  std::uint32_t* count, const float* prefetch) {
#if KVFLEET_SAMPLER_X86
  if (avx512_on()) {
    bucket_avx512<kWeights>(l, n, g, w, bucket, prefetch);
  } else {
    bucket_generic<kWeights>(l, n, g, w, bucket, prefetch);
  }
#else
  bucket_generic<kWeights>(l, n, g, w, bucket, prefetch);
#endif
  if constexpr (kWeights) {  // in id order per bucket (a zero weight adds nothing); 4 at a time schedules better
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      const double w0 = w[i], w1 = w[i + 1], w2 = w[i + 2], w3 = w[i + 3];
      sum[bucket[i]] += w0;
      sum[bucket[i + 1]] += w1;
      sum[bucket[i + 2]] += w2;
      sum[bucket[i + 3]] += w3;
    }
    for (; i < n; ++i) sum[bucket[i]] += w[i];
  } else {
    for (std::size_t i = 0; i < n; ++i) ++count[bucket[i]];
  }
}

}  // namespace

bool scan_path_supported(ScanPath path) {
  switch (path) {
    case ScanPath::avx512: return KVFLEET_SAMPLER_X86 && cpu::cpu_supports(cpu::Isa::avx512);
    case ScanPath::avx2: return KVFLEET_SAMPLER_X86 && cpu::cpu_supports(cpu::Isa::avx2);
    case ScanPath::generic: break;
  }
  return true;
}
ScanPath scan_path() { return path_flag(); }
void set_scan_path(ScanPath path) { path_flag() = scan_path_supported(path) ? path : ScanPath::generic; }

float scalar_weight(float l, float max_l, float t) { return weight(l, max_l, t); }

Range row_range(std::span<const float> logits) {
#if KVFLEET_SAMPLER_X86
  if (avx512_on()) return row_range_avx512(logits);
#endif
  return row_range_generic(logits);
}

Bucketing make_bucketing(Range range, float t) {
  const float width = std::min(88.0f, (range.max - range.min) / t);
  const float span = width > 0.0f ? width : 1.0f;
  return {range.max, t, span, static_cast<float>(kBuckets) / span};
}

void weigh_and_bucket(std::span<const float> logits, const Bucketing& g, float* w, std::uint16_t* bucket, double* sum,
                      const float* prefetch) {
  std::fill(sum, sum + kBuckets, 0.0);
  for (std::size_t at = 0; at < logits.size(); at += kBlock)
    bucket_block<true>(logits.data() + at, std::min(kBlock, logits.size() - at), g, w + at, bucket + at, sum, nullptr,
                       prefetch ? prefetch + at : nullptr);
}

void count_buckets(std::span<const float> logits, const Bucketing& g, std::uint16_t* bucket, std::uint32_t* count,
                   const float* prefetch) {
  std::fill(count, count + kBuckets, 0u);
  for (std::size_t at = 0; at < logits.size(); at += kBlock)
    bucket_block<false>(logits.data() + at, std::min(kBlock, logits.size() - at), g, nullptr, bucket + at, nullptr, count,
                        prefetch ? prefetch + at : nullptr);
}

void collect_buckets(const std::uint16_t* bucket, std::size_t n, int lo, int hi, std::vector<TokenId>& out) {
#if KVFLEET_SAMPLER_X86
  if (avx512_on()) return collect_avx512(bucket, n, lo, hi, out);
  if (avx2_on()) return collect_avx2(bucket, n, lo, hi, out);
#endif
  for (std::size_t i = 0; i < n; ++i)
    if (lo <= bucket[i] && bucket[i] <= hi) out.push_back(static_cast<TokenId>(i));
}

std::size_t first_equal(std::span<const float> logits, float v) {
#if KVFLEET_SAMPLER_X86
  if (avx512_on()) return first_equal_avx512(logits, v);
  if (avx2_on()) return first_equal_avx2(logits, v);
#endif
  return first_equal_generic(logits, v);
}

}  // namespace kvfleet::sampler_detail
