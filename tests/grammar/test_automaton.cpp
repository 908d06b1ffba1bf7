#include <doctest/doctest.h>

#include <random>

#include "engine/grammar/automaton.h"
#include "engine/grammar/front_ends.h"
#include "engine/grammar/parse_engine.h"
#include "engine/grammar/token_grammar.h"
#include "tests/grammar/grammar_test_util.h"

using namespace kvfleet;
using namespace kvfleet::grammar;
using namespace kvfleet::grammar::test;

namespace {

Grammar front_end(const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarKind::gbnf: return parse_gbnf(spec.text);
    case GrammarKind::regex: return regex_grammar(spec.text);
    case GrammarKind::json_schema: return json_schema_grammar(spec.text, GrammarOptions{});
    default: return json_object_grammar(GrammarOptions{});
  }
}

// The automaton as the front end wrote it against the one compile() uses (small rules inlined, alike
// states merged): along random walks (mostly inside the language, sometimes a random byte), every next
// byte must leave both alive or both dead, and both must agree on whether the text can end.
void same_language(const GrammarSpec& spec, int walks) {
  const Automaton plain = build_automaton(front_end(spec), AutomatonLimits{});
  Grammar g = front_end(spec);
  inline_small_rules(g, kInlineNodes);
  Automaton optimised = build_automaton(g, AutomatonLimits{});
  const std::size_t before = optimised.states.size();
  merge_equivalent_states(optimised);
  CHECK(optimised.states.size() <= before);
  ParseEngine a(plain), b(optimised);
  std::mt19937 rng(5);
  for (int w = 0; w < walks; ++w) {
    std::int32_t x = a.root_set(), y = b.root_set();
    for (int step = 0; step < 60; ++step) {
      REQUIRE(a.can_end(x) == b.can_end(y));
      std::vector<std::uint8_t> alive;
      for (unsigned c = 0; c < 256; ++c) {
        const bool ax = a.step(x, static_cast<std::uint8_t>(c)) != ParseEngine::kDead;
        const bool by = b.step(y, static_cast<std::uint8_t>(c)) != ParseEngine::kDead;
        REQUIRE_MESSAGE(ax == by, "byte " << c << " at step " << step);
        if (ax) alive.push_back(static_cast<std::uint8_t>(c));
      }
      if (alive.empty()) break;
      const std::uint8_t c = alive[rng() % alive.size()];
      x = a.step(x, c);
      y = b.step(y, c);
    }
  }
}

}  // namespace

TEST_CASE("automaton: inlining small rules and merging alike states keep the language") {
  same_language(GrammarSpec{GrammarKind::json_object, "", {}}, 30);
  same_language(schema(R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},
      "tags":{"type":"array","items":{"enum":["a","b\u00e9"]},"maxItems":3},"when":{"type":"string","format":"date"},
      "n":{"type":"integer","minimum":-5,"maximum":120}},"required":["name"]})"), 30);
  same_language(schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"number"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"$ref":"#/$defs/node"})"), 20);
  same_language(gbnf("root ::= item (\", \" item)* \".\"\nitem ::= [a-z]+ | [0-9]{1,3} | \"é\" ws item\nws ::= [ ]?"), 20);
  same_language(regex(R"((ab|a)*c{2,4}[^x]?)"), 20);
}

TEST_CASE("matcher: masks equal the reference on the Llama-3 vocabulary inside long and bounded strings") {
  // Positions inside strings (bounded and not) are where a mask walk accepts whole trie subtrees at
  // once; the reference feeds every token byte by byte.
  const auto vocab = llama3_vocab();
  const auto spec = schema(R"({"type":"object","properties":{"s":{"type":"string","maxLength":12},
     "t":{"type":"string"}},"required":["s","t"]})");
  auto grammar = compile(spec, vocab);
  const auto& automaton = static_cast<const CompiledGrammar&>(*grammar).automaton();
  for (const std::string text : {R"({"s":")", R"({"s":"abcdefgh)", R"({"s":"abcdéfghij)", R"({"s":"x","t":")",
                                 R"({"s":"x","t":"héllo wörld )", "{\"s\":\"x\",\"t\":\"\xe4\xb8"}) {
    auto m = grammar->make_matcher();
    ParseEngine ref(automaton);
    const std::int32_t here = ref.feed(ref.root_set(), text);
    REQUIRE(here != ParseEngine::kDead);
    // Drive the matcher through the same bytes with the tokens of each single byte where they exist.
    std::string fed;
    for (const char c : text) {
      bool ok = false;
      for (std::size_t id = 0; id < vocab->size() && !ok; ++id) {
        if (vocab->bytes(static_cast<TokenId>(id)) == std::string(1, c)) ok = m->accept_token(static_cast<TokenId>(id));
      }
      REQUIRE(ok);
    }
    std::vector<std::uint32_t> mask(bitmask_words(vocab->size()));
    m->fill_next_token_mask(mask);
    std::size_t allowed = 0;
    for (std::size_t id = 0; id < vocab->size(); ++id) {
      const auto tid = static_cast<TokenId>(id);
      bool ok = false;
      if (vocab->is_stop(tid)) ok = ref.can_end(here);
      else if (!vocab->bytes(tid).empty()) ok = ref.feed(here, vocab->bytes(tid)) != ParseEngine::kDead;
      if (ok != bitmask_allows(mask, tid)) FAIL("token " << id << " after '" << text << "'");
      allowed += ok;
    }
    CHECK(allowed > 0);
  }
}
