// The interpreter on its own, with exact expected strings (values checked against jinja2 by hand; the
// differential tests in the other files cover far more, but need Python).
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <chrono>
#include <thread>

#include "kvfleet/chat_template.h"

using kvfleet::ChatTemplate;
using kvfleet::ChatTemplateOptions;
using kvfleet::TemplateError;

namespace {

std::string render(const std::string& src, const char* extra = "{}", const char* messages = "[]") {
  ChatTemplateOptions opts;
  opts.extra_context = boost::json::parse(extra).as_object();
  return ChatTemplate::from_string(src, "<s>", "</s>").render(boost::json::parse(messages).as_array(), opts);
}

const char* kXs = R"({"xs": [1, 2, 3], "d": {"b": 1, "a": 2}, "s": "héllo"})";

}  // namespace

TEST_CASE("whitespace: trim_blocks, lstrip_blocks, - and + markers, trailing newline") {
  CHECK(render("a\n{% if true %}\nb\n{% endif %}\nc") == "a\nb\nc");
  CHECK(render("  {% if true %}x{% endif %}  \n  y") == "x  \n  y");
  CHECK(render("<ul>\n  {% for i in xs %}\n    <li>{{ i }}</li>\n  {% endfor %}\n</ul>\n", kXs) ==
        "<ul>\n    <li>1</li>\n    <li>2</li>\n    <li>3</li>\n</ul>");
  CHECK(render("a  {%- if true %} b {% endif -%}  \n c") == "a b c");
  CHECK(render("  {%+ if true %}x{% endif %}") == "  x");
  CHECK(render("{# note #}\nx {#- strip -#}  y") == "xy");
  CHECK(render("{{ 'v' }}\n{{ 'w' }}") == "v\nw");  // trim_blocks does not apply to {{ }}
  CHECK(render("a\r\nb\r\n") == "a\nb");
  CHECK(render("{% raw %}{{ x }}{% endraw %}") == "{{ x }}");
}

TEST_CASE("for loops: loop variables, filters, else, unpacking, break/continue") {
  CHECK(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}"
               "{{ loop.length }} {% endfor %}", kXs) == "103TrueFalse3 212FalseFalse3 321FalseTrue3 ");
  CHECK(render("{% for x in xs if x != 2 %}{{ x }}/{{ loop.length }} {% endfor %}", kXs) == "1/2 3/2 ");
  CHECK(render("{% for x in [] %}a{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", kXs) == "b=1;a=2;");
  CHECK(render("{% for k, v in d|dictsort %}{{ k }}={{ v }};{% endfor %}", kXs) == "a=2;b=1;");
  CHECK(render("{% for k in d %}{{ k }}{% endfor %}", kXs) == "ba");
  CHECK(render("{% for x in xs %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", kXs) == "1");
  CHECK(render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}", kXs) == "13");
  CHECK(render("{% for x in xs %}{{ loop.cycle('a', 'b') }}{% endfor %}", kXs) == "aba");
  CHECK(render("{% for c in s %}{{ c }}.{% endfor %}", kXs) == "h.é.l.l.o.");
}

TEST_CASE("scoping: set inside a loop stays there, namespace() carries state out") {
  CHECK(render("{% set x = 1 %}{% for i in xs %}{% set x = i %}{% endfor %}{{ x }}", kXs) == "1");
  CHECK(render("{% for i in xs %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}", kXs) == "[5][][]");
  CHECK(render("{% set ns = namespace(t=0) %}{% for i in xs %}{% set ns.t = ns.t + i %}{% endfor %}{{ ns.t }}", kXs) ==
        "6");
  CHECK(render("{% if true %}{% set x = 'if-scope' %}{% endif %}{{ x }}") == "if-scope");  // if opens no scope
  CHECK(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}") == "21");
  CHECK(render("{% set blk | trim %}  inner  {% endset %}[{{ blk }}]") == "[inner]");
  CHECK(render("{% macro m(x, y='d') %}<{{ x }}{{ y }}>{% endmacro %}{{ m(1) }}{{ m(2, y='z') }}") == "<1d><2z>");
}

TEST_CASE("undefined versus none") {
  CHECK(render("[{{ missing }}]") == "[]");
  CHECK(render("{{ missing is defined }} {{ none is defined }} {{ none }} {{ None is none }}") == "False True None True");
  CHECK(render("{{ d.nope is defined }} [{{ d.nope }}] {{ d.nope|default('x') }}", kXs) == "False [] x");
  CHECK(render("{{ missing|length }} {{ 'a' in missing }}") == "0 False");
  CHECK_THROWS_WITH_AS(render("{{ missing.attr }}"), "'missing' is undefined at line 1", TemplateError);
  CHECK_THROWS_WITH_AS(render("\n{{ missing + 1 }}"), "'missing' is undefined at line 2", TemplateError);
}

