"""Tokenize gen_data.py conversations into flat arrays and serve length-bucketed batches.

`tokenize_jsonl` turns JSONL conversations into one .npz: `ids` (uint16, all conversations
back to back), `loss` (uint8, 1 where the token is a training target: its first character
lies in an assistant span), `offsets` (int64, conversation boundaries). Workers run in
parallel processes, one tokenizer each.

`Batches` keeps everything on the training device and yields [n, L] batches of whole
conversations (no packing, so no attention across conversations), bucketed by length so
padding stays small; labels are the ids with -100 off the assistant spans.
"""

import json
import multiprocessing
import os
import re

import numpy as np

import tiny_config as tcfg


class ByteTokenizerForTests:
    """Stand-in for local tests where HF tokenizers is absent: special tokens by name, other
    text as UTF-8 bytes (ids 0..255)."""

    _special = re.compile("|".join(re.escape(s) for s in tcfg.NAMED_SPECIALS.values()))

    def encode(self, text):
        ids, starts, pos = [], [], 0
        for m in list(self._special.finditer(text)) + [None]:
            end = m.start() if m else len(text)
            for i in range(pos, end):
                for b in text[i].encode("utf-8"):
                    ids.append(b)
                    starts.append(i)
            if m:
                ids.append(tcfg.special_id(m.group(0)))
                starts.append(m.start())
                pos = m.end()
        return ids, starts

    def decode(self, ids):
        specials = tcfg.special_tokens()
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", "replace"))
            buf = bytearray()
            if tcfg.SPECIAL_BASE <= i < tcfg.TOKENIZER_SIZE:
                out.append(specials[i - tcfg.SPECIAL_BASE])
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)


class HFTokenizer:
    def __init__(self, path):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(path)

    def encode(self, text):
        enc = self.tok.encode(text, add_special_tokens=False)
        return enc.ids, [a for a, _ in enc.offsets]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)


def load_tokenizer(path):
    if path == "bytes":
        return ByteTokenizerForTests()
    try:
        import tokenizers  # noqa: F401
    except ImportError:  # the development machine: the same encoding in pure Python
        from py_bpe import PyBPETokenizer
        return PyBPETokenizer(path)
    return HFTokenizer(path)


def tokenize_rows(tok, rows):
    """[{"text", "spans"}] -> (ids uint16, loss uint8, lengths int64), conversations back to back."""
    ids_out, loss_out, lengths = [], [], []
    for row in rows:
        ids, starts = tok.encode(row["text"])
        starts = np.asarray(starts, dtype=np.int64)
        loss = np.zeros(len(ids), dtype=np.uint8)
        for a, b in row["spans"]:
            loss[(starts >= a) & (starts < b)] = 1
        ids_out.append(np.asarray(ids, dtype=np.uint16))
        loss_out.append(loss)
        lengths.append(len(ids))
    return np.concatenate(ids_out), np.concatenate(loss_out), np.asarray(lengths, dtype=np.int64)


def _tokenize_chunk(job):
    tok_path, lines = job
    return tokenize_rows(load_tokenizer(tok_path), (json.loads(line) for line in lines))


def save_npz(parts, out_npz):
    """Concatenate tokenize_rows() results into one .npz; returns the data statistics."""
    ids = np.concatenate([p[0] for p in parts])
    loss = np.concatenate([p[1] for p in parts])
    lengths = np.concatenate([p[2] for p in parts])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    np.savez(out_npz, ids=ids, loss=loss, offsets=offsets)
    return {"conversations": int(len(lengths)), "tokens": int(len(ids)), "loss_tokens": int(loss.sum()),
            "mean_len": float(lengths.mean()), "max_len": int(lengths.max())}


def tokenize_jsonl(jsonl, tok_path, out_npz, workers=None, chunk=2000):
    with open(jsonl, encoding="utf-8") as f:
        lines = f.readlines()
    jobs = [(tok_path, lines[i:i + chunk]) for i in range(0, len(lines), chunk)]
    workers = workers or os.cpu_count() or 1
    if workers > 1 and len(jobs) > 1:
        with multiprocessing.Pool(min(workers, len(jobs))) as pool:
            parts = pool.map(_tokenize_chunk, jobs)
    else:
        parts = [_tokenize_chunk(j) for j in jobs]
    return save_npz(parts, out_npz)


