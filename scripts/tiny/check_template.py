#!/usr/bin/env python3
"""Check muse-tiny's chat_template.jinja against the Muse Glimmer conformance data.

1. Every case of ../shared/testdata/muse-glimmer/chat-cases.json must render byte-identical
   (the cases were rendered by transformers' apply_chat_template on the real checkpoint).
2. With --differential N, also render N random conversations (tools, parallel calls,
   reasoning, odd values, edge-case fields) through both our template and the publisher's
   file in the shared test data, and require identical output or identical errors. The
   publisher's file is only read from ../shared; it is never copied into the repository.

Exit status 0 when everything matches; 77 (the ctest skip code) when the shared data is
absent, with a message naming the missing path.
"""

import argparse
import hashlib
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import muse_chat  # noqa: E402  (needs jinja2: Debian python3-jinja2)
except ImportError as e:
    print("SKIP: %s (install python3-jinja2)" % e)
    sys.exit(77)

SHARED = os.path.join(muse_chat.REPO_ROOT, "..", "shared", "testdata", "muse-glimmer")
CASES = os.path.join(SHARED, "chat-cases.json")
REAL_TEMPLATE = os.path.join(SHARED, "chat_template.jinja")
REAL_SHA256 = "cfc67e5f349f37690dfd31ed1f18bc4442a9dd32fe39a648f993cb4eb3cae678"
SKIP = 77


def render_or_error(template, kwargs):
    try:
        return "ok", muse_chat.render(template=template, **kwargs)
    except Exception as e:  # the error text is compared too
        return "error", "%s: %s" % (type(e).__name__, e)


def check_cases(ours):
    with open(CASES, encoding="utf-8") as f:
        data = json.load(f)
    failures = 0
    for case in data["cases"]:
        kind, text = render_or_error(ours, dict(case["kwargs"]))
        if kind != "ok" or text != case["expected"]:
            failures += 1
            print("FAIL %s" % case["name"])
            if kind == "ok":
                i = next((k for k, (a, b) in enumerate(zip(text, case["expected"])) if a != b),
                         min(len(text), len(case["expected"])))
                print("  first difference at %d:\n  got      %r\n  expected %r"
                      % (i, text[max(0, i - 40):i + 60], case["expected"][max(0, i - 40):i + 60]))
            else:
                print("  " + text)
    total = len(data["cases"])
    print("chat-cases: %d/%d byte-identical" % (total - failures, total))
    return failures == 0


# ---- differential testing against the publisher's template -------------------------------

WORDS = ["Paris", "Oslo", "rain", "café", "x < y & z", "it's", 'say "hi"', "", " spaced ",
         "multi\nline", "<|eot|>", "Reasoning effort: low", "reasoning strength: high", "日本"]
VALUES = [0, 1, -3, 42, 1.5, 2.0, 1e30, 1e16, 1e15, 0.0001, 1e-05, -0.0, True, False, None,
          "text", "", "a b", [1, "two", None], {"k": "v", "n": 3}, [], {}, [{"a": [1, 2.5]}]]
TOOL_NAMES = ["get_weather", "weather.get_forecast", "calendar.add_event", "calc", "a.b.c",
              "unit_convert"]


def random_tool(rng, name):
    fn = {"name": name, "description": rng.choice(WORDS),
          "parameters": {"type": "object",
                         "properties": {"p%d" % i: {"type": rng.choice(["string", "integer"])}
                                        for i in range(rng.randint(0, 3))}}}
    if rng.random() < 0.2:
        fn["strict"] = True
    return {"type": "function", "function": fn} if rng.random() < 0.8 else fn


def random_content(rng):
    r = rng.random()
    if r < 0.7:
        return rng.choice(WORDS)
    if r < 0.8:
        return None
    parts = []
    for _ in range(rng.randint(0, 4)):
        t = rng.choice(["text", "image", "video", "image_url", "audio"])
        parts.append({"type": t, "text": rng.choice(WORDS)} if t == "text" else {"type": t})
    return parts


