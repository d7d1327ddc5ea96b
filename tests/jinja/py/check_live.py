"""Renders every snippet of gen_jinja_snippets.py with Python jinja2 (under
transformers' settings) and with muse's renderer, and compares them.

Usage: check_live.py RENDER_BINARY   (exit 77 when jinja2 is not installed)
"""
import json
import os
import subprocess
import sys

try:
    import jinja2  # noqa: F401
except ImportError:
    print("SKIP: Python jinja2 is not installed (Debian: python3-jinja2)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
import gen_jinja_snippets as gen  # noqa: E402
import hf_jinja  # noqa: E402

KNOWN_DEVIATIONS = ["9223372036854775807 + 1"]  # Python integers are unbounded; ours are 64-bit


def main():
    binary = sys.argv[1]
    lines = [json.dumps({"template": t, "context": gen.CTX, "now": "2026-08-14"}) for t in gen.SNIPPETS]
    out = subprocess.run([binary], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
    ours = [json.loads(line) for line in out.stdout.splitlines()]
    failures = 0
    for tpl, mine in zip(gen.SNIPPETS, ours):
        if any(d in tpl for d in KNOWN_DEVIATIONS):
            continue
        ref = hf_jinja.render(tpl, gen.CTX, now="2026-08-14")
        if ref["ok"] != mine["ok"] or (ref["ok"] and ref["text"] != mine["text"]):
            failures += 1
            print(f"FAIL {tpl!r}\n  python: {ref}\n  ours:   {mine}")
    print(f"{len(gen.SNIPPETS)} snippets, {failures} differences from jinja2 {jinja2.__version__}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