class Batches:
    """Length-bucketed batches of whole conversations on `device`."""

    def __init__(self, npz, device, tokens_per_batch, max_len, seed=0, pad_multiple=64):
        import torch
        data = np.load(npz)
        offsets = data["offsets"]
        lengths = offsets[1:] - offsets[:-1]
        keep = np.nonzero(lengths <= max_len)[0]
        self.dropped = int(len(lengths) - len(keep))
        self.ids = torch.from_numpy(data["ids"].astype(np.int64)).to(device)
        self.loss = torch.from_numpy(data["loss"].astype(np.bool_)).to(device)
        self.starts = offsets[:-1]
        self.lengths = lengths
        self.device = device
        self.rng = np.random.default_rng(seed)
        self.keep = keep
        self.starts_dev = torch.from_numpy(self.starts.astype(np.int64)).to(device)
        self.lengths_dev = torch.from_numpy(lengths.astype(np.int64)).to(device)
        self.pad_multiple = pad_multiple
        self.bucket(tokens_per_batch)
        self.tokens = int(lengths[keep].sum())
        per_conv_loss = np.add.reduceat(data["loss"].astype(np.int64), offsets[:-1]) if len(lengths) else np.zeros(0)
        self.loss_tokens = int(per_conv_loss[keep].sum())

    def bucket(self, tokens_per_batch):
        """Group conversations of similar length into batches of at most `tokens_per_batch`
        padded tokens (callable again to change the batch size)."""
        import torch
        lengths, keep, pad_multiple = self.lengths, self.keep, self.pad_multiple
        self.tokens_per_batch = tokens_per_batch
        order = keep[np.argsort(lengths[keep], kind="stable")]
        self.batches = []
        i = 0
        while i < len(order):
            j = i
            while j < len(order):  # grow while the padded batch fits the token budget
                L = int(-(-lengths[order[j]] // pad_multiple) * pad_multiple)
                if (j - i + 1) * L > tokens_per_batch and j > i:
                    break
                j += 1
            self.batches.append(order[i:j])
            i = j
        # Device copies of the batch layout, so that building a batch never copies from the
        # host (a pageable host-to-device copy waits for the GPU and stalls the pipeline).
        self.members_dev = [torch.from_numpy(np.asarray(b, dtype=np.int64)).to(self.device) for b in self.batches]

    def __len__(self):
        return len(self.batches)

    def make(self, members, members_dev=None):
        import torch
        lens = self.lengths[members]
        self.last_tokens = int(lens.sum())  # host-side count of the batch's real tokens
        L = int(-(-lens.max() // 64) * 64)
        if members_dev is None:
            members_dev = torch.as_tensor(np.asarray(members, dtype=np.int64), device=self.device)
        starts = self.starts_dev[members_dev]
        lens_t = self.lengths_dev[members_dev]
        pos = torch.arange(L, device=self.device)
        valid = pos[None, :] < lens_t[:, None]
        index = torch.where(valid, starts[:, None] + pos[None, :], torch.zeros_like(pos)[None, :])
        ids = torch.where(valid, self.ids[index], torch.full_like(index, tcfg.PAD_ID))
        labels = torch.where(valid & self.loss[index], ids, torch.full_like(index, -100))
        return ids, labels, valid

    def epoch(self):
        batches, members_dev = self.batches, self.members_dev
        for k in self.rng.permutation(len(batches)):
            yield self.make(batches[k], members_dev[k])

    def stream(self):
        """Batches forever, epoch after epoch; after bucket() the next epoch uses the new size
        (the training loop starts a new stream to switch at once)."""
        while True:
            yield from self.epoch()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Tokenize gen_data.py JSONL into an .npz of ids and loss flags.")
    ap.add_argument("jsonl")
    ap.add_argument("tokenizer", help="tokenizer.json, or 'bytes' for the local test stand-in")
    ap.add_argument("out")
    ap.add_argument("--workers", type=int, default=None)
    a = ap.parse_args()
    print(json.dumps(tokenize_jsonl(a.jsonl, a.tokenizer, a.out, a.workers)))
