// A handful of the official JSON Schema Test Suite's files (draft 4) against the JSON Schema front end;
// bench/schema_coverage.cpp runs them all and prints the coverage table.
#include <doctest/doctest.h>

#include "tests/grammar/grammar_test_util.h"
#include "tests/support/schema_suite.h"

using namespace kvfleet::grammar;

namespace {

std::vector<suite::SchemaResult> run(const std::string& stem) {
  return suite::run_file(test::kSourceDir + "/.deps/npm/node_modules/json-schema-test-suite/tests/draft4/" + stem + ".json", {});
}

}  // namespace

TEST_CASE("schema suite: no compiled grammar accepts an instance the schema forbids") {
  for (const char* stem : {"type", "enum", "required", "maxLength", "minLength", "items", "additionalItems", "allOf",
                           "anyOf", "ref", "maximum", "pattern", "properties", "additionalProperties"}) {
    for (const auto& r : run(stem)) {
      INFO(stem << ": " << r.description << ": " << r.schema);
      CHECK(r.violations() == 0);
      if (!r.compiled) CHECK_FALSE(r.refused_keyword.empty());  // a refusal names the keyword
    }
  }
}

TEST_CASE("schema suite: type, enum, anyOf (with a base schema) and allOf compile and match the suite exactly") {
  for (const char* stem : {"type", "enum", "anyOf", "allOf", "maxLength", "minLength", "required"}) {
    const auto results = run(stem);
    REQUIRE_FALSE(results.empty());
    for (const auto& r : results) {
      INFO(stem << ": " << r.description << ": " << r.schema << " " << r.error);
      CHECK(r.compiled);
      CHECK(r.narrower() == 0);
      CHECK(r.violations() == 0);
    }
  }
}

TEST_CASE("schema suite: refusals name the keyword (multipleOf, not, patternProperties, uniqueItems)") {
  for (const char* stem : {"multipleOf", "not", "patternProperties", "uniqueItems"}) {
    for (const auto& r : run(stem)) {
      INFO(stem << ": " << r.description);
      CHECK_FALSE(r.compiled);
      CHECK(r.refused_keyword == stem);
    }
  }
}
