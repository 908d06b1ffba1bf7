// The constraint after the reasoning: free tokens inside <think>...</think>, the grammar after it (or from
// the first token when the output does not open the reasoning), rolled back across the boundary.
#include <doctest/doctest.h>

#include "engine/server/reasoning_grammar.h"
#include "support/sequence_grammar.h"

using namespace kvfleet;

namespace {

constexpr TokenId kOpen = 40, kClose = 41, eos = 2;
constexpr std::size_t vocab = 50;

std::vector<TokenId> allowed(TokenMatcher& m) {
  std::vector<std::uint32_t> mask(bitmask_words(vocab));
  m.fill_next_token_mask(mask);
  std::vector<TokenId> out;
  for (TokenId id = 0; id < 64; ++id)
    if (bitmask_allows(mask, id)) out.push_back(id);
  return out;
}

}  // namespace

TEST_CASE("after_reasoning: outside first (qwen3), the grammar or the opening; free inside; the grammar after") {
  const auto inner = std::make_shared<test::SequenceGrammar>(std::vector<std::vector<TokenId>>{{7, 8}}, std::vector<TokenId>{eos}, vocab);
  const auto g = server::after_reasoning(inner, {kOpen, kClose, false});
  auto m = g->make_matcher();
  CHECK(allowed(*m) == std::vector<TokenId>{7, kOpen});
  CHECK(!m->accept_token(9));
  REQUIRE(m->accept_token(kOpen));
  CHECK(allowed(*m).size() == vocab);  // anything while reasoning
  REQUIRE(m->accept_token(9));
  REQUIRE(m->accept_token(kClose));
  CHECK(allowed(*m) == std::vector<TokenId>{7});
  REQUIRE(m->accept_token(7));
  m->rollback(2);  // 7 and </think>: back inside the reasoning
  CHECK(allowed(*m).size() == vocab);
  REQUIRE(m->accept_token(kClose));
  REQUIRE(m->accept_token(7));
  REQUIRE(m->accept_token(8));
  CHECK(!m->is_terminated());
  REQUIRE(m->accept_token(eos));
  CHECK(m->is_terminated());
  m->rollback(6);  // all of it: the start again
  CHECK(allowed(*m) == std::vector<TokenId>{7, kOpen});
  // Not opened: the grammar from the first token on.
  auto direct = g->make_matcher();
  REQUIRE(direct->accept_token(7));
  CHECK(allowed(*direct) == std::vector<TokenId>{8});
  CHECK(!direct->accept_token(kOpen));
  direct->rollback(1);
  CHECK(allowed(*direct) == std::vector<TokenId>{7, kOpen});
}

TEST_CASE("after_reasoning: inside first (deepseek_r1), free until the closing token") {
  const auto inner = std::make_shared<test::SequenceGrammar>(std::vector<std::vector<TokenId>>{{7}}, std::vector<TokenId>{eos}, vocab);
  auto m = server::after_reasoning(inner, {std::nullopt, kClose, true})->make_matcher();
  CHECK(allowed(*m).size() == vocab);
  REQUIRE(m->accept_token(3));
  REQUIRE(m->accept_token(kClose));
  CHECK(allowed(*m) == std::vector<TokenId>{7});
}
