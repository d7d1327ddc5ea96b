"""Byte-level BPE encoding of muse-tiny's tokenizer.json in pure Python (plus `regex`).

The development machine has no HF `tokenizers`; this encodes exactly as its BPE model does
with muse-tiny's pre-tokenizer (Split on the o200k-style regex, isolated, then ByteLevel
without its own regex): special tokens first, then each regex piece mapped to byte characters
and merged by rank. scripts/tiny/record_reference.py checks it against HF tokenizers where
that is installed (identical on the GPU machine); tokenized_data.load_tokenizer falls back to
it, so eval_gates.py also runs on the development machine.
"""

import json

import tiny_config as tcfg


def _bytes_to_unicode():
    """GPT-2's byte -> printable character map, which HF's ByteLevel pre-tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class PyBPE:
    """Encode like tokenizers' BPE with the Split(regex, isolated) + ByteLevel pre-tokenizer of
    muse-tiny's tokenizer.json: special tokens matched first, then each regex piece mapped to
    byte characters and merged by rank."""

    def __init__(self, path):
        import regex
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        model = spec["model"]
        assert model["type"] == "BPE" and not model.get("byte_fallback") and not model.get("ignore_merges")
        self.vocab = model["vocab"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.special = {t["content"]: t["id"] for t in spec["added_tokens"]}
        self.inverse = {i: t for t, i in self.vocab.items()}
        self.inverse.update({i: t for t, i in self.special.items()})
        self.split = regex.compile(tcfg.PRETOKENIZE_PATTERN)
        self.special_re = regex.compile("|".join(regex.escape(s) for s in sorted(self.special, key=len, reverse=True)))
        self.byte_map = _bytes_to_unicode()
        self.byte_unmap = {c: b for b, c in self.byte_map.items()}

    def _bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.vocab[p] for p in parts]

    def encode(self, text):
        ids, pos = [], 0
        for m in list(self.special_re.finditer(text)) + [None]:
            chunk = text[pos:m.start() if m else len(text)]
            for piece in self.split.findall(chunk):
                ids += self._bpe("".join(self.byte_map[b] for b in piece.encode("utf-8")))
            if m:
                ids.append(self.special[m.group(0)])
                pos = m.end()
        return ids

    def decode(self, ids):
        out, buf = [], bytearray()
        for i in ids:
            tok = self.inverse[i]
            if tok in self.special:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(tok)
            else:
                buf += bytes(self.byte_unmap[c] for c in tok)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)


class PyBPETokenizer(PyBPE):
    """The HFTokenizer interface of tokenized_data: encode -> (ids, char start of each token)."""

    def encode(self, text):
        ids, starts, pos = [], [], 0
        for m in list(self.special_re.finditer(text)) + [None]:
            end = m.start() if m else len(text)
            for piece in self.split.finditer(text, pos, end):
                raw = piece.group(0).encode("utf-8")
                char_of_byte = [piece.start() + i for i, ch in enumerate(piece.group(0)) for _ in ch.encode("utf-8")]
                offset = 0
                for t in self._bpe("".join(self.byte_map[b] for b in raw)):
                    ids.append(t)
                    starts.append(char_of_byte[offset])
                    offset += len(self.inverse[t])  # one character per byte in the byte-level vocab
            if m:
                ids.append(self.special[m.group(0)])
                starts.append(m.start())
                pos = m.end()
        return ids, starts