def random_call(rng, names, idx):
    args = {}
    for i in range(rng.randint(0, 4)):
        args[rng.choice(["city", "days", "q", "x%d" % i, "unit"])] = rng.choice(VALUES)
    call = {"id": "call_%d" % idx, "type": "function",
            "function": {"name": rng.choice(names), "arguments": args}}
    if rng.random() < 0.1:
        call = {"id": "call_%d" % idx, "name": call["function"]["name"], "arguments": args}
    return call


def random_kwargs(rng):
    names = rng.sample(TOOL_NAMES, rng.randint(1, 4))
    tools = [random_tool(rng, n) for n in names] if rng.random() < 0.6 else rng.choice([None, []])
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": random_content(rng)})
    call_idx = 0
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(["user", "user", "assistant", "assistant", "tool", "developer", "system"])
        m = {"role": role}
        if role == "assistant":
            if rng.random() < 0.5:
                m["reasoning_content"] = rng.choice(WORDS + [None])
            if rng.random() < 0.4:
                m["tool_calls"] = []
                for _ in range(rng.randint(1, 3)):
                    m["tool_calls"].append(random_call(rng, names, call_idx))
                    call_idx += 1
                if rng.random() < 0.3:
                    m["content"] = "dropped"
            else:
                m["content"] = random_content(rng)
                if rng.random() < 0.3:
                    m["recipient"] = rng.choice(["self", "user", "weather.get_forecast", None])
                if rng.random() < 0.3:
                    m["end_turn"] = rng.choice([True, False, None, 0, 1, "false", ""])
        elif role == "tool":
            m["content"] = random_content(rng)
            r = rng.random()
            if r < 0.3:
                m["name"] = rng.choice(names + [None, ""])
            elif r < 0.9:
                m["tool_call_id"] = "call_%d" % rng.randint(0, call_idx + 1)
        else:
            m["content"] = random_content(rng)
        messages.append(m)
    kwargs = {"messages": messages, "tools": tools,
              "add_generation_prompt": rng.random() < 0.7}
    for key, choices in (("reasoning_strength", ["low", "medium", "xhigh", "", None, "max"]),
                         ("knowledge_cutoff", ["2025-12-01", "", None]),
                         ("current_date", ["2026-08-14", "", None]),
                         ("tool_namespace_descriptions",
                          [{"weather": "Weather data.", "calendar": 'say "hi"'}, {}, None])):
        if rng.random() < 0.3:
            kwargs[key] = rng.choice(choices)
    return kwargs


def check_differential(ours, count, seed):
    real = muse_chat.load_template(REAL_TEMPLATE)
    rng = random.Random(seed)
    mismatches = 0
    for i in range(count):
        kwargs = random_kwargs(rng)
        kwargs.setdefault("current_date", "2026-08-14")  # strftime_now differs per call
        a = render_or_error(ours, json.loads(json.dumps(kwargs)))
        b = render_or_error(real, json.loads(json.dumps(kwargs)))
        if a != b:
            mismatches += 1
            if mismatches <= 5:
                print("DIFF #%d kwargs=%s" % (i, json.dumps(kwargs, ensure_ascii=False)[:600]))
                print("  ours %s %r" % (a[0], a[1][-300:]))
                print("  real %s %r" % (b[0], b[1][-300:]))
    print("differential: %d/%d random conversations identical" % (count - mismatches, count))
    return mismatches == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--differential", type=int, default=0, metavar="N",
                    help="also compare N random conversations with the publisher's template")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    for path in (CASES, REAL_TEMPLATE):
        if not os.path.exists(path):
            print("SKIP: shared test data not found: %s" % os.path.normpath(path))
            return SKIP
    with open(REAL_TEMPLATE, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != REAL_SHA256:
            print("FAIL: %s does not have the pinned SHA-256 %s" % (REAL_TEMPLATE, REAL_SHA256))
            return 1
    ours = muse_chat.load_template()
    ok = check_cases(ours)
    if args.differential:
        ok = check_differential(ours, args.differential, args.seed) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
