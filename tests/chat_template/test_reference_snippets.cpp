// Differential test of the interpreter: small templates, each aimed at one feature, rendered by
// kvfleet and by jinja2 (as transformers configures it) with the same variables, compared byte for byte.
#include <doctest/doctest.h>

#include <memory>

#include "tests/chat_template/reference_harness.h"

using namespace kvfleet;
using namespace kvfleet::test;

namespace {

const char* kMessages = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Hi there"},
  {"role": "assistant", "content": "Hello"},
  {"role": "user", "content": "Bye"}])";

const char* kExtra = R"({
  "xs": [3, 1, 2], "d": {"b": 1, "a": 2, "C": 3}, "s": "Hello World", "n": null, "f": 2.5,
  "users": [{"name": "Ann", "age": 30, "active": true}, {"name": "bob", "age": 25, "active": false},
            {"name": "Cy", "age": 41, "active": true}],
  "nested": {"k": [{"v": "deep"}]}})";

const char* kSnippets[] = {
    // whitespace control, trim_blocks, lstrip_blocks
    "a\n{% if true %}\nb\n{% endif %}\nc",
    "  {% if true %}x{% endif %}  \n  y",
    "{%- if true -%}  x  {%- endif -%}  after",
    "a {{- ' b ' -}} c",
    "line1\n    {# comment #}\nline2",
    "{% for i in xs %}\n  {{ i }}\n{% endfor %}",
    "  {%+ if true %}x{% endif %}",
    "x\n\n{%- if true %}\n\ny{% endif +%}\nz",
    "{% raw %}{{ not parsed }} {% if %}{% endraw %}",
    "  {% raw -%}  raw  {%- endraw %}\nnext",
    "a\r\nb\r\n",
    "trailing newline\n",
    "{{ 'a' }}\n",
    "{% if true %}{# c #}\n  x{% endif %}",
    "{#- c -#}\n  \n x",
    "  \t{% if true %}\n    indented\n  {% endif %}\n",
    "x  {% if true %}y{% endif %}",
    "{% for m in messages %}\n    {{- m.role }}\n{% endfor %}",
    // loops and scoping
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}"
    "{{ loop.last }}{{ loop.length }}|{% endfor %}",
    "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{{ loop.last }}{% else %}none{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}{% for c in 'ab' %}{{ c }}.{% endfor %}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for (a, b) in [(5, 6)] %}{{ a * b }}{% endfor %}",
    "{% for x in xs %}{% if x == 1 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }},{{ loop.cycle('a', 'b') }};{% endfor %}",
    "{% for x in xs %}{% for y in 'ab' %}{{ x }}{{ y }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% set x = 1 %}{% for i in xs %}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in xs %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}",
    "{% set ns = namespace(x=1, s='') %}{% for i in xs %}{% set ns.x = ns.x + i %}{% set ns.s = ns.s ~ i %}"
    "{% endfor %}{{ ns.x }} {{ ns.s }}",
    "{% set ns = namespace(items=[]) %}{% set ns.items = ns.items + [1] %}{{ ns.items }}",
    "{% set a, b = [1, 2] %}{{ b }}{{ a }}{% set c = 1, 2 %}{{ c }}",
    "{% set blk %}  inner {{ s }} {% endset %}[{{ blk }}]",
    "{% set blk | trim | upper %}  inner  {% endset %}[{{ blk }}]",
    "{% if false %}a{% elif xs %}b{% else %}c{% endif %}{% if n %}1{% elif n is none %}2{% endif %}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }} "
    "{{ greet(name='c') }}",
    "{% macro show(m) %}{{ m.role }}:{{ s }}{% endmacro %}{% for m in messages %}{{ show(m) }};{% endfor %}",
    // expressions
    "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} "
    "{{ 1.5 + 1 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 'ab' * 2 }} {{ [0] * 3 }} {{ -f }} {{ +1 }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ undefined_var ~ 1.5 }}",
    "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} "
    "{{ none == none }} {{ undefined_var == none }} {{ 'a' != 'a' }} {{ 2 >= 2.0 }} {{ [1, 2] < [1, 3] }}",
    "{{ 'ell' in s }} {{ 2 in xs }} {{ 'a' in d }} {{ 'z' not in d }} {{ not 'x' in s }} {{ 'x' in undefined_var }}",
    "{{ n is none }} {{ n is not none }} {{ undefined_var is defined }} {{ undefined_var is undefined }} "
    "{{ s is string }} {{ d is mapping }} {{ xs is mapping }} {{ xs is iterable }} {{ s is iterable }} {{ 1 is iterable }} "
    "{{ f is number }} {{ true is number }} {{ xs is sequence }} {{ true is true }} {{ 1 is true }} {{ 0 is false }} "
    "{{ 3 is odd }} {{ 3 is even }} {{ 4 is divisibleby 2 }} {{ 4 is divisibleby(3) }} {{ 1 is integer }} "
    "{{ true is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ 'abc' is lower }} {{ 'ABC' is upper }} "
    "{{ 2 is eq 2 }} {{ 2 is ne 2 }} {{ 'a' is in 'abc' }} {{ 3 is gt 2 }} {{ range is callable }}",
    "{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[::-1] }}{{ s[::-1] }}{{ s[2:5] }}{{ s[-3:] }}[{{ xs[5] }}]{{ xs[:-1] }}"
    "{{ xs[::2] }}{{ xs[5:] }}{{ xs[-10:2] }}{{ s[::-2] }}{{ xs[2:0:-1] }}",
    "{{ d.a }}{{ d['b'] }}[{{ d.missing }}]{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.get('zz') }}{{ nested.k[0].v }}"
    "{{ nested['k'][0]['v'] }}{{ xs.0 }}[{{ n.attr }}]",
    "{{ x if x is defined else 'nope' }} [{{ 'yes' if xs }}] [{{ 'a' if false }}] {{ 1 if n else 2 if xs else 3 }}",
    "{{ none }} {{ None }} {{ True }} {{ false }} {{ [1, 'a', none, 1.5, \"q'\", 'q\"'] }} {{ {'k': 'v', 'n': [1]} }} "
    "{{ (1,) }} {{ () }} {{ (1, 'a') }} {{ 1e3 }} {{ 1_000 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} "
    "{{ 0.0001 }} {{ 123456789012.5 }} {{ 1.0 }} {{ -0.0 }} {{ 2.5e-7 }} {{ 3 / 3 }}",
    "{{ n and 1 }} {{ 0 or 'b' }} {{ not xs }} {{ not none }} {{ xs and s }} {{ '' or [] }} {{ 1 and 0 }}",
    "{{ 'it\\'s' }} {{ \"q\\\"t\" }} {{ 'tab\\tnl\\n' }} {{ 'u\\u00e9\\x41' }} {{ 'a' 'b' }} {{ 'back\\\\slash' }} {{ '\\d' }}",
    "{{ 'x', 1 }}",
    "{{ [1, 2] == (1, 2) }} {{ (1, 2) == (1, 2) }} {{ 'abc'.count('') }} {{ 'a b'.split(' ', 0) }} {{ ''.split() }}",
    "{{ 'abc'.split('') }}",
    "{{ '%s-%d|%5.2f|%-4s|%03d|%r|%%|%x' % ('a', 3, 2.5, 'b', 7, 'q', 255) }} {{ 'one %s' % 'arg' }} {{ '%s' % [1] }}",
    "{{ [s, xs[0]] }} {{ {'a': 1}['a'] }} {{ [1, 2, 3][1:] }} {{ ([1] + [2])|length }}",
    "{{ 'caf\\u00e9 \\u65e5' }} {{ ['caf\\u00e9', '\\n', '\\x7f', '\\u200b', '\\U0001f680'] }}",
    // filters
    "{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ s|length }}|{{ xs|length }}|{{ d|count }}|{{ undefined_var|length }}",
    "{{ undefined_var|default('dflt') }}{{ ''|default('e', true) }}{{ n|default('nn') }}{{ 0|d('zero', boolean=true) }}"
    "{{ undefined_var|default }}",
    "{{ s|upper }} {{ s|lower }} {{ 'hELLO wORLD'|capitalize }} {{ 'hello big-world (x) [y] <z> don\\'t'|title }}",
    "{{ xs|join(', ') }} {{ users|join(',', attribute='name') }} {{ xs|first }} {{ xs|last }} {{ s|list }} {{ d|list }} "
    "{{ xs|join }} [{{ []|first }}]",
    "{{ d|items|list }} {{ users|map(attribute='name')|list }} {{ xs|map('string')|join('+') }} "
    "{{ users|map(attribute='nope', default='?')|list }} {{ ['a', 'B']|map('upper')|list }}",
    "{{ users|selectattr('active')|map(attribute='name')|join }} {{ users|rejectattr('active')|map(attribute='name')|join }} "
    "{{ users|selectattr('age', 'gt', 26)|list|length }} {{ users|selectattr('name', 'equalto', 'bob')|list }} "
    "{{ users|selectattr('age', '>=', 30)|map(attribute='age')|list }}",
    "{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ [0, 1, '', 'a', none]|select|list }} "
    "{{ xs|select('gt', 1)|list }}",
    "{{ s|replace('o', '0') }} {{ s|replace('l', 'L', 2) }} {{ 42|string }} {{ '42'|int + 1 }} {{ '4.7'|int }} "
    "{{ 'x'|int }} {{ 'x'|int(7) }} {{ '2.5'|float }} {{ 3|float }} {{ 4.9|int }} {{ true|int }} {{ ' 12 '|int }}",
    "{{ ['a', 'A', 'b', 'a']|unique|list }} {{ ['a', 'A']|unique(case_sensitive=true)|list }} {{ d|dictsort }} "
    "{{ d|dictsort(reverse=true) }} {{ d|dictsort(by='value') }} {{ d|dictsort(true) }}",
    "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\ny'|indent('> ') }}",
    "{{ 2.5|round }} {{ 3.5|round }} {{ 2.567|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} "
    "{{ -3|abs }} {{ -2.5|abs }} {{ 7|round }}",
    "{{ d|tojson }} {{ users|tojson(indent=2) }} {{ 'é\"\\n\\t\\u0001'|tojson }} {{ none|tojson }} "
    "{{ [1.0, 2.5e-7, 1e20, true, -0.5]|tojson }} {{ {'b': 1, 'a': {}}|tojson(sort_keys=true) }} "
    "{{ 'é🚀'|tojson(ensure_ascii=true) }} {{ [[], {}]|tojson(indent=2) }} {{ d|tojson(separators=(',', ':')) }} "
    "{{ messages[1]|tojson(indent=0) }}",
    "{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='name')|join }} "
    "{{ ['b', 'A', 'c']|sort }} {{ xs|sum }} {{ users|sum(attribute='age') }} {{ xs|min }} {{ xs|max }} "
    "{{ xs|reverse|list }} {{ s|reverse }}",
    "{{ '<a href=\"x\">&\\''|e }} {{ s|safe }} {{ 'one two  three'|wordcount }} {{ s|escape }}",
    // methods
    "{{ '  a b  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ s.startswith('He') }}"
    "{{ s.endswith(('x', 'ld')) }}|{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}"
    "{{ 'a b c'.split(none, 1) }}|{{ s.upper() }}{{ s.lower() }}{{ s.replace('World', 'There') }}"
    "{{ 'hello wORLD'.title() }}{{ 'hELLO'.capitalize() }}{{ '{} and {name}'.format(1, name='x') }}",
    "{{ d.keys()|list }} {{ d.values()|list }} {% for k, v in d.items() %}{{ k }}{% endfor %} {{ d.items()|list }}",
    "{{ '-'.join(['a', 'b']) }} {{ s.find('o') }} {{ s.find('z') }} {{ s.count('o') }} {{ 'abc'.removeprefix('a') }}",
    "{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'a</think>b'.split('</think>')[-1] }}|{{ '\\u3000x\\u3000'.strip() }}",
    // globals and variables
    "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ dict(a=1, b='x')|tojson }}",
    "{{ add_generation_prompt }} {{ tools }} {{ documents }} [{{ bos_token }}] [{{ eos_token }}]",
    "{{ strftime_now('%Y-%m-%d') }}",
    // unicode
    "{{ 'héllo wörld'|upper }} {{ 'ÉCOLE'|lower }} {{ '日本語'|length }} {{ '日本語'[1] }} {{ '日本語'[::-1] }} "
    "{{ 'élan vital'|capitalize }} {{ 'émile zola'|title }} {{ 'ß'|length }}",
    // the conversation
    "{% for m in messages %}{{ m.role|upper }}: {{ m.content }}\n{% endfor %}",
    "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages[-1]['content'] }} "
    "{{ messages|map(attribute='role')|unique|join('/') }} {{ messages[1:]|length }} {{ messages[0] }}",
    // errors: both sides must fail (messages differ, except for raise_exception)
    "{{ 1 + 'a' }}",
    "{{ undefined_var.attr }}",
    "{{ undefined_var + 1 }}",
    "{{ xs + 1 }}",
    "{{ 1 / 0 }}",
    "{{ 1 < 'a' }}",
    "{% set x = d %}{% set x.a = 1 %}",
    "{{ raise_exception('custom ' ~ 42) }}",
    "{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no ' + m.role + 's') }}{% endif %}{% endfor %}",
    "{{ n.attr.deeper }}",
    "{{ undefined_var() }}",
};

}  // namespace

TEST_CASE("interpreter features render byte for byte like jinja2") {
  if (!reference_available()) return;
  std::vector<std::unique_ptr<ChatTemplate>> owned;
  std::vector<RefCase> cases;
  std::vector<const ChatTemplate*> templates;
  int i = 0;
  for (const char* src : kSnippets) {
    RefCase c;
    c.name = "snippet" + std::to_string(i++) + ": " + src;
    c.source = src;
    c.bos_token = "<s>";
    c.messages = boost::json::parse(kMessages).as_array();
    c.extra = boost::json::parse(kExtra).as_object();
    try {
      owned.push_back(std::make_unique<ChatTemplate>(ChatTemplate::from_string(src, c.bos_token)));
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
  MESSAGE((cases.size() - diffs.size()) << "/" << std::size(kSnippets) << " snippets match jinja2");
}
