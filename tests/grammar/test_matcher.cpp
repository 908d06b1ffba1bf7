#include <doctest/doctest.h>

#include <random>

#include "engine/grammar/token_grammar.h"
#include "tests/grammar/grammar_test_util.h"

using namespace kvfleet;
using namespace kvfleet::grammar;
using namespace kvfleet::grammar::test;

namespace {

// The reference: a token is allowed iff a fresh byte matcher fed the text so far plus its bytes survives.
std::vector<std::uint32_t> brute_force_mask(const GrammarSpec& spec, const Vocabulary& vocab, const std::string& prefix) {
  std::vector<std::uint32_t> mask(bitmask_words(vocab.size()), 0);
  auto base = compile_bytes(spec);
  REQUIRE(base->feed(prefix));
  for (std::size_t id = 0; id < vocab.size(); ++id) {
    const auto tid = static_cast<TokenId>(id);
    bool ok;
    if (vocab.is_stop(tid)) {
      ok = base->can_end();
    } else {
      if (vocab.bytes(tid).empty()) continue;
      auto m = compile_bytes(spec);
      ok = m->feed(prefix) && m->feed(vocab.bytes(tid));
    }
    if (ok) mask[id / 32] |= 1u << (id % 32);
  }
  return mask;
}

std::vector<TokenId> allowed(const std::vector<std::uint32_t>& mask) {
  std::vector<TokenId> out;
  for (std::size_t id = 0; id < mask.size() * 32; ++id) {
    if ((mask[id / 32] >> (id % 32)) & 1u) out.push_back(static_cast<TokenId>(id));
  }
  return out;
}

// A small vocabulary where every token's bytes are easy to reason about; id 0 is the stop token.
std::shared_ptr<const Vocabulary> small_vocab() {
  std::vector<std::string> t{"", "{", "}", "\"", "a", "b", "ab", "\":", "\",\"", " ", "1", "12", "\"}", ",", ":",
                             "true", "tr", "[", "]", "\"a\"", "x\"", "\\", "n", "\"a", "é", "\xc3", "\xa9"};
  return std::make_shared<const Vocabulary>(t, std::vector<TokenId>{0});
}

// Random walk: at each step the matcher's mask must equal the reference; then a random allowed token.
void random_walks(const GrammarSpec& spec, std::shared_ptr<const Vocabulary> vocab, int walks, int steps, bool full_reference) {
  auto grammar = compile(spec, vocab);
  std::mt19937 rng(7);
  for (int w = 0; w < walks; ++w) {
    auto m = grammar->make_matcher();
    std::string text;
    std::vector<std::uint32_t> mask(bitmask_words(vocab->size()));
    for (int s = 0; s < steps && !m->is_terminated(); ++s) {
      m->fill_next_token_mask(mask);
      if (full_reference) REQUIRE(mask == brute_force_mask(spec, *vocab, text));
      const auto ids = allowed(mask);
      if (ids.empty()) break;  // the small vocabulary lacks the bytes the grammar needs next
      const TokenId pick = ids[rng() % ids.size()];
      REQUIRE(m->accept_token(pick));
      if (!vocab->is_stop(pick)) text += vocab->bytes(pick);
    }
    auto check = compile_bytes(spec);
    CHECK(check->feed(text));
  }
}

}  // namespace

TEST_CASE("matcher: masks equal the brute-force reference on random walks (small vocabulary)") {
  random_walks(schema(R"({"type":"object","properties":{"a":{"type":"string"},"ab":{"type":"boolean"}},"required":["ab"]})"),
               small_vocab(), 30, 25, true);
  random_walks(gbnf("root ::= \"[\" (\"1\" | \"12\" | \"ab\")* \"]\""), small_vocab(), 20, 10, true);
  random_walks(GrammarSpec{GrammarKind::json_object, "", {}}, small_vocab(), 20, 20, true);
}

TEST_CASE("matcher: masks equal the reference on the Llama-3 vocabulary (sampled tokens)") {
  const auto vocab = llama3_vocab();
  const auto spec = schema(R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},
     "n":{"type":"integer","minimum":0,"maximum":500},"ok":{"type":"boolean"}},"required":["name","n","ok"]})");
  auto grammar = compile(spec, vocab);
  std::mt19937 rng(11);
  for (int w = 0; w < 4; ++w) {
    auto m = grammar->make_matcher();
    std::string text;
    std::vector<std::uint32_t> mask(bitmask_words(vocab->size()));
    while (!m->is_terminated()) {
      m->fill_next_token_mask(mask);
      // The reference: every token of the 128k vocabulary fed byte by byte to a separate parser from the
      // text so far (no trie, no position tables).
      ParseEngine ref(static_cast<const CompiledGrammar&>(*grammar).automaton());
      const std::int32_t here = ref.feed(ref.root_set(), text);
      REQUIRE(here != ParseEngine::kDead);
      for (std::size_t id = 0; id < vocab->size(); ++id) {
        const auto tid = static_cast<TokenId>(id);
        bool ok = false;
        if (vocab->is_stop(tid)) ok = ref.can_end(here);
        else if (!vocab->bytes(tid).empty()) ok = ref.feed(here, vocab->bytes(tid)) != ParseEngine::kDead;
        if (ok != bitmask_allows(mask, tid)) FAIL("token " << id << " after '" << text << "'");
      }
      const auto ids = allowed(mask);
      REQUIRE_FALSE(ids.empty());
      const TokenId pick = ids[rng() % ids.size()];
      REQUIRE(m->accept_token(pick));
      if (!vocab->is_stop(pick)) text += vocab->bytes(pick);
    }
    CHECK(accepts(spec, text));
  }
}

TEST_CASE("matcher: rollback restores masks; stop tokens only where the grammar may end") {
  const auto vocab = small_vocab();
  auto g = compile(gbnf("root ::= \"ab\" \"1\"?"), vocab);
  auto m = g->make_matcher();
  std::vector<std::uint32_t> start(bitmask_words(vocab->size())), mask(start.size());
  m->fill_next_token_mask(start);
  CHECK(allowed(start) == std::vector<TokenId>{4, 6});
  CHECK_FALSE(m->accept_token(0));
  CHECK_FALSE(m->accept_token(5));
  REQUIRE(m->accept_token(6));
  m->fill_next_token_mask(mask);
  CHECK(allowed(mask) == std::vector<TokenId>{0, 10});
  CHECK_FALSE(m->is_terminated());
  REQUIRE(m->accept_token(10));
  CHECK(m->is_terminated());  // nothing can follow
  m->rollback(1);
  REQUIRE(m->accept_token(0));
  CHECK(m->is_terminated());
  m->rollback(2);
  m->fill_next_token_mask(mask);
  CHECK(mask == start);
  CHECK_FALSE(m->is_terminated());
}
