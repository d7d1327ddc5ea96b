"""Render Muse chat templates exactly as transformers' apply_chat_template does.

The environment mirrors transformers' `_compile_jinja_template`: a sandboxed, immutable
Jinja environment with trim_blocks and lstrip_blocks, the loop-controls extension, `tojson`
as `json.dumps(ensure_ascii=False)` with default separators and key order kept, and the
globals `raise_exception` and `strftime_now`. Pure Python 3 + jinja2, so it runs on the
development machine (no transformers there) and on the GPU machine alike.
"""

import datetime
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TINY_DIR = os.path.join(REPO_ROOT, "models", "muse-tiny")
TEMPLATE_PATH = os.path.join(TINY_DIR, "chat_template.jinja")
BOS_TOKEN = "<|begin_of_text|>"


class TemplateRaised(Exception):
    """raise_exception() was called by the template (the server answers 400)."""


def _raise_exception(message):
    raise TemplateRaised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


_compiled = {}


def load_template(path=TEMPLATE_PATH):
    if path not in _compiled:
        with open(path, encoding="utf-8") as f:
            _compiled[path] = compile_template(f.read())
    return _compiled[path]


def render(messages, tools=None, add_generation_prompt=False, template=None, **kwargs):
    """Render like apply_chat_template(tokenize=False); kwargs are chat_template_kwargs."""
    template = template or load_template()
    context = dict(kwargs)
    context.setdefault("bos_token", BOS_TOKEN)
    return template.render(messages=messages, tools=tools,
                           add_generation_prompt=add_generation_prompt, **context)
