// Batch invariance: a sequence's logits are bit-identical whether computed alone, in chunks, or next to
// other sequences, and whatever the thread count (the kernels fix every reduction order).
#include <doctest/doctest.h>

#include <cstring>

#include "kvfleet/make_model.h"
#include "runner_helpers.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

bool bit_equal(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("logits do not depend on chunking, batching or threads") {
  test::TempDir dir;
  MakeModelOptions o;
  o.dtype = DType::bf16;
  o.vocab = 200;
  make_model(o, dir.path());
  const Model model = Model::load(dir.path());
  const std::size_t vocab = 200;
  std::vector<TokenId> a(37), b(21);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<TokenId>((i * 13 + 5) % vocab);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<TokenId>((i * 7 + 3) % vocab);
  const auto alone = test::all_logits(model, a, 1);
  CHECK(bit_equal(alone.data(), test::all_logits(model, a, 2).data(), alone.size()));

  auto backend = make_cpu_backend(2);
  RunnerOptions ro;
  ro.num_blocks = 8;
  ro.max_batch_tokens = 64;
  ModelRunner runner(model, *backend, ro);
  const std::vector<std::int32_t> table_a{5, 1, 7}, table_b{0, 3};  // scattered blocks, not 0..n
  // Sequence a in chunks of 10, 17 and 10 tokens, each chunk batched with part of sequence b.
  std::vector<float> chunked;
  const std::size_t cuts[] = {0, 10, 27, 37};
  for (int step = 0; step < 3; ++step) {
    ForwardBatch batch;
    const auto span_a = std::span<const TokenId>(a).subspan(cuts[step], cuts[step + 1] - cuts[step]);
    const std::size_t b_from = static_cast<std::size_t>(step) * 7;
    batch.chunks.push_back({std::span<const TokenId>(b).subspan(b_from, 7), static_cast<std::int32_t>(b_from),
                            table_b, SeqChunk::Logits::last});
    batch.chunks.push_back({span_a, static_cast<std::int32_t>(cuts[step]), table_a, SeqChunk::Logits::all});
    const auto out = runner.forward(batch);
    REQUIRE(out.size() == (1 + span_a.size()) * vocab);
    chunked.insert(chunked.end(), out.begin() + static_cast<std::ptrdiff_t>(vocab), out.end());
  }
  REQUIRE(chunked.size() == alone.size());
  CHECK(bit_equal(chunked.data(), alone.data(), alone.size()));
  // And b's last logits (from the last step) equal b computed alone.
  const auto b_alone = test::all_logits(model, b, 2);
  ForwardBatch last;
  last.chunks.push_back({std::span<const TokenId>(b).subspan(20, 1), 20, table_b, SeqChunk::Logits::last});
  const auto out = runner.forward(last);
  CHECK(bit_equal(out.data(), b_alone.data() + 20 * vocab, vocab));
}
