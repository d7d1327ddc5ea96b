"""Generates tests/jinja/data/jinja_snippets.json: small templates rendered by
Python jinja2 under transformers' settings (hf_jinja.py), the reference our
C++ renderer must match byte for byte (or fail where Python fails).

Run from the repository root: python3 tests/jinja/py/gen_jinja_snippets.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import hf_jinja  # noqa: E402

CTX = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there, ünïcödé ✓ 你好"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "ratio": 2.0, "tags": ["a", "b"], "opt": None, "flag": True}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 18}"},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 18."}, {"type": "image"}]},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & 'later'",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "d": {"b": 1, "a": [1, 2.5, "x"], "items": "shadowed", "nested": {"k": None}},
    "n": 7, "f": 2.5, "big": 1e16, "small": 1e-05, "neg": -3, "s": "  Hello World  ", "empty": "", "lst": [3, 1, 2],
    "words": ["b", "A", "c", "a"], "people": [{"name": "Bo", "age": 30}, {"name": "al", "age": 25}, {"name": "Cy", "age": 30}],
    "flag": False, "nothing": None,
}

SNIPPETS = [
    # output and literals
    "{{ 1 }}|{{ 1.0 }}|{{ 2.5e3 }}|{{ 1e16 }}|{{ 0.0001 }}|{{ 1e-05 }}|{{ -0.0 }}|{{ 1_000 }}|{{ 0x1F }}|{{ 0o17 }}|{{ 0b101 }}",
    "{{ true }}|{{ True }}|{{ none }}|{{ None }}|{{ 'a' 'b' }}|{{ \"q\\\"uote\" }}|{{ 'tab\\tnl\\n' }}|{{ '\\u00e9\\x41' }}",
    "{{ [1, 'two', none, true, 2.0] }}|{{ (1,) }}|{{ () }}|{{ (1, 'a') }}|{{ {'a': 1, 'b': [none]} }}|{{ {} }}",
    "{{ \"it's\" }}|{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', '\\x00\\x7f', 'é✓'] }}",
    "{{ d }}|{{ d.nested }}|{{ messages[1] }}",
    "{{ big }}|{{ small }}|{{ f }}|{{ n / 2 }}|{{ n // 2 }}|{{ -n // 2 }}|{{ n % 3 }}|{{ -n % 3 }}|{{ 2 ** 10 }}|{{ 2 ** -2 }}|{{ 7.5 // 2 }}|{{ -7.5 % 2 }}",
    "{{ 1 + 2 * 3 - 4 }}|{{ (1 + 2) * 3 }}|{{ 'a' ~ 1 ~ none ~ x }}|{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ 3 * 'x' }}|{{ [1, 2] + [3] }}|{{ -f }}|{{ +n }}|{{ true + true }}",
    "{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 'a' < 'b' }}|{{ [1, 2] < [1, 3] }}|{{ 1 == 1.0 }}|{{ true == 1 }}|{{ none == none }}|{{ x == y }}|{{ x == none }}|{{ 'a' != 'b' }}",
    "{{ 'ell' in 'hello' }}|{{ 2 in [1, 2] }}|{{ 'a' in {'a': 1} }}|{{ 'z' not in 'abc' }}|{{ 1 in x }}|{{ (1, 2) in [(1, 2)] }}",
    "{{ not flag }}|{{ flag or 'dflt' }}|{{ n and 'yes' }}|{{ '' or 0 or none }}|{{ n if flag else 'no' }}|{{ n if flag }}|[{{ 'a' if true }}]",
    # whitespace control, comments, raw
    "a\n  {% if true %}\n    b\n  {% endif %}\nc\n",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "a\n  {%+ if true %}b{% endif %}\n  {{ 'x' }}\n  {# comment #}\nd",
    "x {#- c -#} y\n{# multi\nline #}\nz",
    "{% raw %}{{ not rendered }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw -%}|",
    "  {% raw %}\n  keep {{ }}\n  {% endraw %}\nend",
    "line1\r\nline2\rline3\n\n",
    "{{- '  a  ' -}}\n\n{{ 'b' }}\n",
    "{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n",
    "<{%- for i in range(3) -%}\n {{ i }}{{ ',' if not loop.last }}\n{%- endfor -%}>",
    # strings and methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ s|trim }}|{{ 'xyx'|trim('x') }}",
    "{{ ' a b '.split(None, 1) }}|{{ ' a b '.split(None, 0) }}|{{ ' a b '.rsplit(None, 1) }}|{{ ' a b '.rsplit(None, 0) }}|{{ 'a  b  c '.split(None, 1) }}|{{ '  a b'.rsplit(None, 5) }}|{{ 'a'.split('a') }}|{{ ''.split() }}|{{ ''.split(',') }}",
    "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(None, 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'a b c'.rsplit(None, 1) }}",
    "{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith(('x', 'lo')) }}|{{ 'Hello'.upper() }}|{{ 'Hello'.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'Hi'.swapcase() }}",
    "{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'abc'.replace('', '-') }}|{{ 'abcabc'.find('c') }}|{{ 'abcabc'.rfind('c') }}|{{ 'abc'.find('z') }}|{{ 'ééa'.find('a') }}|{{ 'banana'.count('an') }}",
    "{{ ', '.join(['a', 'b']) }}|{{ 'x'.center(5) }}|{{ 'x'.ljust(3, '.') }}|{{ 'x'.rjust(3) }}|{{ '42'.zfill(5) }}|{{ '-4'.zfill(4) }}",
    "{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|{{ 'pre_x'.removeprefix('pre_') }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'a\\nb'.splitlines(true) }}",
    "{{ '123'.isdigit() }}|{{ 'abc'.isalpha() }}|{{ 'a1'.isalnum() }}|{{ '  '.isspace() }}|{{ 'abc'.islower() }}|{{ 'ABC'.isupper() }}|{{ ''.isdigit() }}",
    "{{ 'hello'[1] }}|{{ 'hello'[-1] }}|{{ 'hello'[1:3] }}|{{ 'hello'[::-1] }}|{{ 'hello'[::2] }}|{{ 'héllo'[1] }}|{{ 'hello'[10] }}|{{ [1,2,3][-2:] }}|{{ [1,2,3][:-1] }}|{{ [1,2,3,4,5][4:0:-2] }}",
    "{{ '%s and %s' % ('a', 'b') }}|{{ '%d%%' % 50 }}|{{ '%5.2f' % 3.14159 }}|{{ '%-4s|' % 'ab' }}|{{ '%(x)s' % {'x': 1} }}|{{ '%r' % 'q' }}|{{ '%03d' % 7 }}|{{ '%x' % 255 }}",
    "{{ '{} {}'.format(1, 'b') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{x}'.format(x=5) }}|{{ '{:>5}|{:<5}|{:^5}'.format('a', 'b', 'c') }}|{{ '{:.2f}'.format(2.5) }}|{{ '{:05d}'.format(42) }}|{{ '{!r}'.format('x') }}",
    # dict / list methods and attribute rules
    "{{ d.get('b') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|{{ d.keys() }}|{{ d.values() }}|{{ d.items() }}|{{ d['items'] }}|{{ d.items is defined }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }},{% endfor %}",
    "{{ lst.index(1) }}|{{ lst.count(3) }}|{{ d.missing }}|{{ d.missing is defined }}|{{ messages[0].role }}|{{ messages[0]['role'] }}|{{ messages.0.role }}|{{ lst[10] is defined }}",
    "{{ nothing.attr }}|{{ nothing is none }}|{{ d.nested.k is none }}",
    # tests
    "{{ x is defined }}|{{ x is undefined }}|{{ n is number }}|{{ f is float }}|{{ n is integer }}|{{ true is boolean }}|{{ s is string }}|{{ d is mapping }}|{{ lst is sequence }}|{{ d is iterable }}|{{ n is iterable }}",
    "{{ 4 is divisibleby 2 }}|{{ 3 is odd }}|{{ 4 is even }}|{{ 'a' is eq 'a' }}|{{ 2 is gt 1 }}|{{ 2 is le 2 }}|{{ 2 is in [1, 2] }}|{{ none is sameas none }}|{{ 'upper' is filter }}|{{ 'odd' is test }}|{{ 'ABC' is upper }}|{{ 'abc' is lower }}",
    "{{ x is callable }}|{{ range is callable }}|{{ 'x'.upper is callable }}|{{ true is true }}|{{ 0 is false }}|{{ 1 is number }}|{{ true is number }}|{{ x is sequence }}|{{ lst is not string }}",
    # filters
    "{{ lst|length }}|{{ 'héllo'|length }}|{{ d|count }}|{{ x|length }}|{{ lst|first }}|{{ lst|last }}|{{ lst|sort }}|{{ lst|sort(reverse=true) }}|{{ words|sort }}|{{ words|sort(case_sensitive=true) }}",
    "{{ people|sort(attribute='age')|map(attribute='name')|join(',') }}|{{ people|sort(attribute='age,name')|map(attribute='name')|list }}|{{ people|selectattr('age', 'equalto', 30)|map(attribute='name')|list }}|{{ people|rejectattr('age', 'gt', 26)|list }}",
    "{{ lst|select('odd')|list }}|{{ lst|reject('odd')|list }}|{{ [0, 1, '', 'a', none]|select|list }}|{{ lst|map('string')|join('-') }}|{{ people|map(attribute='missing', default='?')|list }}|{{ lst|sum }}|{{ people|sum(attribute='age') }}",
    "{{ lst|min }}|{{ lst|max }}|{{ words|max }}|{{ people|max(attribute='age') }}|{{ ['a', 'A', 'b']|unique|list }}|{{ [1, 1, 2]|unique|list }}|{{ lst|reverse|list }}|{{ 'abc'|reverse }}|{{ 'ab'|list }}",
    "{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ 'hi'|capitalize }}|{{ 'a<b>&\"\\''|e }}|{{ 'a<b>'|escape }}|{{ s|replace('l', 'L') }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ n|string }}|{{ lst|string }}",
    "{{ '42'|int }}|{{ '4.7'|int }}|{{ 'x'|int }}|{{ 'x'|int(-1) }}|{{ 4.9|int }}|{{ '0x1A'|int(0, 16) }}|{{ '3.5'|float }}|{{ 'x'|float }}|{{ 2|float }}|{{ true|int }}",
    "{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.675|round(2) }}|{{ 3|round }}|{{ 2.1|round(method='ceil') }}|{{ 2.9|round(0, 'floor') }}|{{ -2.5|round }}|{{ 1234.5|round(-2) }}|{{ -7|abs }}|{{ -2.5|abs }}",
    "{{ x|default('d') }}|{{ none|default('d') }}|{{ ''|default('d', true) }}|{{ x|d('dd') }}|{{ 0|default(5, boolean=true) }}",
    "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x\\ny'|indent('> ') }}",
    "{{ d|dictsort }}|{{ d|dictsort(reverse=true)|map('first')|list }}|{{ {'b': 2, 'a': 3}|dictsort(by='value') }}|{{ d|items|list }}|{{ x|items|list }}",
    "{{ [1,2,3,4,5]|batch(2)|list }}|{{ [1,2,3]|batch(2, 'x')|list }}|{{ [1,2,3,4,5]|slice(2)|list }}|{{ people|groupby('age')|list }}",
    "{% for age, group in people|groupby('age') %}{{ age }}:{{ group|map(attribute='name')|join('/') }};{% endfor %}",
    "{{ 'hello world foo'|truncate(9) }}|{{ 'hello world'|truncate(5, true) }}|{{ 'abc'|truncate(10) }}|{{ 'one two three'|wordcount }}|{{ '<p>a  <b>b</b></p>'|striptags }}|{{ 'a b&c'|urlencode }}|{{ 3000|filesizeformat }}",
    "{{ 'x'|center(7) }}|{{ '%s-%s'|format('a', 'b') }}|{{ [1, [2, 3]]|pprint }}|{{ 'a.b'|attr('upper') is defined }}|{{ {'k': 1}|attr('k') }}",
    # tojson (transformers' override)
    "{{ d|tojson }}|{{ 'é<&>\\''|tojson }}|{{ [1, 2.0, none, true]|tojson }}|{{ (1, 'a')|tojson }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
    "{{ d|tojson(indent=2) }}|{{ lst|tojson(indent=0) }}|{{ {}|tojson(indent=2) }}|{{ d|tojson(separators=(',', ':')) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ '😀'|tojson(ensure_ascii=true) }}",
    "{{ {1: 'a', 2.5: 'b', true: 'c', none: 'd'}|tojson }}|{{ tools|tojson }}|{{ messages[2].tool_calls[0].function.arguments|tojson }}",
    "{{ x|tojson }}",
    # loops
    "{% for i in lst %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for i in lst %}{{ loop.previtem }}>{{ i }}>{{ loop.nextitem }}|{% endfor %}",
    "{% for i in lst %}{{ loop.cycle('a', 'b') }}{% endfor %}|{% for i in [1, 1, 2] %}{{ loop.changed(i) }}{% endfor %}",
    "{% for i in lst if i > 1 %}{{ i }}{{ loop.length }}{% else %}none{% endfor %}|{% for i in [] %}x{% else %}empty{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}|{% for x in 'ab' %}{{ x }}.{% endfor %}|{% for x in x %}never{% endfor %}",
    "{% for i in [1, 2] %}{% for j in [3, 4] %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{%- for item in [{'n': 1, 'c': [{'n': 2, 'c': []}]}] recursive -%}[{{ item.n }}{{ loop.depth }}{{ loop(item.c) }}]{%- endfor -%}",
    "{{ range(5)|list }}|{{ range(2, 10, 3)|list }}|{{ range(5, 0, -2)|list }}|{{ range(0)|list }}",
    # scoping
    "{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% set ns = namespace(total=0, items=[]) %}{% for i in lst %}{% set ns.total = ns.total + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.total }}{{ ns.items }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set t = (1, 2) %}{{ t }}|{% set c %}block {{ n }}{% endset %}{{ c }}|{% set u | upper %}up{% endset %}{{ u }}",
    "{% if true %}{% set inner = 1 %}{% endif %}{{ inner }}|{% for i in [1] %}{% set leaked = 1 %}{% endfor %}{{ leaked is defined }}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}",
    "{% set ns = namespace(d={'k': 1}) %}{{ ns.d.k }}|{{ namespace(a=1) }}|{{ namespace({'b': 2}).b }}|{{ dict(a=1, b=2) }}|{{ dict([('x', 1)]) }}",
    # macros and call blocks
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bo') }}|{{ greet('Al', greeting='Hi') }}|{{ greet(greeting='Yo', name='Cy') }}",
    "{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}|{% macro v() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, k=3) }}|{% macro u(p) %}[{{ p }}]{% endmacro %}{{ u() }}",
    "{% macro outer() %}{{ caller() }}{% endmacro %}{% call outer() %}inside {{ n }}{% endcall %}|{% macro list_items(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(x) list_items([1, 2]) %}<{{ x }}>{% endcall %}",
    "{% macro r(k) %}{% if k > 0 %}{{ k }}{{ r(k - 1) }}{% endif %}{% endmacro %}{{ r(3) }}|{% macro m() %}{{ y }}{% endmacro %}{% set y = 5 %}{{ m() }}",
    "{% set y = 1 %}{% macro m() %}{% set y = 2 %}{{ y }}{% endmacro %}{{ m() }}{{ y }}|{{ greet is defined }}",
    "{% filter upper %}shout {{ n }}{% endfilter %}|{% filter replace('a', 'b')|upper %}aaa{% endfilter %}",
    "{% set j = joiner('|') %}{% for i in lst %}{{ j() }}{{ i }}{% endfor %}|{% set c = cycler('x', 'y') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}",
    "{% generation %}gen {{ n }}{% endgeneration %}|{% block b %}blk{% endblock %}|{% print 'p', 1 %}",
    # more edges
    "{{ 'abc'.center(8, '*') }}|{{ 'ab'.center(5) }}|{{ 'x'.zfill(0) }}|{{ '+5'.zfill(4) }}|{{ 'Hello World'.istitle() }}|{{ 'a-b_c d'.title() }}|{{ \"they're\".title() }}",
    "{{ 'ÉCOLE'.lower() }}|{{ 'straße'.upper() }}|{{ 'ǅ'|length }}|{{ 'ΣΑΣ'.lower() }}|{{ 'мир'.upper() }}|{{ 'Ａｂｃ'.lower() }}",
    "{{ 'aXbXc'.split('X', 1) }}|{{ 'aXbXc'.rsplit('X', 1) }}|{{ 'abc'.startswith('b', 1) }}|{{ 'abcabc'.find('c', 3) }}|{{ 'abcabc'.count('b', 2) }}|{{ 'abc'.endswith('b', 0, 2) }}",
    "{{ [3, 1, 2]|sort|first }}|{{ []|first is defined }}|{{ []|max is defined }}|{{ [[1, 2], [0]]|sort }}|{{ [(2, 'b'), (1, 'z')]|sort }}|{{ ['b', 'a']|sort(reverse=true)|join }}",
    "{{ {'a': {'b': [1, {'c': 2}]}}|tojson(indent=1) }}|{{ [[], {}]|tojson(indent=2) }}|{{ 'x'|tojson(indent=2) }}|{{ [1, [2, [3]]]|tojson(separators=(',', ':')) }}",
    "{{ 10|string ~ 2.50|string ~ none|string }}|{{ (1.0 / 3) }}|{{ 1e100 }}|{{ 123456789.0 * 1000000000 }}|{{ 0.1 + 0.2 }}|{{ 3.0 * 2 }}|{{ 2 ** 0.5 }}",
    "{% for x in [1, 2, 3] %}{% if loop.first %}[{% endif %}{{ x }}{% if not loop.last %},{% else %}]{% endif %}{% endfor %}|{{ [1, 2, 3]|join(', ') }}",
    "{% set d2 = {'k': 'v'} %}{% for k, v in d2.items() %}{{ k }}{{ v }}{% endfor %}|{% for item in d2|dictsort %}{{ item[0] }}{% endfor %}|{{ d2.k }}{{ d2['k'] }}{{ d2.get('k') }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|map(attribute='role')|unique|list }}|{{ messages|rejectattr('content', 'none')|map(attribute='role')|join(',') }}",
    "{{ messages[-1].content[0].text }}|{{ messages[2].tool_calls[0].function.arguments.city }}|{{ messages[2]['tool_calls'][0]['function']['arguments']|tojson }}",
    "{{ tools[0].function.parameters.properties|items|list }}|{{ tools|map(attribute='function.name')|list }}|{{ (tools|first).function.name }}",
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set rest = messages[1:] %}{% endif %}{{ sys }}|{{ rest|length }}",
    "{%- set ns = namespace(found=false) -%}{%- for m in messages -%}{%- if m.role == 'tool' -%}{%- set ns.found = true -%}{%- endif -%}{%- endfor -%}{{ ns.found }}",
    "{{ '%.3f|%5s|%-5d|%+d|% d|%e' % (3.14159, 'ab', 42, 5, 7, 12345.678) }}|{{ '%s' % [1, 2] }}|{{ '%s %s' % ('a', none) }}",
    "{{ '{:,}'.format(1234567) }}|{{ '{:>8.3f}'.format(3.14159) }}|{{ '{:x}'.format(255) }}|{{ '{0[0]}{1.real}'.format([9], 4) }}|{{ '{{literal}}'.format() }}",
    "{{ 'ab' in ['ab'] }}|{{ 'a' in 'ab' }}|{{ none in [none] }}|{{ 1.0 in [1] }}|{{ true in [1] }}|{{ {'a': 1} == {'a': 1.0} }}|{{ [1, 2] == (1, 2) }}",
    "{{ 'x' if none else 'y' }}|{{ none or [] or 'z' }}|{{ (none or {}).get('a', 'b') }}|{{ not none }}|{{ x is not defined and y is not defined }}",
    "{% macro m(a, b) %}{{ a }}-{{ b }}{% endmacro %}{{ m(*[1, 2]) }}|{{ m(**{'a': 3, 'b': 4}) }}|{{ m(1, **{'b': 5}) }}|{{ dict(**{'a': 1}, b=2) }}",
    "{{ 5|string|length }}|{{ '5'|int + 1 }}|{{ '5.5'|float + 1 }}|{{ [1, 2]|length > 1 }}|{{ ('a', 'b')|join('-') }}|{{ 'a b'|replace(' ', '_')|upper }}",
    "{% set lst2 = [5, 3, 8] %}{{ lst2|sort(attribute=None) }}|{{ lst2|min }}|{{ lst2[1:]|sum }}|{{ lst2|select('gt', 4)|list }}|{{ lst2|map('abs')|list }}",
    # errors (Python fails: so must we)
    "{{ raise_exception('bad input: ' ~ n) }}",
    "{{ x.y }}", "{{ x + 1 }}", "{{ 1 + 'a' }}", "{{ 'a' + 1 }}", "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ none.a.b }}",
    "{{ lst.append(4) }}", "{{ d.update({}) }}", "{{ x() }}", "{{ 'a' < 1 }}", "{{ n is nosuchtest }}",
    "{{ n|nosuchfilter }}", "{% if true %}{{ n|nosuchfilter }}{% endif %}", "{% if false %}{{ n|nosuchfilter }}{% endif %}ok",
    "{% for %}", "{% if x %}", "{% endif %}", "{{ 1 + }}", "{% set %}", "{{ }}", "{% break %}", "{% macro m(a=1, b) %}{% endmacro %}",
    "{{ range(200000)|length }}", "{% set a, b = [1] %}", "{% include 'x.html' %}", "{% extends 'base' %}", "{{ (1, 2)[5] is defined }}",
    "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "{{ 1 in 5 }}", "{{ 1 in 'abc' }}", "{{ {[1]: 2} }}", "{{ 'abc'.index('z') }}",
    "{{ [1, 'a']|sort }}", "{{ {'a': 1}|first }}", "{{ [1,2][:'a'] }}", "{{ 'x' * 'y' }}", "{% do lst.append(1) %}",
    "{{ 'a' ~ }}", "{{ {'a': 1 }", "{{ foo(}}", "{{ 'unterminated }}", "{# never closed", "{% raw %} never closed",
    "{{ 1 |}}", "{{ loop.index }}", "{{ messages[0].content|tojson(indent='\\t') }}", "{{ 9223372036854775807 + 1 }}",
]


def main():
    out = []
    for i, tpl in enumerate(SNIPPETS):
        r = hf_jinja.render(tpl, CTX, now="2026-08-14")
        entry = {"id": i, "template": tpl, "ok": r["ok"]}
        if r["ok"]:
            entry["expected"] = r["text"]
        else:
            entry["python_error"] = r["error"]
        out.append(entry)
    root = os.path.join(os.path.dirname(__file__), "..")
    with open(os.path.join(root, "data", "jinja_snippets.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/jinja/py/gen_jinja_snippets.py (jinja2 " + __import__("jinja2").__version__ + ")",
                   "context": CTX, "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} snippets, {sum(1 for e in out if not e['ok'])} expected to fail")


if __name__ == "__main__":
    main()
