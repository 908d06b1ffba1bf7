// Suffix decoding's parts: the suffix tree's counts, drafts and removal; the proposer's two trees, its bound on
// cached requests and its isolation of cache salts; the suffix keys of --speculative-config.
#include <doctest/doctest.h>

#include <random>

#include "engine/spec/suffix_proposer.h"
#include "engine/spec/suffix_tree.h"
#include "kvfleet/speculative.h"

using namespace kvfleet;
using namespace kvfleet::spec;

namespace {

using Tokens = std::vector<TokenId>;

SpeculativeConfig suffix_config(std::int32_t cached = 100, std::int32_t depth = 24) {
  SpeculativeConfig c;
  c.method = "suffix";
  c.num_speculative_tokens = 8;
  c.suffix_max_tree_depth = depth;
  c.suffix_max_cached_requests = cached;
  return c;
}

Tokens concat(const Tokens& a, const Tokens& b) {
  Tokens out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

Tokens random_tokens(std::mt19937& rng, std::size_t n, TokenId base = 1000) {
  Tokens out(n);
  for (auto& t : out) t = base + static_cast<TokenId>(rng() % 5000);
  return out;
}

// The request finishes with `prompt` + `outputs`.
void finish(SuffixProposer& p, std::uint64_t id, const std::string& salt, const Tokens& prompt, const Tokens& outputs) {
  const Tokens all = concat(prompt, outputs);
  p.finish(ProposeInput{id, salt, all, static_cast<std::int32_t>(prompt.size()), nullptr, {}, 0});
}

Tokens propose(SuffixProposer& p, std::uint64_t id, const std::string& salt, const Tokens& tokens, std::int32_t k = 8) {
  Tokens out;
  p.propose(ProposeInput{id, salt, tokens, static_cast<std::int32_t>(tokens.size()), nullptr, {}, 0}, k, out);
  return out;
}

}  // namespace

TEST_CASE("suffix tree: the most frequent continuation of the longest useful match, cut by probability and factor") {
  SuffixTree t(8);
  t.add(Tokens{1, 2, 3, 4, 5});
  t.add(Tokens{1, 2, 3, 4, 6});
  t.add(Tokens{1, 2, 3, 4, 6});
  // After 1 2 3: 4 always (3 of 3), then 6 (2 of 3): probabilities 1 and 2/3.
  SuffixDraft d = t.speculate(Tokens{9, 1, 2, 3}, 8, 1.0, 0.1);
  CHECK(d.tokens == Tokens{4, 6});
  CHECK(d.match_len == 3);
  CHECK(d.score == doctest::Approx(1.0 + 2.0 / 3.0));
  // min_token_prob above 2/3: only the certain token.
  CHECK(t.speculate(Tokens{1, 2, 3}, 8, 1.0, 0.7).tokens == Tokens{4});
  // max_spec_factor 0.5 over a 3-token match allows one draft; over a 1-token match none (floor).
  CHECK(t.speculate(Tokens{1, 2, 3}, 8, 0.5, 0.1).tokens == Tokens{4});
  CHECK(t.speculate(Tokens{7, 7, 3}, 8, 0.5, 0.1).tokens.empty());
  // max_tokens caps the draft.
  CHECK(t.speculate(Tokens{1, 2, 3}, 1, 1.0, 0.1).tokens == Tokens{4});
  // Nothing known after the pattern: no draft.
  CHECK(t.speculate(Tokens{6}, 8, 1.0, 0.0).tokens.empty());
  CHECK(t.speculate(Tokens{42}, 8, 1.0, 0.0).tokens.empty());
  // Ties go to the smaller token id: deterministic.
  SuffixTree tie(4);
  tie.add(Tokens{1, 9});
  tie.add(Tokens{1, 8});
  CHECK(tie.speculate(Tokens{1}, 1, 1.0, 0.0).tokens == Tokens{8});
}

TEST_CASE("suffix tree: the depth bounds both the stored substrings and match + drafts") {
  SuffixTree t(4);
  t.add(Tokens{1, 2, 3, 4, 5, 6, 7});
  // 7 tokens, substrings of length <= 4: 7 + 6 + 5 + 4 distinct nodes.
  CHECK(t.num_nodes() == 22);
  // Match + drafts fit in depth 4: a 3-token match drafts 1, a 2-token match 2, a 1-token match 3; the
  // highest score wins.
  SuffixDraft d = t.speculate(Tokens{1, 2, 3}, 8, 4.0, 0.0);
  CHECK(d.tokens == Tokens{4, 5, 6});
  CHECK(d.match_len == 1);
  // With factor 1 a 1-token match drafts 1, a 2-token match 2 (the best), a 3-token match 1.
  d = t.speculate(Tokens{1, 2, 3}, 8, 1.0, 0.0);
  CHECK(d.tokens == Tokens{4, 5});
  CHECK(d.match_len == 2);
}

TEST_CASE("suffix tree: remove exactly undoes add, in any order; a stream adds as add does") {
  std::mt19937 rng(7);
  std::vector<Tokens> seqs;
  for (int i = 0; i < 20; ++i) {
    Tokens s = random_tokens(rng, 30 + rng() % 40, 0);
    for (auto& x : s) x %= 6;  // a small alphabet: many shared substrings
    seqs.push_back(s);
  }
  SuffixTree all(6), some(6);
  for (const Tokens& s : seqs) all.add(s);
  for (std::size_t i = 10; i < seqs.size(); ++i) some.add(seqs[i]);
  for (std::size_t i = 0; i < 10; ++i) all.remove(seqs[i]);
  CHECK(all.num_nodes() == some.num_nodes());
  for (const Tokens& s : seqs)
    for (std::size_t end = 1; end <= s.size(); end += 7) {
      const auto pattern = std::span<const TokenId>(s).first(end);
      const SuffixDraft a = all.speculate(pattern, 6, 2.0, 0.0), b = some.speculate(pattern, 6, 2.0, 0.0);
      CHECK(a.tokens == b.tokens);
      CHECK(a.score == doctest::Approx(b.score));
    }
  for (std::size_t i = 10; i < seqs.size(); ++i) all.remove(seqs[i]);
  CHECK(all.num_nodes() == 0);
  CHECK(all.empty());
  SuffixTree streamed(6), added(6);
  SuffixTree::Stream st;
  for (const TokenId x : seqs[0]) st.append(streamed, x);
  added.add(seqs[0]);
  CHECK(streamed.num_nodes() == added.num_nodes());
  streamed.remove(seqs[0]);
  CHECK(streamed.num_nodes() == 0);
}

TEST_CASE("suffix proposer: drafts from the request's own prompt and outputs") {
  SuffixProposer p(suffix_config());
  const Tokens call{50, 51, 52, 53, 54, 55, 56};
  Tokens seq = concat(Tokens{1, 2, 3}, call);
  seq.push_back(9);
  seq.insert(seq.end(), call.begin(), call.begin() + 3);  // the call again: the rest follows
  CHECK(propose(p, 1, "", seq, 4) == Tokens{53, 54, 55});  // factor 1.0 over a 3-token match
  seq.push_back(53);
  CHECK(propose(p, 1, "", seq, 8) == Tokens{54, 55, 56, 9});  // the tree grew with the new token
  CHECK(p.num_live() == 1);
  finish(p, 1, "", Tokens(seq.begin(), seq.begin() + 3), Tokens(seq.begin() + 3, seq.end()));
  CHECK(p.num_live() == 0);
}

TEST_CASE("suffix proposer: earlier outputs draft for later requests of the same cache salt only") {
  std::mt19937 rng(3);
  const Tokens call = random_tokens(rng, 20);  // a tool call an earlier request made
  auto run = [&](const std::string& first_salt, const std::string& second_salt) {
    SuffixProposer p(suffix_config());
    finish(p, 1, first_salt, random_tokens(rng, 30), call);
    // A later request of another conversation starts the same call: its own tokens have never seen it.
    Tokens seq = random_tokens(rng, 30);
    seq.insert(seq.end(), call.begin(), call.begin() + 6);
    return propose(p, 2, second_salt, seq);
  };
  CHECK(run("tenant-a", "tenant-a") == Tokens(call.begin() + 6, call.begin() + 12));  // 6 matched, factor 1
  CHECK(run("", "") == Tokens(call.begin() + 6, call.begin() + 12));
  CHECK(run("tenant-a", "tenant-b").empty());
  CHECK(run("tenant-a", "").empty());
  CHECK(run("", "tenant-a").empty());
}

TEST_CASE("suffix proposer: at most max_cached_requests earlier outputs, oldest out first; memory follows") {
  std::mt19937 rng(11);
  constexpr int kCached = 4;
  SuffixProposer p(suffix_config(kCached));
  std::vector<Tokens> outputs;
  std::vector<std::string> salts;
  for (int i = 0; i < 40; ++i) {
    outputs.push_back(random_tokens(rng, 50 + rng() % 50));
    std::string salt;
    if (i % 3 == 0) salt = std::to_string(i) + "-tenant";
    salts.push_back(salt);
    // A live request too, finished at once: its own tree is dropped with it.
    propose(p, 1000 + static_cast<std::uint64_t>(i), salts.back(), concat(Tokens{1, 2, 3}, outputs.back()));
    finish(p, 1000 + static_cast<std::uint64_t>(i), salts.back(), Tokens{1, 2, 3}, outputs.back());
    CHECK(p.num_cached_requests() == static_cast<std::size_t>(std::min(i + 1, kCached)));
    CHECK(p.num_live() == 0);
  }
  // The nodes are those of the last kCached outputs alone, in their salts' trees (the others' trees dropped).
  SuffixProposer fresh(suffix_config(kCached));
  for (std::size_t i = outputs.size() - kCached; i < outputs.size(); ++i)
    finish(fresh, i, salts[i], Tokens{1, 2, 3}, outputs[i]);
  CHECK(p.num_nodes() == fresh.num_nodes());
  CHECK(p.num_salts() == fresh.num_salts());
  CHECK(p.num_nodes() <= kCached * 100 * 24);
  // An evicted output drafts nothing; a kept one does.
  auto starts_like = [&](std::size_t i) {
    Tokens seq{7, 7};
    seq.insert(seq.end(), outputs[i].begin(), outputs[i].begin() + 8);
    return propose(p, 5000 + i, salts[i], seq);
  };
  CHECK(starts_like(0).empty());
  CHECK(starts_like(outputs.size() - 5).empty());
  CHECK(starts_like(outputs.size() - 1) == Tokens(outputs.back().begin() + 8, outputs.back().begin() + 16));
  // max_cached_requests 0: no earlier outputs at all.
  SuffixProposer none(suffix_config(0));
  finish(none, 1, "", Tokens{1}, outputs[0]);
  CHECK(none.num_cached_requests() == 0);
  CHECK(none.num_nodes() == 0);
}

TEST_CASE("speculative_config: the suffix method's keys, defaults and refusals") {
  SpeculativeConfig c = parse_speculative_config(R"({"method":"suffix"})");
  CHECK(c.method == "suffix");
  CHECK(c.num_speculative_tokens == 16);  // min(max_tree_depth 24, 16)
  CHECK(c.suffix_max_tree_depth == 24);
  CHECK(c.suffix_max_cached_requests == 10000);
  CHECK(c.suffix_max_spec_factor == 1.0);
  CHECK(c.suffix_min_token_prob == doctest::Approx(0.1));
  c = parse_speculative_config(
      R"({"method":"suffix","num_speculative_tokens":5,"suffix_decoding_max_tree_depth":12,"suffix_decoding_max_cached_requests":0,)"
      R"("suffix_decoding_max_spec_factor":2.5,"suffix_decoding_min_token_prob":0})");
  CHECK(c.num_speculative_tokens == 5);
  CHECK(c.suffix_max_tree_depth == 12);
  CHECK(c.suffix_max_cached_requests == 0);
  CHECK(c.suffix_max_spec_factor == 2.5);
  CHECK(c.suffix_min_token_prob == 0.0);
  CHECK(parse_speculative_config(R"({"method":"suffix","suffix_decoding_max_tree_depth":6})").num_speculative_tokens == 6);
  auto err = [](const char* text) {
    try {
      parse_speculative_config(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(err(R"({"method":"suffix","suffix_decoding_max_tree_depth":0})").find("suffix_decoding_max_tree_depth must be") != std::string::npos);
  CHECK(err(R"({"method":"suffix","suffix_decoding_max_tree_depth":65})").find("suffix_decoding_max_tree_depth must be") != std::string::npos);
  CHECK(err(R"({"method":"suffix","suffix_decoding_max_cached_requests":-1})").find("suffix_decoding_max_cached_requests") != std::string::npos);
  CHECK(err(R"({"method":"suffix","suffix_decoding_max_spec_factor":0})").find("suffix_decoding_max_spec_factor") != std::string::npos);
  CHECK(err(R"({"method":"suffix","suffix_decoding_min_token_prob":1.5})").find("suffix_decoding_min_token_prob") != std::string::npos);
  CHECK(err(R"({"method":"suffix","suffix_decoding_min_token_prob":"0.1"})").find("must be a number") != std::string::npos);
  CHECK(err(R"({"method":"suffix","prompt_lookup_max":3})").find("prompt_lookup_max applies to method \"ngram\" only") != std::string::npos);
  CHECK(err(R"({"method":"ngram","num_speculative_tokens":2,"suffix_decoding_max_tree_depth":8})").find("applies to method \"suffix\" only") != std::string::npos);
}
