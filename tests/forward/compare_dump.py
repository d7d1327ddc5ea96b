#!/usr/bin/env python3
"""Runs `muse run --dump-logits` on every fixture and compares with the
reference logits (stdlib only, so it runs anywhere muse does, e.g. the GPU
host, to check the AVX-512 kernels end to end).

usage: compare_dump.py MUSE_BINARY FIXTURES_DIR [--threads N]
Exit status 0 when every fixture is within tolerance_rel and greedy ids match."""
import array, json, os, subprocess, sys, tempfile


def main():
    muse, root = sys.argv[1], sys.argv[2]
    threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "0"
    ok = True
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not os.path.isfile(os.path.join(d, "reference.json")):
            continue
        ref = json.load(open(os.path.join(d, "reference.json")))
        with tempfile.NamedTemporaryFile(suffix=".f32") as dump:
            cmd = [muse, "run", d, "--prompt-ids", ",".join(map(str, ref["prompt_ids"])), "--max-tokens",
                   str(len(ref["generated_ids"])), "--temperature", "0", "--json", "--language-model-only",
                   "--threads", threads, "--dump-logits", dump.name]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{name}: muse run failed: {out.stderr.strip()}")
                ok = False
                continue
            res = json.loads(out.stdout)
            got = array.array("f")
            got.frombytes(open(dump.name, "rb").read())
        want = array.array("f")
        want.frombytes(open(os.path.join(d, ref.get("logits_file", "logits.f32")), "rb").read())
        if len(got) != len(want):
            print(f"{name}: {len(got)} values, reference has {len(want)}")
            ok = False
            continue
        scale = max(abs(x) for x in want)
        err = max(abs(a - b) for a, b in zip(got, want)) / scale
        greedy = res["ids"] == ref["generated_ids"]
        good = greedy and err <= ref.get("tolerance_rel", 2e-3)
        ok &= good
        print(f"{name}: max |muse - reference| / max|logit| = {err:.3e}, greedy {'33/33' if greedy else 'DIFFERS'}"
              f", {res['backend']}, decode {res['decode_tokens_per_second']:.0f} tok/s -> {'ok' if good else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
