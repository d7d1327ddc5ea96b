"""Render chat templates the way transformers' apply_chat_template does.

A reference for our C++ renderer: jinja2's ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, transformers' {% generation %} tag,
its tojson override and the raise_exception / strftime_now globals (as in
transformers.utils.chat_template_utils._compile_jinja_template).

Usage: hf_jinja.py < cases.jsonl > results.jsonl
Each input line: {"template": str, "context": {...}, "now": "YYYY-MM-DD"?}
Each output line: {"ok": true, "text": str} or {"ok": false, "error": str}
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(jinja2.ext.Extension):
    # Only the rendering behaviour of transformers' extension: the body renders in place.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_env(now=None):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        when = datetime.strptime(now, "%Y-%m-%d") if now else datetime.now()
        return when.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(template, context, now=None):
    try:
        text = make_env(now).from_string(template).render(**context)
        return {"ok": True, "text": text}
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        print(json.dumps(render(case["template"], case.get("context", {}), case.get("now")), ensure_ascii=False),
              flush=True)


if __name__ == "__main__":
    main()
