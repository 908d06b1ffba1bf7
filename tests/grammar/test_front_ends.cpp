#include <doctest/doctest.h>

#include "tests/grammar/grammar_test_util.h"

using namespace kvfleet::grammar;
using namespace kvfleet::grammar::test;

TEST_CASE("gbnf: rules, alternation, repetition, classes, literals") {
  const auto g = gbnf(R"(
root ::= greeting (" " name){1,2} "!"?   # a comment
greeting ::= "hi" | "hello"
name ::= [A-Z] [a-z]* | "\u00e9t\xc3\xa9"
)");
  CHECK(accepts(g, "hi Bob"));
  CHECK(accepts(g, "hello Bob Al!"));
  CHECK(accepts(g, "hi \xc3\xa9t\xc3\xa9"));
  CHECK_FALSE(accepts(g, "hi"));
  CHECK_FALSE(accepts(g, "hi bob"));
  CHECK_FALSE(accepts(g, "hi A B C"));
  CHECK_FALSE(accepts(g, "hey Bob"));
  CHECK(accepts(gbnf("root ::= [^a-c]+"), "xyz\xe2\x82\xac"));
  CHECK_FALSE(accepts(gbnf("root ::= [^a-c]+"), "xaz"));
  CHECK(accepts(gbnf("root ::= \"(\" root \")\" | \"x\""), "(((x)))"));
  CHECK_FALSE(accepts(gbnf("root ::= \"(\" root \")\" | \"x\""), "((x)"));
}

TEST_CASE("gbnf: errors name the problem") {
  CHECK_THROWS_WITH_AS(compile_bytes(gbnf("root ::= a\n")), doctest::Contains("'a' is used but not defined"), GrammarError);
  CHECK_THROWS_WITH_AS(compile_bytes(gbnf("root ::= root \"x\" | \"y\"")), doctest::Contains("left-recursive"), GrammarError);
  CHECK_THROWS_WITH_AS(compile_bytes(gbnf("x ::= \"a\"")), doctest::Contains("no 'root'"), GrammarError);
  CHECK_THROWS_AS(compile_bytes(gbnf("root ::= [a-")), GrammarError);
  CHECK_THROWS_WITH_AS(compile_bytes(gbnf("root ::= \"a\"{0,300000}")), doctest::Contains("too large"), GrammarError);
}

TEST_CASE("regex: classes, escapes, quantifiers, groups, anchors") {
  CHECK(accepts(regex(R"(^\d{3}-\w+(\.[a-z]{2,3})?$)"), "123-ab_c.com"));
  CHECK_FALSE(accepts(regex(R"(\d{3}-\w+)"), "12-abc"));
  CHECK(accepts(regex("(?:ab|cd)*e"), "abcdabe"));
  CHECK_FALSE(accepts(regex("(?:ab|cd)*e"), "abce"));
  CHECK(accepts(regex(R"([^\s"]+)"), "caf\xc3\xa9"));
  CHECK_FALSE(accepts(regex(R"([^\s"]+)"), "a b"));
  CHECK(accepts(regex("a{2,}?"), "aaaa"));
  CHECK_FALSE(accepts(regex("a{2,}"), "a"));
  CHECK_THROWS_WITH_AS(compile_bytes(regex("(?=a)")), doctest::Contains("lookaround"), GrammarError);
  CHECK_THROWS_WITH_AS(compile_bytes(regex(R"((a)\1)")), doctest::Contains("backreferences"), GrammarError);
}

TEST_CASE("choice") {
  const GrammarSpec c{GrammarKind::choice, "", {"yes", "no", "maybe so"}};
  CHECK(accepts(c, "maybe so"));
  CHECK_FALSE(accepts(c, "maybe"));
  CHECK_THROWS_AS(compile_bytes(GrammarSpec{GrammarKind::choice, "", {}}), GrammarError);
}

TEST_CASE("json_object: any object, bounded whitespace") {
  const GrammarSpec o{GrammarKind::json_object, "", {}};
  CHECK(accepts(o, R"({"a": [1, 2.5e3, {"b": null}], "c": "x\"\u00e9"})"));
  CHECK(accepts(o, "{}"));
  CHECK_FALSE(accepts(o, "[]"));
  CHECK_FALSE(accepts(o, R"({"a": 01})"));
  CHECK(accepts(o, "{" + std::string(20, ' ') + "}"));
  GrammarOptions compact;
  compact.whitespace_bound = 0;
  CHECK_FALSE(accepts(o, "{ }", compact));
  CHECK_FALSE(accepts(o, "{" + std::string(41, ' ') + "}"));
}

TEST_CASE("json schema: objects, required, optional, additionalProperties") {
  const auto s = schema(R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},
    "age":{"type":"integer","minimum":0,"maximum":120},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},
    "required":["name"]})");
  CHECK(accepts(s, R"({"name":"Bo","age":42,"tags":["a","b"]})"));
  CHECK(accepts(s, R"({"name":"Bo","tags":[]})"));
  CHECK(accepts(s, R"({ "name" : "Bob" })"));
  CHECK_FALSE(accepts(s, R"({"age":42})"));
  CHECK_FALSE(accepts(s, R"({"name":"Bobby"})"));
  CHECK_FALSE(accepts(s, R"({"name":"Bo","age":121})"));
  CHECK_FALSE(accepts(s, R"({"name":"Bo","age":-1})"));
  CHECK_FALSE(accepts(s, R"({"name":"Bo","tags":["a","b","a"]})"));
  CHECK_FALSE(accepts(s, R"({"name":"Bo","extra":1})"));
  const auto open = schema(R"({"properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})");
  CHECK(accepts(open, R"({"a":1,"b":"x","ab":"y"})"));
  CHECK_FALSE(accepts(open, R"({"a":1,"b":2})"));
  CHECK_FALSE(accepts(open, R"({"a":1,"a":"x"})"));  // a listed key never comes back as an extra one
}

