// Expression semantics against jinja2: random expressions over mixed-type values (numbers, strings
// with non-ASCII text, lists, dicts, none, undefined) through operators, filters, tests, subscripts
// and methods, each printed with {{ }}. Where jinja2 fails, kvfleet must fail too.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <random>

#include "tests/chat_template/reference_harness.h"

using namespace kvfleet;
using namespace kvfleet::test;

namespace {

class ExpressionGenerator {
 public:
  explicit ExpressionGenerator(unsigned seed) : rng_(seed) {}

  std::string expr(int depth) {
    if (depth >= 3) return atom();
    switch (std::uniform_int_distribution<int>(0, 9)(rng_)) {
      case 0: return atom();
      case 1: return "(" + expr(depth + 1) + " " + pick(kBinary) + " " + expr(depth + 1) + ")";
      case 2: return "(" + expr(depth + 1) + " " + pick(kCompare) + " " + expr(depth + 1) + ")";
      case 3: return "(" + expr(depth + 1) + "|" + pick(kFilters) + ")";
      case 4: return "(" + expr(depth + 1) + " is " + pick(kTests) + ")";
      case 5: return "(" + pick({"-", "not "}) + expr(depth + 1) + ")";
      // jinja2 folds constant subexpressions at compile time, where a failing subscript becomes
      // undefined instead of an error; `yes` (a variable) keeps the subscripted value a runtime one.
      case 6: return "(" + expr(depth + 1) + " if yes else 0)" + pick(kSubscripts);
      case 7: return "(" + expr(depth + 1) + pick(kMethods) + ")";
      case 8: return "(" + expr(depth + 1) + " if " + expr(depth + 1) + " else " + expr(depth + 1) + ")";
      default: return "[" + expr(depth + 1) + ", " + expr(depth + 1) + "]";
    }
  }

 private:
  using Options = std::vector<std::string>;
  const std::string& pick(const Options& options) {
    return options[std::uniform_int_distribution<size_t>(0, options.size() - 1)(rng_)];
  }
  std::string atom() { return pick(kAtoms); }

  inline static const Options kAtoms = {
      "1", "0", "-3", "7", "2.5", "0.1", "1e3", "-0.5", "'ab'", "''", "'Hé Wörld'", "' pad '", "'a,b'", "'3'",
      "none", "true", "false", "xs", "d", "s", "n", "f", "missing", "[1, 'a']", "[]", "{'k': 1, 'j': 'v'}",
      "(1, 2)", "users", "'日本'"};
  inline static const Options kBinary = {"+", "-", "*", "/", "//", "%", "~", "and", "or", "**"};
  inline static const Options kCompare = {"==", "!=", "<", ">", "<=", ">=", "in", "not in"};
  inline static const Options kFilters = {
      "length", "string", "list", "first", "last", "upper", "lower", "trim", "int", "float", "abs", "round",
      "tojson", "default('z')", "join(',')", "sort", "unique|list", "reverse|list", "select|list",
      "map('string')|list", "count", "dictsort", "items|list", "sum", "min", "max", "capitalize", "title",
      "replace('a', 'X')", "tojson(indent=1)", "default('z', true)", "map(attribute='name')|list",
      "selectattr('active')|list", "rejectattr('age', 'gt', 26)|list", "indent(2)", "int(5)", "round(1)",
      "join('-', attribute='name')", "wordcount"};  // not e/safe: a Markup inside a list prints as Markup(...)
  inline static const Options kTests = {"defined", "none", "string", "number", "mapping", "iterable", "sequence",
                                        "integer", "float", "boolean", "true", "false", "odd", "even",
                                        "not none", "not defined", "divisibleby(2)", "eq(1)", "lower"};
  inline static const Options kSubscripts = {"[0]", "[-1]", "[1:]", "[::-1]", "['k']", "[:1]", ".k", ".name",
                                             "[0:5:2]"};
  inline static const Options kMethods = {".upper()", ".strip()", ".split()", ".startswith('a')", ".get('k')",
                                          ".keys()|list", ".items()|list", ".values()|list", ".split(',')",
                                          ".replace('a', 'b')", ".title()", ".lstrip('H')", ".endswith(('b', 'd'))"};
  std::mt19937 rng_;
};

const char* kExtra = R"({
  "yes": true, "xs": [3, 1, 2], "d": {"b": 1, "a": 2, "k": "kv"}, "s": "Hello World", "n": null, "f": 2.5,
  "users": [{"name": "Ann", "age": 30, "active": true}, {"name": "bob", "age": 25, "active": false}]})";

}  // namespace

TEST_CASE("generated expressions evaluate like jinja2") {
  if (!reference_available()) return;
  const char* seed = std::getenv("KVFLEET_FUZZ_SEED");  // explore other seeds by hand
  ExpressionGenerator gen(seed ? static_cast<unsigned>(std::stoul(seed)) : 7u);
  const auto extra = boost::json::parse(kExtra).as_object();
  std::vector<std::unique_ptr<ChatTemplate>> owned;
  std::vector<RefCase> cases;
  std::vector<const ChatTemplate*> templates;
  const int count = 600;
  for (int i = 0; i < count; ++i) {
    RefCase c;
    c.source = "{{ " + gen.expr(0) + " }}";
    c.name = "expr" + std::to_string(i) + ": " + c.source;
    c.extra = extra;
    try {
      owned.push_back(std::make_unique<ChatTemplate>(ChatTemplate::from_string(c.source)));
    } catch (const TemplateError& e) {
      FAIL_CHECK("cannot parse " << c.name << ": " << std::string(e.what()));
      continue;
    }
    templates.push_back(owned.back().get());
    cases.push_back(std::move(c));
  }
  const auto diffs = mismatches(cases, templates);
  for (const auto& d : diffs) FAIL_CHECK(d);
  CHECK(diffs.empty());
  MESSAGE((cases.size() - diffs.size()) << "/" << count << " generated expressions match jinja2");
}
