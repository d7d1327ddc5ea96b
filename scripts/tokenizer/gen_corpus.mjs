#!/usr/bin/env node
// Writes the tokenizer conformance corpus: CHUNKS files of about CHUNK_BYTES
// bytes each, deterministic (own PRNG, fixed tables; no dependence on the
// Node or Unicode version), mixing what tokenizers get wrong: English with
// contractions, code, CJK, Arabic/Hebrew/Devanagari/Thai with combining
// marks, emoji (ZWJ sequences, skin tones, flags, keycaps), digits of many
// scripts, long whitespace runs, mixed scripts, NFD text, special-token
// spellings and near misses, and invalid UTF-8 bytes.
//
//   node scripts/tokenizer/gen_corpus.mjs --out DIR [--chunks 72] [--chunk-bytes 16384]
//
// Every code point used is assigned in Unicode 14 or earlier, so the
// references (Oniguruma 6.9.x in HF tokenizers, V8's ICU) classify them alike.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []));
const outDir = args.out;
if (!outDir) {
  console.error("usage: gen_corpus.mjs --out DIR [--chunks N] [--chunk-bytes B]");
  process.exit(2);
}
const CHUNKS = Number(args.chunks ?? 72);
const CHUNK_BYTES = Number(args["chunk-bytes"] ?? 16384);

// mulberry32: a small deterministic PRNG.
let state = 0x5eed1234;
function rnd() {
  state = (state + 0x6d2b79f5) | 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (n) => Math.floor(rnd() * n);
const pick = (a) => a[int(a.length)];
const range = (lo, hi) => String.fromCodePoint(lo + int(hi - lo + 1));
const many = (n, f) => Array.from({ length: n }, f).join("");

const WORDS = ("the of and to in is was he for it with as his on be at by had are but from or have an they which one " +
  "you were all we her she there would their will when who him been has more if no out so said what up its about " +
  "into than them can only other time new some could these two may first then do any like my now over such our man " +
  "me even most made after also did many before must through back years where much your way well down should because " +
  "each just those people how too little state good very make world still own see men work long get here between both " +
  "life being under never day same another know while last might us great old year off come since against go came " +
  "right used take three tokenizer encoder decoder server request latency throughput kernel tensor gradient").split(" ");
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "'M",
  "\u2019s", "'\u017f", "'x", "'", "''"];

function english() {
  let s = "";
  const sentences = 1 + int(4);
  for (let k = 0; k < sentences; k++) {
    const n = 4 + int(14);
    const words = [];
    for (let i = 0; i < n; i++) {
      let w = pick(WORDS);
      const r = rnd();
      if (r < 0.08) w = w[0].toUpperCase() + w.slice(1);
      else if (r < 0.11) w = w.toUpperCase();
      else if (r < 0.13) w = w + pick(CONTRACTIONS);
      else if (r < 0.15) w = "don" + pick(["'t", "'T", "\u2019t"]);
      else if (r < 0.17) w = pick(["\"", "(", "'", "[", "--"]) + w + pick(["\"", ")", "'", "]", ","]);
      words.push(w);
    }
    let sent = words.join(" ");
    sent = sent[0].toUpperCase() + sent.slice(1) + pick([".", ".", "!", "?", "...", ";", ":", " —", "?!"]);
    s += sent + (rnd() < 0.2 ? "\n" : " ");
  }
  return s;
}

const CODE = [
  "#include <vector>\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return v.size() > 2 ? 0 : 1;\n}\n",
  "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n",
  "const f = async (url) => {\n\tconst r = await fetch(url, { method: 'POST', headers: {'x-id': 42} });\n\treturn r.ok ? r.json() : null;\n};\r\n",
  "{\"model\": \"muse\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": 0.7, \"max_tokens\": 128}\n",
  "SELECT id, name FROM users WHERE created_at >= '2024-01-01' AND email LIKE '%@example.com' ORDER BY id DESC;\n",
  "fn main() {\n    let xs: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{:?}\", xs);\n}\n",
  "<div class=\"card\"><a href=\"https://example.com/path?q=1&r=2#frag\">link</a></div>\n",
  "    if (ptr != nullptr && *ptr == '\\0') { /* empty */ }\n\t\t// TODO(muse): handle\tTABS\n",
  "$ ls -la /usr/local/bin | grep -E '^-rwx' > /tmp/out.txt 2>&1 && echo $?\n",
  "x = [i**2 for i in range(100) if i % 3 == 0]  # squares\ny = {k: v for k, v in zip('abc', [1,2,3])}\n",
  "a/b/c.txt ../../etc/passwd C:\\Windows\\System32 http://x.y/z//w ///\n",
];
const code = () => pick(CODE);

