// Speculative decoding's parts: the config's keys and errors, the n-gram proposer's rule, and the
// acceptance rule's distribution.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "engine/spec/proposer.h"
#include "engine/spec/verify.h"
#include "kvfleet/sampler.h"
#include "kvfleet/speculative.h"

using namespace kvfleet;

TEST_CASE("speculative_config: vLLM's keys and defaults") {
  SpeculativeConfig c = parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":2})");
  CHECK(c.method == "ngram");
  CHECK(c.num_speculative_tokens == 4);
  CHECK(c.prompt_lookup_max == 3);
  CHECK(c.prompt_lookup_min == 2);
  CHECK(c.disable_by_batch_size == SpeculativeConfig::kDefaultDisableByBatchSize);
  c = parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":2})");
  CHECK(c.prompt_lookup_max == 5);
  CHECK(c.prompt_lookup_min == 5);
  c = parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":4})");
  CHECK(c.prompt_lookup_min == 4);
  c = parse_speculative_config(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":2,"disable_by_batch_size":3})");
  CHECK(c.prompt_lookup_max == 2);
  CHECK(c.disable_by_batch_size == 3);
}

TEST_CASE("speculative_config: a bad value is refused naming its key") {
  auto err = [](const char* text) {
    try {
      parse_speculative_config(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(err("{") .find("not valid JSON") != std::string::npos);
  CHECK(err("[1]").find("JSON object") != std::string::npos);
  CHECK(err(R"({"num_speculative_tokens":2})").find("method is required") != std::string::npos);
  CHECK(err(R"({"method":"ngram"})").find("num_speculative_tokens is required") != std::string::npos);
  CHECK(err(R"({"method":"bogus","num_speculative_tokens":2})").find("method must be") != std::string::npos);
  CHECK(err(R"({"method":"eagle","num_speculative_tokens":2})").find("not implemented") != std::string::npos);
  CHECK(err(R"({"method":"draft_model","num_speculative_tokens":2})").find("model is required") != std::string::npos);
  CHECK(err(R"({"method":"ngram","model":"x","num_speculative_tokens":2})").find("model applies to method \"draft_model\" only") != std::string::npos);
  CHECK(err(R"({"method":"draft_model","model":7,"num_speculative_tokens":2})").find("model must be a non-empty string") != std::string::npos);
  CHECK(err(R"({"method":"draft_model","model":"x"})").find("num_speculative_tokens is required") != std::string::npos);
  CHECK(err(R"({"method":"draft_model","model":"x","num_speculative_tokens":2,"prompt_lookup_max":3})").find("prompt_lookup_max applies") != std::string::npos);
  CHECK(err(R"({"method":"ngram","num_speculative_tokens":0})").find("num_speculative_tokens must be") != std::string::npos);
  CHECK(err(R"({"method":"ngram","num_speculative_tokens":"4"})").find("num_speculative_tokens must be an integer") != std::string::npos);
  CHECK(err(R"({"method":"ngram","num_speculative_tokens":99})").find("num_speculative_tokens must be") != std::string::npos);
  CHECK(err(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":0})").find("prompt_lookup_min must be") != std::string::npos);
  CHECK(err(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_min":4,"prompt_lookup_max":2})").find("prompt_lookup_min must not exceed") != std::string::npos);
  CHECK(err(R"({"method":"ngram","num_speculative_tokens":2,"disable_by_batch_size":0})").find("disable_by_batch_size") != std::string::npos);
  CHECK(err(R"({"method":"ngram","num_speculative_tokens":2,"typo":1})").find("typo is not a key") != std::string::npos);
}

TEST_CASE("ngram proposer: the longest n first, its earliest occurrence, at most k tokens") {
  spec::NgramProposer p(1, 3);
  std::vector<TokenId> out;
  // ... 1 2 3 | 9 9 ... 1 2 3 -> the 3-gram "1 2 3" matched at 0: drafts are what followed it.
  p.propose(std::vector<TokenId>{1, 2, 3, 7, 8, 5, 1, 2, 3}, 2, out);
  CHECK(out == std::vector<TokenId>{7, 8});
  // The 3-gram "4 2 3" never occurred; the 2-gram "2 3" did, first at 1 (then at 4).
  p.propose(std::vector<TokenId>{1, 2, 3, 6, 2, 3, 5, 4, 2, 3}, 4, out);
  CHECK(out == std::vector<TokenId>{6, 2, 3, 5});
  // Only the 1-gram matches; drafts stop at the end of the known tokens.
  p.propose(std::vector<TokenId>{5, 6, 7, 5}, 8, out);
  CHECK(out == std::vector<TokenId>{6, 7, 5});
  // Nothing repeats: no drafts.
  p.propose(std::vector<TokenId>{1, 2, 3, 4}, 4, out);
  CHECK(out.empty());
  // prompt_lookup_min = 2: a 1-gram match is not enough.
  spec::NgramProposer strict(2, 3);
  strict.propose(std::vector<TokenId>{5, 6, 7, 5}, 4, out);
  CHECK(out.empty());
  strict.propose(std::vector<TokenId>{5, 6, 7, 5, 6}, 4, out);
  CHECK(out == std::vector<TokenId>{7, 5, 6});
  p.propose(std::vector<TokenId>{1, 1}, 0, out);
  CHECK(out.empty());
}

TEST_CASE("accept_drafts: greedy keeps drafts while the target agrees, then the target's token") {
  const std::vector<TokenId> target{4, 5, 6, 7};
  auto row = [&](std::size_t j) { return target[j]; };
  std::vector<TokenId> out;
  CHECK(spec::accept_drafts(std::vector<TokenId>{4, 5, 6}, row, out) == 3);
  CHECK(out == std::vector<TokenId>{4, 5, 6, 7});  // all accepted + the bonus token
  out.clear();
  CHECK(spec::accept_drafts(std::vector<TokenId>{4, 9, 6}, row, out) == 1);
  CHECK(out == std::vector<TokenId>{4, 5});
  out.clear();
  CHECK(spec::accept_drafts(std::vector<TokenId>{}, row, out) == 0);
  CHECK(out == std::vector<TokenId>{4});
}

namespace {

// Pearson's chi-square of `count` (n draws) against `p`.
double chi_square(const std::vector<double>& count, const std::vector<double>& p, double n) {
  double x = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) x += (count[i] - n * p[i]) * (count[i] - n * p[i]) / (n * p[i]);
  return x;
}

}  // namespace

TEST_CASE("accept_drafts: sampled tokens follow the target's distribution whatever the draft") {
  // Two positions over a 6-token vocabulary; the first token's distribution is p0, the second's p1 (given any
  // first token). The draft guesses a likely, an unlikely and an impossible token.
  const std::vector<float> logits0{2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -30.0f};
  const std::vector<float> logits1{0.0f, 0.3f, 1.2f, -0.4f, 0.9f, 0.1f};
  SamplingParams sp;
  sp.temperature = 1.0f;
  auto probs = [&](const std::vector<float>& l) {
    std::vector<double> p(l.size());
    double z = 0.0;
    for (std::size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp(static_cast<double>(l[i]));
    for (double& x : p) x /= z;
    return p;
  };
  const std::vector<double> p0 = probs(logits0), p1 = probs(logits1);
  for (const TokenId draft : {TokenId{0}, TokenId{3}, TokenId{5}}) {
    CAPTURE(draft);
    const int n = 20000;
    std::vector<double> first(6, 0.0), second(6, 0.0);
    double accepted = 0.0;
    for (int s = 0; s < n; ++s) {
      sp.seed = static_cast<std::uint64_t>(s) + 1;
      std::vector<TokenId> out;
      const auto a = spec::accept_drafts(std::vector<TokenId>{draft, 2}, [&](std::size_t j) {
        return sample(j == 0 ? logits0 : logits1, sp, j);
      }, out);
      first[static_cast<std::size_t>(out[0])] += 1;
      if (out.size() > 1) second[static_cast<std::size_t>(out[1])] += 1;
      accepted += a > 0 ? 1 : 0;
    }
    // Token 5 has probability ~1e-14: leave it out of the test (its expected count is 0).
    std::vector<double> f(first.begin(), first.end() - 1), q(p0.begin(), p0.end() - 1);
    CHECK(chi_square(f, q, n) < 20.5);  // 5 cells, 4 degrees of freedom: p = 0.0004
    CHECK(first[5] == 0);
    CHECK(std::abs(accepted / n - p0[static_cast<std::size_t>(draft)]) < 4 * std::sqrt(0.25 / n));
    double m = 0.0;
    for (double c : second) m += c;
    if (m > 1000) CHECK(chi_square(second, p1, m) < 22.5);  // 6 cells, 5 degrees of freedom
  }
}
