#!/usr/bin/env bash
# `muse run` on the embedded model with no model argument: --prompt renders
# through the chat template and streams text; --raw; --json carries the text;
# bad combinations are clear errors.
set -uo pipefail
muse=${1:?usage: muse_run.sh MUSE_BINARY}
fail() { echo "FAIL: $*"; exit 1; }

out=$("$muse" run --prompt "What color is the sky?" --max-tokens 48 2>/dev/null) || fail "muse run --prompt exited $?"
[[ "$out" == *"<|message|>"* ]] || fail "the chat-rendered output keeps the framing markers: $out"
again=$("$muse" run --prompt "What color is the sky?" --max-tokens 48 2>/dev/null)
[ "$out" == "$again" ] || fail "greedy runs differ"
plain=$("$muse" run --prompt "What color is the sky?" --max-tokens 48 --skip-special-tokens 2>/dev/null)
[[ "$plain" != *"<|"* ]] || fail "--skip-special-tokens still shows markers: $plain"
json=$("$muse" run --prompt "The sky is" --raw --max-tokens 5 --ignore-eos --json 2>/dev/null) || fail "--raw --json exited $?"
[[ "$json" == *'"text":'* && "$json" == *'"generated_tokens":5'* ]] || fail "--json: $json"
err=$("$muse" run --prompt hi --prompt-ids 1,2 2>&1) && fail "--prompt with --prompt-ids accepted"
[[ "$err" == *"not both"* ]] || fail "unclear error: $err"
err=$("$muse" run 2>&1) && fail "no prompt accepted"
[[ "$err" == *"--prompt-ids is required"* ]] || fail "unclear error: $err"
err=$("$muse" run --prompt-ids 1 --raw 2>&1) && fail "--raw without --prompt accepted"
# Tensor + expert parallelism on the CPU (2 ranks as threads): the same greedy text.
tp=$("$muse" run --prompt "What color is the sky?" --max-tokens 48 --tensor-parallel-size 2 --enable-expert-parallel 2>/dev/null) ||
  fail "muse run --tensor-parallel-size 2 exited $?"
[ "$out" == "$tp" ] || fail "TP 2 / EP 2 greedy text differs from one rank: $tp"
err=$("$muse" run --prompt hi --tensor-parallel-size 2 2>&1) && fail "Spark at TP 2 without expert parallelism accepted"
[[ "$err" == *"--enable-expert-parallel"* ]] || fail "unclear error: $err"
echo "PASS: $(printf '%s' "$out" | head -c 120)"
