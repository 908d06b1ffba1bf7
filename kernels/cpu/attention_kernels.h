// The per-block steps of cpu::paged_attention (paged_attention.cpp), one set per instruction set.
// paged_attention.cpp drives a tile (rows x the GQA group's query heads, one kv head) block by block and
// calls these; every set computes the same bits, because each query's arithmetic is fixed by
// paged_attention.cpp's header comment whatever registers a kernel keeps it in.
#pragma once

#include <cstdint>

namespace kvfleet::cpu::detail {

constexpr std::int64_t kAttnKeys = 16;  // keys per transposed group (one AVX-512 register, two AVX2 ones)

// The running state of one query head: max, sum of exp, unnormalized output (head_dim floats).
struct AttnQuery {
  const float* q;
  float* acc;
  std::int32_t position;
  float m, l;
};

// Keys [0, n) of a block (n rows of d floats) into groups of 16 keys transposed ([dim][16 keys]),
// zero-padded to whole groups.
void transpose_keys_avx512(const float* k, std::int64_t n, std::int64_t d, float* kt);

// One block (keys start .. start + block_size - 1 of the sequence; kt: its keys, transpose_keys; v: its
// values, rows of d floats) into the running state of every query of qs[0, nq) whose position is >= start:
// scores, online softmax, V. w: room for nq x (block_size rounded up to 16) floats.
void attend_block_avx512(AttnQuery* qs, std::int64_t nq, std::int64_t start, std::int64_t block_size,
                         const float* kt, const float* v, std::int64_t d, float scale, float* w);

// Blocks of K/V that paged_attention prefetches ahead of the one it reads (default 1, or
// KVFLEET_CPU_ATTN_PREFETCH; 0: none): for benchmarks comparing in one process. Same bits either way.
void set_attention_prefetch_blocks(std::int64_t blocks);

}  // namespace kvfleet::cpu::detail
