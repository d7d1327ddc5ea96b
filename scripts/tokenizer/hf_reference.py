#!/usr/bin/env python3
"""Hugging Face `tokenizers` reference and benchmark for muse's tokenizer.

Encodes every chunk of the conformance corpus (scripts/tokenizer/gen_corpus.mjs)
with the same tokenizer.json files the CI test uses, and records per
(tokenizer, chunk) the sha256 of the ids (decimal, joined by one space) and of
the decoded text (UTF-8). Those hashes, committed as
tests/tokenizer/hf_reference.json, let CI compare muse with Hugging Face
without Python. With --bench it also measures single-thread encode and decode
throughput (medians of --runs passes over the whole corpus), the numbers
bench/tokenizer_bench.cc reports for muse.

    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \\
    python3 scripts/tokenizer/hf_reference.py --corpus DIR --out hf_reference.json \\
        [--bench bench.json --runs 7] NAME=path/to/tokenizer.json ...

Chunks are read as bytes and decoded with errors="replace" (each maximal
invalid UTF-8 subpart becomes U+FFFD), which is what muse does with invalid
input. encode() is called with add_special_tokens=False, one text per call,
on one thread (encode_batch is not used).
"""
import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True, help="hashes (JSON)")
    ap.add_argument("--bench", help="benchmark results (JSON)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("tokenizers", nargs="+", metavar="NAME=tokenizer.json")
    args = ap.parse_args()

    with open(os.path.join(args.corpus, "manifest.json")) as f:
        manifest = json.load(f)
    chunks = manifest["chunks"]
    raw = []
    for c in chunks:
        with open(os.path.join(args.corpus, c["file"]), "rb") as f:
            data = f.read()
        if sha(data) != c["sha256"]:
            print(f"corpus file {c['file']} does not match its manifest hash", file=sys.stderr)
            return 1
        raw.append(data)
    texts = [b.decode("utf-8", errors="replace") for b in raw]
    total = sum(len(b) for b in raw)
    corpus_sha = sha("\n".join(c["sha256"] for c in chunks).encode())

    out = {
        "generator": "scripts/tokenizer/hf_reference.py",
        "tokenizers_version": tokenizers.__version__,
        "python": platform.python_version(),
        "corpus_sha256": corpus_sha,
        "corpus_bytes": total,
        "tokenizers": {},
    }
    bench = {"tokenizers_version": tokenizers.__version__, "cpu": cpu_model(), "corpus_bytes": total,
             "runs": args.runs, "threads": 1, "tokenizers": {}}
    loaded = {}
    for spec in args.tokenizers:
        name, path = spec.split("=", 1)
        with open(path, "rb") as f:
            file_sha = sha(f.read())
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(path)
        load_s = time.perf_counter() - t0
        tok.no_truncation()
        tok.no_padding()
        s = time.perf_counter()
        ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
        cold = total / 1e6 / (time.perf_counter() - s)
        entry = {"tokenizer_json_sha256": file_sha, "ids": sum(len(x) for x in ids), "chunks": {}}
        for c, x in zip(chunks, ids):
            decoded = tok.decode(x, skip_special_tokens=False)
            entry["chunks"][c["file"]] = {
                "n_ids": len(x),
                "ids_sha256": sha(" ".join(map(str, x)).encode()),
                "decoded_sha256": sha(decoded.encode("utf-8")),
            }
        out["tokenizers"][name] = entry
        loaded[name] = (tok, ids, load_s, cold)
        print(f"{name}: {entry['ids']} ids, load {load_s:.2f} s, cold pass {cold:.2f} MB/s", file=sys.stderr)
    # The hashes first, so a benchmark cut short still leaves them.
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    if not args.bench:
        return 0
    for name, (tok, ids, load_s, cold) in loaded.items():
        enc = []
        for _ in range(args.runs):
            s = time.perf_counter()
            for t in texts:
                tok.encode(t, add_special_tokens=False)
            enc.append(total / 1e6 / (time.perf_counter() - s))
        dec = []
        for _ in range(args.runs):
            s = time.perf_counter()
            for x in ids:
                tok.decode(x, skip_special_tokens=False)
            dec.append(total / 1e6 / (time.perf_counter() - s))
        bench["tokenizers"][name] = {
            "load_s": load_s, "cold_mb_s": cold, "encode_mb_s": enc, "encode_median_mb_s": statistics.median(enc),
            "decode_mb_s": dec, "decode_median_mb_s": statistics.median(dec), "ids": out["tokenizers"][name]["ids"]}
        print(f"{name}: encode median {statistics.median(enc):.2f} MB/s (min {min(enc):.2f}, max {max(enc):.2f}), "
              f"decode median {statistics.median(dec):.1f} MB/s", file=sys.stderr)
        with open(args.bench, "w") as f:
            json.dump(bench, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