TEST_CASE("expressions and filters give Python's results") {
  CHECK(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 0.1 + 0.2 }} {{ 1e20 }}") ==
        "3 -4 2 3.5 1024 0.30000000000000004 1e+20");
  CHECK(render("{{ xs[::-1] }} {{ s[1:3] }} {{ s|length }} {{ s|upper }}", kXs) == "[3, 2, 1] él 5 HÉLLO");
  CHECK(render("{{ {'a': [1, none, true], 'b': 'x\"y'}|tojson }}") == R"({"a": [1, null, true], "b": "x\"y"})");
  CHECK(render("{{ {'k': 'é'}|tojson(indent=2) }}") == "{\n  \"k\": \"é\"\n}");
  CHECK(render("{{ [1, 'a']|string }} {{ 'a,b'.split(',') }} {{ '  x '.strip() }}|") == "[1, 'a'] ['a', 'b'] x|");
  CHECK(render("{{ xs|map('string')|join('-') }} {{ xs|select('odd')|list }} {{ xs|sum }}", kXs) == "1-2-3 [1, 3] 6");
  CHECK(render("{{ 'a' if false else 'b' }}{{ 'c' if true }}{{ 'd' if false }}") == "bc");
  CHECK(render("{{ '%s=%03d' % ('x', 7) }}") == "x=007");
}

TEST_CASE("variables from the API: messages, tools, add_generation_prompt, tokens, extra_context") {
  auto t = ChatTemplate::from_string("{{ bos_token }}{{ messages[0].content }}{{ tools|length if tools else 'none' }}"
                                     "{{ add_generation_prompt }}{{ eos_token }}{{ flag }}",
                                     "<s>", "</s>");
  auto msgs = boost::json::parse(R"([{"role": "user", "content": "hi"}])").as_array();
  ChatTemplateOptions opts;
  CHECK(t.render(msgs, opts) == "<s>hinoneTrue</s>");
  opts.add_generation_prompt = false;
  opts.tools = boost::json::parse("[{}, {}]");
  opts.extra_context["flag"] = 1.5;
  CHECK(t.render(msgs, opts) == "<s>hi2False</s>1.5");
  auto no_tokens = ChatTemplate::from_string("{{ bos_token is defined }}{{ eos_token is defined }}");
  CHECK(no_tokens.render(msgs) == "FalseFalse");
}

TEST_CASE("errors name the construct and the line") {
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("a\n\n{{ s | xmlattr }}"), "unsupported filter 'xmlattr' at line 3",
                       TemplateError);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("{% if x is prime %}{% endif %}"), "unsupported test 'prime' at line 1",
                       TemplateError);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("\n{% include 'x.j2' %}"), "unsupported tag 'include' at line 2",
                       TemplateError);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("{% for x in y recursive %}{% endfor %}"),
                       "unsupported recursive for loop at line 1", TemplateError);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("{% for x in y %}"),
                       "missing {% endfor %} for the 'for' tag at end of template", TemplateError);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("{% endif %}"), "unexpected 'endif' at line 1", TemplateError);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("{% break %}"), "'break' outside of a loop at line 1", TemplateError);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("{{ 'abc' "), "unterminated '{{' at line 1", TemplateError);
  CHECK_THROWS_WITH_AS(ChatTemplate::from_string("{{ f(*args) }}"), "unsupported '*args' / '**kwargs' in call at line 1",
                       TemplateError);
  CHECK_THROWS_WITH_AS(render("{{ 'x'.zfill(3) }}"), "'str object' has no attribute 'zfill' at line 1", TemplateError);
  CHECK_THROWS_WITH_AS(render("{{ [1]|map('wordwrap')|list }}"), "unsupported filter 'wordwrap' at line 1",
                       TemplateError);
  CHECK_THROWS_WITH_AS(render("{% set x = {} %}\n{% set x.a = 1 %}"),
                       "cannot assign attribute on non-namespace object 'x' at line 2", TemplateError);
  CHECK_THROWS_WITH_AS(render("{{ 1 + 'a' }}"), "unsupported operand type(s) for +: 'int' and 'str' at line 1",
                       TemplateError);
  CHECK_THROWS_WITH_AS(render("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}"),
                       "maximum recursion depth exceeded in macro 'f' at line 1", TemplateError);
  // raise_exception's message reaches the caller untouched
  CHECK_THROWS_WITH_AS(render("{% for i in [1] %}{{ raise_exception('bad ' ~ i) }}{% endfor %}"), "bad 1", TemplateError);
}

TEST_CASE("one parsed template renders concurrently from many threads") {
  auto t = ChatTemplate::from_string(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}[{{ m.role }}:{{ m.content|trim }}]"
      "{% endfor %}{{ ns.n }}");
  std::vector<std::string> outputs(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    threads.emplace_back([&, i] {
      boost::json::array msgs;
      for (size_t k = 0; k <= i; ++k) msgs.push_back(boost::json::object{{"role", "user"}, {"content", " m" + std::to_string(k) + " "}});
      std::string last;
      for (int rep = 0; rep < 300; ++rep) last = t.render(msgs);
      outputs[i] = last;
    });
  }
  for (auto& th : threads) th.join();
  CHECK(outputs[0] == "[user:m0]1");
  CHECK(outputs[2] == "[user:m0][user:m1][user:m2]3");
  CHECK(outputs[7].size() == 8 * 9 + 1);
  CHECK(outputs[7].ends_with("[user:m6][user:m7]8"));
}