function cjk() {
  const parts = [];
  const n = 3 + int(8);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.35) parts.push(many(2 + int(20), () => range(0x4e00, 0x9fa5)));
    else if (r < 0.5) parts.push(many(2 + int(12), () => range(0x3041, 0x3096)));
    else if (r < 0.62) parts.push(many(2 + int(12), () => range(0x30a1, 0x30fa)));
    else if (r < 0.78) parts.push(many(2 + int(12), () => range(0xac00, 0xd7a3)));
    else if (r < 0.85) parts.push(many(1 + int(6), () => range(0x3400, 0x4dbf)));
    else if (r < 0.9) parts.push(many(1 + int(4), () => range(0x20000, 0x2a6df)));
    else parts.push(pick(["。", "、", "「", "」", "！", "？", "：", "（", "）", "ー", "・", "，", "～"]));
    if (rnd() < 0.2) parts.push(pick([" ", "\n", "abc", "123", "ＡＢＣ", "１２３", "ｶﾀｶﾅ"]));
  }
  return parts.join("");
}

function rtl_and_indic() {
  const r = rnd();
  const word = (lo, hi, marks) => {
    let w = "";
    const n = 2 + int(7);
    for (let i = 0; i < n; i++) {
      w += range(lo, hi);
      if (marks && rnd() < 0.4) w += range(marks[0], marks[1]);
    }
    return w;
  };
  if (r < 0.35) return many(3 + int(8), () => word(0x0621, 0x064a, [0x064b, 0x0652]) + pick([" ", " ", "، ", "؟ ", ". "]));
  if (r < 0.55) return many(3 + int(8), () => word(0x05d0, 0x05ea, [0x05b0, 0x05bc]) + pick([" ", " ", ", "]));
  if (r < 0.8) return many(3 + int(8), () => word(0x0915, 0x0939, [0x093e, 0x094d]) + pick([" ", " ", "। "]));
  return many(3 + int(8), () => word(0x0e01, 0x0e2e, [0x0e31, 0x0e3a]) + pick(["", " "]));
}

const EMOJI = ["😀", "😂", "🥲", "🙂", "👍", "👍🏽", "👍🏿", "❤️", "❤", "✨", "🔥", "🎉", "🚀", "🇺🇸", "🇯🇵", "🇫🇷", "🏳️‍🌈",
  "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏾‍🚀", "👁️‍🗨️", "1️⃣", "#️⃣", "©️", "™", "☕", "🐍", "🦀", "🍣", "⌚", "⚽️", "🤌🏻", "🫶", "🧪"];
const emoji = () => many(1 + int(8), () => pick(EMOJI) + (rnd() < 0.3 ? pick([" ", "", "!", "\n", "x"]) : ""));

function digits() {
  const r = rnd();
  if (r < 0.3) return many(1 + int(40), () => String(int(10)));
  if (r < 0.45) return `${int(100000)}.${int(1000)}e-${int(30)} ${int(1e9)},${int(999)} +1-555-${1000 + int(9000)}`;
  if (r < 0.55) return `${2000 + int(30)}-${1 + int(12)}-${1 + int(28)}T${int(24)}:${int(60)}:${int(60)}Z`;
  if (r < 0.65) return many(1 + int(12), () => range(0x0660, 0x0669));
  if (r < 0.72) return many(1 + int(12), () => range(0x06f0, 0x06f9));
  if (r < 0.8) return many(1 + int(12), () => range(0xff10, 0xff19));
  if (r < 0.86) return many(1 + int(6), () => range(0x0966, 0x096f));
  if (r < 0.92) return "x² + y³ = z⁴ ½ ¾ ⅓ Ⅻ ⅻ ① ⑩ " + many(3, () => range(0x2070, 0x2079));
  return "v" + int(10) + "." + int(100) + "." + int(1000) + " 0x" + int(0xffffff).toString(16) + " 1,234,567.89";
}

const SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2003", "\u2009", "\u202f", "\u205f",
  "\u1680", "\u2028", "\u000b", "\u000c"];
function whitespace() {
  const r = rnd();
  if (r < 0.3) return " ".repeat(1 + int(300)) + pick(WORDS);
  if (r < 0.45) return "\n".repeat(1 + int(40)) + pick(WORDS);
  if (r < 0.55) return "\t".repeat(1 + int(30)) + pick(WORDS);
  if (r < 0.65) return many(1 + int(60), () => pick(SPACES)) + pick(WORDS);
  if (r < 0.75) return pick(WORDS) + " ".repeat(2 + int(80)) + "\n" + " ".repeat(int(20)) + pick(WORDS);
  if (r < 0.85) return " \r\n \r\n\t \n" + pick(WORDS) + "   ";
  return many(1 + int(20), () => pick(SPACES) + pick(WORDS));
}

