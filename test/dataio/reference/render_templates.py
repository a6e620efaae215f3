#!/usr/bin/python3
"""Reference renderings of the chat template fixtures for forge's Jinja subset (dataio/src/jinja.cpp).

Renders every template of test/dataio/fixtures/chat_templates/templates.json with python3-jinja2 the way
Hugging Face transformers renders chat templates (PreTrainedTokenizerBase.apply_chat_template): an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension, tojson
replaced by json.dumps(ensure_ascii=False, ...), and the globals raise_exception (a TemplateError) and
strftime_now. The render variables are HF's: messages, tools (None when there are none), documents (None),
add_generation_prompt and the special tokens; besides, date_string. The clock is fixed at 26 Jul 2024 so
that templates printing today's date (Llama 3.2) render the same every run.

  generate [DIR]   writes DIR/expected.json (default: the fixture directory): the conversations and, for each
                   template, conversation and add_generation_prompt, the rendered text or the error; and
                   the rendering (or error) of each single construct of CONSTRUCTS, the engine's unit cases.
                   Byte-identical on every run.
  check [DIR]      renders again and compares with DIR/expected.json (exit 1 on a difference).
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat_templates")
NOW = datetime.datetime(2024, 7, 26)
DATE_STRING = NOW.strftime("%d %b %Y")

SYSTEM = {"role": "system", "content": "You are a terse assistant."}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. \"Paris\""}},
            "required": ["city"],
        },
    },
}

# Each conversation: its messages and, for the tool conversation, the tools. "plain" conversations hold
# only system/user/assistant messages with string content (what forge::data::ChatMessage can express).
CONVERSATIONS = {
    "system_user_assistant": {
        "messages": [SYSTEM, user("What is 2+2?"), assistant("4.")],
    },
    "multi_turn": {
        "messages": [user("Hi!"), assistant("Hello. How can I help?"), user("Name a prime."), assistant("7")],
    },
    "system_multi_turn": {
        "messages": [SYSTEM, user("One?"), assistant("1"), user("Two?"), assistant("2"), user("Three?"),
                     assistant("3")],
    },
    "user_only": {"messages": [user("Tell me a joke.")]},
    "system_user": {"messages": [SYSTEM, user("Tell me a joke.")]},
    "tricky_content": {
        "messages": [
            user("Caf\u00e9 \u2615 \u4f60\u597d \U0001F600 {{ not_a_var }} {% if x %} {# c #} 'single' \"double\" "
                 "back\\slash <|im_end|> [INST] </s>"),
            assistant("Sure: {\"json\": [1, 2]} \u00ab\u00bb \u0394\u03b9\u03ac\u03b2\u03bf\u03bb\u03bf\u03c2 "
                      "\u202e\u200b\ttab\r\nwindows line"),
        ],
    },
    "whitespace_content": {
        "messages": [SYSTEM, user("  padded question \n\n"), assistant("\n\u00a0reply with a no-break space\u00a0 \n"),
                     user("\tnext"), assistant("  ")],
    },
    "reasoning": {
        "messages": [user("Think first."), assistant("<think>\nSome reasoning.\n</think>\n\nThe answer."),
                     user("Again."), assistant("<think>\nMore.\n</think>\n\nSecond answer.")],
    },
    "assistant_first": {"messages": [assistant("I speak first."), user("Fine.")]},
    "empty": {"messages": []},
    "tools": {
        "messages": [
            SYSTEM,
            user("What is the weather in Paris?"),
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call12345", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
             "content": "{\"temperature_c\": 21, \"sky\": \"clear\"}"},
            assistant("It is 21 \u00b0C and clear in Paris."),
            user("Thanks."),
        ],
        "tools": [WEATHER_TOOL],
    },
}
PLAIN = [name for name in CONVERSATIONS if name != "tools"]

# Single constructs, rendered with CONSTRUCT_VARIABLES: the engine's unit cases.
CONSTRUCT_VARIABLES = {
    "xs": [1, 2, 3],
    "d": {"b": 1, "a": [1, 2], "items": 5},
    "s": "h\u00e9llo W\u00f6rld",
    "n": None,
    "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
             {"role": "user", "content": "ok"}],
}
CONSTRUCTS = [
 # literals and printing
 "{{ 1 }}|{{ 1.0 }}|{{ 1.5e3 }}|{{ 1e16 }}|{{ 1e-5 }}|{{ 0.1 + 0.2 }}|{{ -0.0 }}|{{ 10 / 4 }}|{{ 1_000 }}|{{ 0x1F }}",
 "{{ none }}|{{ None }}|{{ true }}|{{ False }}|{{ n }}|{{ undefined_name }}|",
 "{{ 'a\\tb\\n' }}|{{ \"q'\" }}|{{ 'caf\\u00e9 \\x41\\101' }}|{{ 'x' 'y' }}|{{ '\\d' }}",
 "{{ [1, 'a', none, true, 1.5] }}|{{ (1,) }}|{{ () }}|{{ (1, 'b') }}|{{ {'k': [1], 'j': {'z': none}} }}|{{ d }}",
 "{{ [\"it's\", 'say \"x\"', 'tab\\t', 'caf\u00e9'] }}",
 # arithmetic
 "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 3 * 'ab' }} {{ [0] * 3 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ true + 1 }} {{ -xs[0] }} {{ +2 }}",
 "{{ 'a' ~ 1 ~ none ~ undefined_name ~ 1.0 ~ [1] }}",
 # comparisons and logic
 "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }} {{ 'é' > 'z' }} {{ undefined_name == undefined_name }} {{ n == none }}",
 "{{ 2 in xs }} {{ 5 not in xs }} {{ 'ell' in 'hello' }} {{ 'a' in d }} {{ 'zz' in d }} {{ 1 in undefined_name }}",
 "{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ '' and 'z' }}|{{ none or [] }}|{{ not xs }}|{{ not not 'a' }}|{{ xs and xs[0] }}",
 "{{ 'y' if xs else 'n' }}|{{ 'y' if [] else 'n' }}|{{ 'y' if false }}|{{ 1 if 0 else 2 if 1 else 3 }}",
 # attribute and subscript
 "{{ d.b }}|{{ d['a'][1] }}|{{ d.a.0 }}|{{ d.zz }}|{{ d['items'] }}|{{ xs[-1] }}|{{ xs[10] }}|{{ s[1] }}|{{ s[-1] }}|{{ msgs[0].role }}|{{ msgs[1]['content'] }}",
 "{{ xs[1:] }}|{{ xs[:-1] }}|{{ xs[::-1] }}|{{ xs[::2] }}|{{ xs[5:] }}|{{ xs[-10:2] }}|{{ s[1:4] }}|{{ s[::-1] }}|{{ msgs[1:][0].content }}|{{ xs[2:0:-1] }}",
 # if / for / loop
 "{% if xs %}a{% elif d %}b{% else %}c{% endif %}{% if not xs %}a{% elif d %}b{% else %}c{% endif %}{% if [] %}a{% elif none %}b{% else %}c{% endif %}",
 "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
 "{% for x in xs if x != 2 %}[{{ x }} {{ loop.index }}/{{ loop.length }}]{% else %}empty{% endfor %}{% for x in [] %}no{% else %}empty{% endfor %}{% for x in xs if x > 5 %}no{% else %}none{% endfor %}",
 "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }},{% endfor %}{% for c in 'ab' %}{{ c }}.{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}",
 "{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('o', 'e') }} {% endfor %}",
 "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
 "{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}/{{ loop.index }} {% endfor %}",
 "{% for m in msgs %}{% if m.role == 'user' %}U:{{ m.content }}{% else %}A:{{ m.content }}{% endif %}{% if not loop.last %}, {% endif %}{% endfor %}",
 # set / scoping / namespace
 "{% set a = 1 %}{% set b, c = 2, 3 %}{% set t = (4, 5) %}{% set e, f = t %}{{ a }}{{ b }}{{ c }}{{ e }}{{ f }}",
 "{% set y = 0 %}{% for x in xs %}{% set y = x %}{{ y }}{% endfor %}|{{ y }}",
 "{% set y = 7 %}{% for x in xs %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}{{ y }}",
 "{% for x in xs %}[{{ z }}]{% set z = x %}{% endfor %}",
 "{% if true %}{% set q = 3 %}{% endif %}{{ q }}",
 "{% set ns = namespace(c=0, last=none) %}{% for x in xs %}{% set ns.c = ns.c + x %}{% set ns.last = x %}{% endfor %}{{ ns.c }} {{ ns.last }} {{ ns.missing }} {{ ns }}",
 "{% set ns = namespace() %}{% set ns.index = 0 %}{% for m in msgs %}{% set ns.index = ns.index + 1 %}{% endfor %}{{ ns.index }}",
 "{% set block %}a {{ xs[0] }} b{% endset %}[{{ block }}]{{ block | length }}",
 "{% set messages = msgs[1:] %}{{ messages | length }}",
 # macros
 "{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}-{{ x }}{% endmacro %}{% for x in xs %}{{ m(x) }} {{ m(1, c=x) }} {% endfor %}{{ m() }}",
 "{% set z = 1 %}{% macro m() %}{{ z }}{{ w }}{% endmacro %}{% set w = 2 %}{{ m() }}{{ m() | length }}",
 "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
 # filters
 "{{ '  x y  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ xs | length }}|{{ s | length }}|{{ d | count }}|{{ undefined_name | length }}|{{ 'abc' | first }}|{{ xs | last }}|{{ d | first }}|{{ [] | first }}|",
 "{{ xs | join(', ') }}|{{ [1, none] | join }}|{{ msgs | join('/', attribute='role') }}|{{ 'ab' | join('-') }}|{{ undefined_name | join(',') }}",
 "{{ 'Hello World' | upper }}|{{ 'Hello' | lower }}|{{ 'hello wORLD' | capitalize }}|{{ 'hello-world foo(bar) [x]' | title }}|{{ \"they're\" | title }}|{{ 'a b' | replace(' ', '_') }}|{{ 'aaa' | replace('a', 'b', 2) }}",
 "{{ undefined_name | default('dflt') }}|{{ '' | default('dflt') }}|{{ '' | default('dflt', true) }}|{{ none | d('x') }}|{{ n | default('x', boolean=true) }}",
 "{{ d | items | list }}|{{ d | list }}|{{ 'ab' | list }}|{{ xs | string }}|{{ 5 | string }}|{{ none | string }}|{{ 'x' | safe }}",
 "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}|{{ msgs | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}|{{ xs | select('odd') | list }}|{{ xs | reject('even') | list }}|{{ [0, 1, '', 'a'] | select | list }}|{{ msgs | selectattr('role') | list | length }}",
 "{{ xs | map('string') | join }}|{{ msgs | map(attribute='missing', default='?') | list }}|{{ ['a', 'B'] | map('upper') | list }}|{{ [[1, 2], [3]] | map('length') | list }}",
 "{{ '42' | int }}|{{ '4.7' | int }}|{{ 'x' | int }}|{{ 'x' | int(7) }}|{{ 3.9 | int }}|{{ true | int }}|{{ ' 12 ' | int }}|{{ '0x1A' | int(0, 16) }}|{{ '2.5' | float }}|{{ 'x' | float }}|{{ 3 | float }}",
 "{{ -3 | abs }}|{{ 2.5 | round }}|{{ 3.5 | round }}|{{ 1.234 | round(1, 'floor') }}|{{ xs | sum }}|{{ xs | sum(start=10) }}|{{ xs | max }}|{{ ['b', 'A', 'c'] | min }}|{{ [3, 1, 2] | sort }}|{{ ['b', 'A', 'c'] | sort }}|{{ [3, 1, 2] | sort(reverse=true) }}|{{ msgs | sort(attribute='content') | map(attribute='content') | join }}|{{ [1, 2, 1, 'a', 'A'] | unique | list }}|{{ xs | reverse | list }}|{{ 'abc' | reverse }}",
 "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}|{{ '<a href=\"x\">&\\'' | escape }}|{{ '<b>' | e }}",
 "{{ d | tojson }}|{{ xs | tojson }}|{{ 'caf\u00e9 \"q\" \\\\ \\n \\u0001 <b>' | tojson }}|{{ none | tojson }}|{{ 1.0 | tojson }}|{{ true | tojson }}|{{ [] | tojson }}|{{ {} | tojson(indent=2) }}",
 "{{ d | tojson(indent=2) }}|{{ msgs[0] | tojson(indent='\\t') }}|{{ d | tojson(sort_keys=true) }}|{{ 'caf\u00e9 \U0001F600' | tojson(ensure_ascii=true) }}|{{ d | tojson(separators=(',', ':')) }}",
 # tests
 "{{ x is defined }} {{ xs is defined }} {{ undefined_name is undefined }} {{ n is none }} {{ xs is not none }} {{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 0 is false }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ 1 is number }} {{ true is number }}",
 "{{ 'a' is string }} {{ d is mapping }} {{ xs is mapping }} {{ xs is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ undefined_name is iterable }} {{ d is sequence }} {{ n is iterable }} {{ range is callable }} {{ xs is callable }} {{ 'a'.strip is callable }}",
 "{{ 3 is odd }} {{ 3 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }} {{ 2 is in xs }} {{ 2 is eq 2 }} {{ 'u' is equalto 'u' }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 1 is gt 2 }} {{ 1 is le 1 }} {{ 2 is ge 3 }} {{ 1 is lessthan 2 }} {{ 3 is greaterthan 2 }} {{ n is sameas none }} {{ true is sameas true }}",
 "{{ xs is defined and xs is not string }} {{ not n is defined }} {{ n is not defined or xs }}",
 # methods
 "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ 'a\\n\\n'.rstrip('\\n') }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'abc'.startswith('b') }}",
 "{{ 'a b  c'.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ '  a b c  '.split(none, 1) }}|{{ 'x</think>y'.split('</think>')[0] }}|{{ 'a\\nb\\r\\nc'.splitlines() }}",
 "{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'aXa'.replace('a', 'b') }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}{{ 'abcb'.find('z') }}{{ 'abab'.count('ab') }}{{ '-'.join(['a', 'b']) }}{{ 'prefix_x'.removeprefix('prefix_') }}{{ 'x.py'.removesuffix('.py') }}{{ 'abc'.isalpha() }}{{ '12'.isdigit() }}{{ ' '.isspace() }}{{ 'ab'.islower() }}{{ 'AB'.isupper() }}{{ 'a1'.isalnum() }}",
 "{{ d.items() | list }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('b') }}|{{ d.get('zz') }}|{{ d.get('zz', 9) }}|{{ xs.count(2) }}|{{ xs.index(3) }}|{{ msgs[0].get('role') }}",
 # globals
 "{{ range(3) | list }}|{{ range(1, 7, 2) | list }}|{{ range(3, 0, -1) | list }}|{{ dict(a=1, b='x') }}|{{ strftime_now('%Y-%m-%d %H:%M %a %A %b %B %j') }}|{{ strftime_now('%d %b %Y') }}",
 # whitespace control
 "a  {%- if true -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\n e {#- comment -#} f",
 "line1\n    {% if true %}\n    indented\n    {% endif %}\nline2\n  {# comment #}\nline3\n{%+ if true %}kept{% endif %}\n  {{ 'var' }}\n",
 "{% for x in xs %}\n  {{ x }}\n{% endfor %}\n{%- for x in xs %}\n{{ x }}{% endfor +%}\nend",
 "{% raw %}{{ not rendered }} {% if %}{% endraw %}|\n  {%- raw -%}  keep {{ this }}  {%- endraw %}\nafter",
 "a\r\nb\r{{ 'c' }}\r\n",
 "{# a comment #}\n{#- x #}  y\ntrailing\n",
 # case mapping (Python's full mappings: final sigma, "ß", ligatures, title-case digraphs)
 "{{ '\u03a3\u0391\u03a3 \u039f\u0394\u039f\u03a3 \u03a3'.lower() }}|{{ 'stra\u00dfe \ufb01ne'.upper() }}|{{ '\u01c6emal \u00dfa'.title() }}|{{ '\u00dfa'.capitalize() }}|{{ '\u0130'.lower() }}|{{ '\u01c6emal \u00dfa' | title }}|{{ '\u00c9COLE' | lower }}|{{ '\u00e9t\u00e9' | upper }}|{{ '\u041f\u0420\u0418\u0412\u0415\u0422'.lower() }}",
 # precedence, whitespace control corners, numbers, nesting
 "  {% if true %}x{% endif %}  \n  {#c#}  y\n\t{%- if true %}z{% endif %}",
 "a\n  {%+ if true %}b{% endif %}\n  {%- if true +%}\nc{% endif %}",
 "{% for x in xs -%}\n   {{ x }}\n{%- endfor %}",
 "{{- 'a' -}}   \n\n   {{- 'b' }}  {{ 'c' -}}   d",
 "x {#- c #} y {# c -#} z {#+ c +#} w",
 "  {% raw %}  r  {% endraw %}  \n  {%+ raw %}q{% endraw +%}\nend",
 "{{ 'ab' ~ 'cd' | upper }}{{ -1 | abs }}{{ 2 * 3 + 1 }}{{ 2 + 3 * 2 ** 2 }}{{ (2 + 3) * 2 }}{{ 7 - 2 - 1 }}{{ 2 ** 3 ** 2 }}{{ -2 ** 2 }}",
 "{{ msgs[0]['content'] | trim + '!' }}{{ msgs | length - 1 }}{{ 'x' ~ xs | length }}{{ xs | length > 2 }}",
 "{{ 1.5 | string }}{{ 100000000000000000000.0 }}{{ 1e15 }}{{ 123456789.123456789 }}{{ 0.000123 }}{{ 1/3 }}{{ 2.0 ** 0.5 }}",
 "{{ 9007199254740993 }}{{ 9007199254740993 * 1.0 }}{{ -5 // 3 }}{{ 5 // -3 }}{{ -5 % -3 }}{{ 5.5 % -2 }}{{ -0.0 // 1 }}",
 "{{ [1, [2, [3]]] | tojson(indent=1) }}{{ {'a': {'b': {}}} | tojson(indent=0) }}{{ {1: 'a', true: 'b', none: 'c', 2.5: 'd'} | tojson }}",
 "{{ 'a\\u2028b\\x7f\\x80' | tojson }}{{ 'a\\u2028b\\x7f\\x80\\xa0' }}{{ ['a\\u2028b\\x7f\\x80\\xa0\\u200b'] }}",
 "{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m(a='k') }}{{ m('p') | upper }}{{ m is defined }}",
 "{% set ns = namespace(items=[]) %}{% for x in xs %}{% set ns.items = ns.items + [x * 2] %}{% endfor %}{{ ns.items }}{% set n2 = namespace({'a': 1}, b=2) %}{{ n2.a }}{{ n2.b }}",
 "{% for a in [[1, 2], [3, 4]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}{% endfor %}{% for x in undefined_name %}a{% else %}empty{% endfor %}",
 "{{ xs == [1, 2, 3] }}{{ xs == (1, 2, 3) }}{{ d == {'items': 5, 'b': 1, 'a': [1, 2]} }}{{ true and 'x' or 'y' }}{{ false and 'x' or 'y' }}",
 "{% set t = 1, 2 %}{{ t }}{% set u = (1,) %}{{ u }}{{ (xs) }}{{ ((1)) }}{{ (1, 2)[0] }}{{ xs.0 }}{{ msgs.1.content }}",
 "{{ 'abc' | replace('', '-') }}{{ 'abc'.replace('', '-', 2) }}{{ 'a,b'.split(',', 0) }}{{ 'a b'.split(none, 0) }}{{ ''.split() }}{{ ''.split(',') }}",
 "{{ strftime_now('%%Y %Y %f %z%Z.%p %I %y %e %U %w %c') }}|{{ dict() }}{{ dict({'b': 2}, a=1) }}|{{ 'ab'[5:] }}|{{ 'ab'[-5] }}|{{ 'x' * -1 }}",
 "{{ ['a', 'B', 'b', 'A'] | sort }}{{ ['a', 'B', 'b', 'A'] | sort(case_sensitive=true) }}{{ ['a', 'B', 'b', 'A'] | unique | list }}{{ ['b', 'A'] | max }}",
 # errors: HF's sandbox refuses mutation; undefined values fail when used further
 "{{ xs.append(4) }}",
 "{{ undefined_name.attribute }}",
 "{{ undefined_name + 1 }}",
 "{{ 'x' + 1 }}",
 "{{ xs[10].a }}",
 "{{ 1 / 0 }}",
 "{% set x = 1 %}{% set x.y = 2 %}",
 "{{ raise_exception('custom failure') }}",
 "{{ 'a' in none }}",
 "{% for x in none %}a{% endfor %}",
 "{{ xs[1:2:0] }}",
 "{{ 1 < 'a' }}",
]


def make_environment():
    # As transformers' _compile_jinja_template (utils/chat_template_utils.py), without the AssistantTracker
    # extension (no fixture uses {% generation %}).
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_all(directory):
    with open(os.path.join(directory, "templates.json"), encoding="utf-8") as f:
        templates = json.load(f)["templates"]
    env = make_environment()
    cases = []
    for t in templates:
        with open(os.path.join(directory, t["file"]), encoding="utf-8", newline="") as f:
            compiled = env.from_string(f.read())
        tokens = {k: t[k] for k in ("bos_token", "eos_token") if t.get(k) is not None}
        for name, conversation in CONVERSATIONS.items():
            for add_generation_prompt in (False, True):
                case = {"template": t["name"], "conversation": name, "add_generation_prompt": add_generation_prompt}
                try:
                    case["output"] = compiled.render(messages=conversation["messages"],
                                                     tools=conversation.get("tools"), documents=None,
                                                     add_generation_prompt=add_generation_prompt,
                                                     date_string=DATE_STRING, **tokens)
                except jinja2.exceptions.TemplateError as e:
                    # raise_exception's TemplateError, or UndefinedError / SecurityError (its subclasses).
                    case["error"] = {"type": type(e).__name__, "message": str(e)}
                except (TypeError, ValueError, IndexError, KeyError) as e:
                    case["error"] = {"type": type(e).__name__, "message": str(e)}
                cases.append(case)
    constructs = []
    for source in CONSTRUCTS:
        case = {"template": source}
        try:
            case["output"] = env.from_string(source).render(**CONSTRUCT_VARIABLES)
        except (jinja2.exceptions.TemplateError, TypeError, ValueError, ZeroDivisionError) as e:
            case["error"] = {"type": type(e).__name__, "message": str(e)}
        constructs.append(case)
    doc = {
        "comment": "Generated by test/dataio/reference/render_templates.py; do not edit.",
        "now": NOW.strftime("%Y-%m-%d"),
        "date_string": DATE_STRING,
        "plain_conversations": PLAIN,
        "conversations": CONVERSATIONS,
        "cases": cases,
        "construct_variables": CONSTRUCT_VARIABLES,
        "constructs": constructs,
    }
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def main(argv):
    if len(argv) < 2 or argv[1] not in ("generate", "check"):
        print(__doc__, file=sys.stderr)
        return 64
    directory = argv[2] if len(argv) > 2 else FIXTURES
    text = render_all(directory)
    path = os.path.join(directory, "expected.json")
    if argv[1] == "generate":
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return 0
    with open(path, encoding="utf-8", newline="") as f:
        if f.read() != text:
            print(f"{path} differs from a fresh rendering (jinja2 {jinja2.__version__})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