TEST_CASE("json schema: numbers with bounds") {
  const auto n = schema(R"({"type":"number","minimum":-5,"exclusiveMaximum":10})");
  for (const char* ok : {"-5", "-4.99", "0", "9.999", "3", "-0.5"}) CHECK_MESSAGE(accepts(n, ok), ok);
  for (const char* bad : {"-5.01", "10", "10.0", "-6", "11", "1e3"}) CHECK_MESSAGE(!accepts(n, bad), bad);
  const auto i = schema(R"({"type":"integer","minimum":17,"maximum":1234})");
  for (int v = 0; v < 1500; ++v) CHECK(accepts(i, std::to_string(v)) == (v >= 17 && v <= 1234));
  CHECK_THROWS_WITH_AS(compile_bytes(schema(R"({"type":"number","minimum":0.5})")), doctest::Contains("integer values"), GrammarError);
}

TEST_CASE("json schema: $ref recursion, anyOf, oneOf, allOf, formats, patterns") {
  const auto tree = schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
    "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})");
  CHECK(accepts(tree, R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"));
  CHECK_FALSE(accepts(tree, R"({"v":1,"kids":[{"kids":[]}]})"));
  CHECK(accepts(schema(R"({"anyOf":[{"type":"string"},{"type":"null"}]})"), "null"));
  CHECK(accepts(schema(R"({"oneOf":[{"type":"string"},{"type":"integer"}]})"), "7"));
  CHECK_THROWS_WITH_AS(compile_bytes(schema(R"({"oneOf":[{"type":"integer"},{"type":"number"}]})")),
                       doctest::Contains("may both match"), GrammarError);
  const auto all = schema(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
    {"properties":{"b":{"type":"boolean"}},"required":["b"]}]})");
  CHECK(accepts(all, R"({"a":1,"b":true})"));
  CHECK_FALSE(accepts(all, R"({"a":1})"));
  CHECK(accepts(schema(R"({"type":"string","format":"date-time"})"), R"("2024-02-28T12:30:00Z")"));
  CHECK_FALSE(accepts(schema(R"({"type":"string","format":"date"})"), R"("2024-02-30")"));
  CHECK(accepts(schema(R"({"type":"string","format":"uuid"})"), R"("123e4567-e89b-12d3-a456-426614174000")"));
  CHECK(accepts(schema(R"({"type":"string","pattern":"^[a-z]+\"$"})"), R"("ab\"")"));
  CHECK(accepts(schema(R"({"type":"string","pattern":"b+"})"), R"("abbc")"));
  CHECK_FALSE(accepts(schema(R"({"type":"string","pattern":"b+"})"), R"("ac")"));
  CHECK(accepts(schema(R"({"type":"string","format":"uri"})"), R"("https://a.example/p?q=1&r=%20#frag")"));
  CHECK_FALSE(accepts(schema(R"({"type":"string","format":"uri"})"), R"("https://a.example/p q")"));
}

TEST_CASE("json schema: keywords next to anyOf/oneOf hold in every branch") {
  const auto any = schema(R"({"type":"string","anyOf":[{"maxLength":2},{"minLength":4}]})");
  CHECK(accepts(any, R"("ab")"));
  CHECK(accepts(any, R"("abcd")"));
  CHECK_FALSE(accepts(any, R"("abc")"));
  CHECK_FALSE(accepts(any, "7"));
  const auto one = schema(R"({"type":"object","required":["k"],"oneOf":[
    {"properties":{"k":{"const":"a"},"x":{"type":"integer"}},"required":["k","x"]},
    {"properties":{"k":{"const":"b"},"y":{"type":"boolean"}},"required":["k","y"]}]})");
  CHECK(accepts(one, R"({"k":"a","x":1})"));
  CHECK(accepts(one, R"({"k":"b","y":true})"));
  CHECK_FALSE(accepts(one, R"({"k":"a","y":true})"));
  CHECK_THROWS_WITH_AS(compile_bytes(schema(R"({"minimum":1,"oneOf":[{"type":"integer"},{"type":"number"}]})")),
                       doctest::Contains("may both match"), GrammarError);
}

TEST_CASE("json schema: unsupported keywords are errors naming keyword and path") {
  try {
    compile_bytes(schema(R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":3}}})"));
    FAIL("expected a GrammarError");
  } catch (const GrammarError& e) {
    CHECK(e.keyword() == "multipleOf");
    CHECK(e.schema_path() == "#/properties/n");
  }
  try {
    compile_bytes(schema(R"({"type":"array","uniqueItems":true})"));
    FAIL("expected a GrammarError");
  } catch (const GrammarError& e) {
    CHECK(e.keyword() == "uniqueItems");
  }
  CHECK_THROWS_AS(compile_bytes(schema(R"({"$ref":"other.json#/a"})")), GrammarError);
  CHECK_THROWS_AS(compile_bytes(schema("{not json")), GrammarError);
  CHECK_NOTHROW(compile_bytes(schema(R"({"title":"t","description":"d","examples":[1],"default":2,"type":"integer"})")));
}