function mixed() {
  const r = rnd();
  if (r < 0.15) return "Ελληνικά: ΣΊΣΥΦΟΣ σίσυφος ς ΑΒΓ αβγ. Русский текст: Привет, МИР! Ёлка. ";
  if (r < 0.25) return "e\u0301 a\u0300 o\u0308 n\u0303 A\u030a \u1100\u1161\u11a8 ffi ﬁ ﬀ Å K ẞ ß İstanbul ıi ſt ";
  if (r < 0.35) return "naïve café façade résumé Zoë Ångström Łódź Dvořák Þór ǅ ǈ ǋ Ǳ ǲ ";
  if (r < 0.45) return "I'ſ IT'ſ you'RE they'VE I'LL he'D x'ſx "; 
  if (r < 0.55) return "mixedCaseWordsLikeThis XMLHttpRequest iPhone McDonald's ÉCOLE École ĀĒĪŌŪ āēīōū ";
  if (r < 0.65) return "\u0301\u0302 \u0951 combining-first: \u0300abc \u20dd\u20e3 ᾼ ᾳ ῼ ";
  if (r < 0.75) return "zero\u200bwidth\u200cjoiner\u200d here\u2060and\ufe0fthere \u00ad soft-hyphen \u061c rlm\u200f ";
  if (r < 0.85) return "ℌ𝔢𝔩𝔩𝔬 𝐁𝐨𝐥𝐝 𝑖𝑡𝑎𝑙𝑖𝑐 ⓒⓘⓡⓒⓛⓔ 🄰🄱 ＦｕｌｌＷｉｄｔｈ ";
  if (r < 0.92) return "ॐ नमः शिवाय · ๑๒๓ ภาษาไทย · ☃ ☂ ♠ ♣ ♥ ♦ → ← ↔ ∀x∈ℝ: x²≥0 ≠ ≤ ≥ ∞ ";
  return "\u0007\u0000\u001b[31mred\u001b[0m \u007f\u0080\u0085\u009f ";
}

const SPECIALS = ["<|endoftext|>", "<|endofprompt|>", "<|startoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
  "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>",
  "<think>", "</think>", "<tool_call>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>", "<unk>",
  "<start_of_image>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
  "<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>",
  "<|reserved_special_token_5|>", "<|python_tag|>", "<|eom_id|>", "<mask>", "[MASK]", "<0x0A>", "▁"];
const NEAR = ["<|endoftext |>", "<| endoftext|>", "<|ENDOFTEXT|>", "<|im_start", "im_start|>", "< |im_end|>",
  "<|eot_id", "<|begin_of_text||>", "<<|im_start|>>", "<|<|im_end|>|>", "<bos", "bos>", "<start_of_turn >",
  "<｜begin of sentence｜>", "<|start|>>", "<|reserved_special_token_99999|>", "< think>", "</think", "<tool_call >"];
function specials() {
  return many(1 + int(6), () => {
    const t = rnd() < 0.6 ? pick(SPECIALS) : pick(NEAR);
    const before = pick(["", " ", "  ", "\n", "x", "user", " hello "]);
    const after = pick(["", " ", "   ", "\n", "y", "assistant\n", "Hi"]);
    return before + t + after;
  });
}

// Invalid UTF-8 and odd byte sequences, returned as a Buffer.
function invalidBytes() {
  const cases = [
    [0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf],
    [0xf0, 0x80, 0x80, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xf5], [0xff], [0xfe, 0xff], [0xe4, 0xb8], [0xf0, 0x9f, 0x98],
    [0xc3], [0xe2, 0x82], [0x61, 0x80, 0x62], [0xc3, 0x28], [0xe2, 0x28, 0xa1], [0xf0, 0x28, 0x8c, 0xbc],
  ];
  const parts = [];
  const n = 1 + int(6);
  for (let i = 0; i < n; i++) {
    if (rnd() < 0.7) parts.push(Buffer.from(pick(cases)));
    else parts.push(Buffer.from(Array.from({ length: 1 + int(8) }, () => 0x80 + int(128))));
    parts.push(Buffer.from(pick(["", " ", "abc", "中", "é", "\n", "<|endoftext|>"]), "utf8"));
  }
  return Buffer.concat(parts);
}

const GENERATORS = [
  [english, 30], [code, 12], [cjk, 10], [rtl_and_indic, 8], [emoji, 6], [digits, 8], [whitespace, 7], [mixed, 8],
  [specials, 5], [invalidBytes, 3],
];
const TOTAL = GENERATORS.reduce((s, [, w]) => s + w, 0);
function segment() {
  let r = int(TOTAL);
  for (const [g, w] of GENERATORS) {
    if (r < w) {
      const v = g();
      return Buffer.isBuffer(v) ? v : Buffer.from(v, "utf8");
    }
    r -= w;
  }
  throw new Error("unreachable");
}

fs.mkdirSync(outDir, { recursive: true });
const manifest = [];
let total = 0;
for (let c = 0; c < CHUNKS; c++) {
  const parts = [];
  let size = 0;
  while (size < CHUNK_BYTES) {
    const b = segment();
    parts.push(b);
    size += b.length;
  }
  const chunk = Buffer.concat(parts);
  const name = `chunk_${String(c).padStart(3, "0")}.txt`;
  fs.writeFileSync(path.join(outDir, name), chunk);
  manifest.push({ file: name, bytes: chunk.length, sha256: crypto.createHash("sha256").update(chunk).digest("hex") });
  total += chunk.length;
}
fs.writeFileSync(path.join(outDir, "manifest.json"), JSON.stringify({ generator: "gen_corpus.mjs", total_bytes: total, chunks: manifest }, null, 1) + "\n");
console.log(`wrote ${CHUNKS} chunks, ${total} bytes, to ${outDir}`);
