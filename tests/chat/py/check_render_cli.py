"""End-to-end check of `muse render`: the 31 Muse Glimmer cases as OpenAI
requests on standard input must print exactly the Hugging Face prompt, and
--json must carry the ids `muse tokenize` gives for that prompt.

The real Muse tokenizer is not available, so the model directory pairs the
Glimmer template with a byte-level tokenizer.json written here (every byte a
token, Muse's special tokens at their real ids): the prompt text is what is
under test; the ids check that --json encodes the prompt without adding
special tokens and reads each special-token spelling as its id.

Usage: check_render_cli.py MUSE_BINARY REPO_ROOT WORK_DIR   (exit 77: data absent)
"""
import json
import os
import shutil
import subprocess
import sys


SPECIALS = {"<|begin_of_text|>": 200000, "<|end_of_text|>": 200001, "<|eom|>": 200007, "<|eot|>": 200008,
            "<|start|>": 200022, "<|message|>": 200023, "<|video|>": 200091, "<|patch|>": 200092}


def byte_level_tokenizer():
    # GPT-2's byte-to-unicode table: the byte-level alphabet.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    vocab.update(SPECIALS)  # in the vocabulary at their ids, so the added tokens keep them
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for t, i in SPECIALS.items()]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                                "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []}}


def main():
    muse, root, work = sys.argv[1:4]
    glimmer = os.path.join(root, "..", "shared", "testdata", "muse-glimmer")
    tpl = os.path.join(glimmer, "chat_template.jinja")
    cases_path = os.path.join(glimmer, "chat-cases.json")
    if not os.path.exists(tpl) or not os.path.exists(cases_path):
        print(f"SKIP: shared test data absent ({glimmer})")
        sys.exit(77)
    model = os.path.join(work, "render-cli-model")
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "tokenizer.json"), "w") as f:
        json.dump(byte_level_tokenizer(), f)
    shutil.copy(tpl, os.path.join(model, "chat_template.jinja"))
    with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>"}, f)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump({"model_type": "muse_glimmer"}, f)

    cases = json.load(open(cases_path))["cases"]
    failures = 0
    for case in cases:
        kwargs = dict(case["kwargs"])
        request = {k: kwargs.pop(k) for k in ("messages", "tools", "add_generation_prompt") if k in kwargs}
        request.setdefault("add_generation_prompt", False)
        request["chat_template_kwargs"] = kwargs
        body = json.dumps(request)
        text = subprocess.run([muse, "render", "--model", model], input=body.encode(), capture_output=True)
        if case["name"] == "unknown_role":  # developer -> system by design (requirement 7)
            ok = text.returncode == 0 and b"<|start|>system<|message|>dropped entirely" in text.stdout
        else:
            ok = text.returncode == 0 and text.stdout.decode() == case["expected"]
        js = subprocess.run([muse, "render", "--model", model, "--json"], input=body.encode(), capture_output=True)
        if ok and js.returncode == 0:
            out = json.loads(js.stdout)
            ids = subprocess.run([muse, "tokenize", "--model", model, "--file", "-", "--json"], input=out["prompt"].encode(),
                                 capture_output=True)
            ok = out["prompt"] == text.stdout.decode() and ids.returncode == 0 and json.loads(ids.stdout)["ids"] == out["ids"]
            # No BOS added; the template's own <|begin_of_text|><|start|> read as ids.
            ok = ok and out["ids"][:2] == [200000, 200022]
        if not ok:
            failures += 1
            print(f"FAIL {case['name']}: rc={text.returncode} {text.stderr.decode()[:300]}")
    print(f"muse render: {len(cases) - failures}/{len(cases)} Muse Glimmer cases")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
