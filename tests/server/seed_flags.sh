#!/usr/bin/env bash
# Every `vllm serve` flag used by the deployment recipes in shared/seeds is
# recognised by `muse serve`: implemented ones start the server (which then
# exits 0 on SIGINT), the others are refused at start with a message naming
# the flag. Usage: seed_flags.sh MUSE_FAKE_BINARY (build/muse_fake: the same
# `serve` flags over the fake model, so no weights load).
set -u
muse=${1:?usage: seed_flags.sh MUSE_FAKE_BINARY}
fail=0

accepted=(
  "--host 127.0.0.1" "--port 0" "--served-model-name musespark" "--tokenizer-mode hf" "--config-format auto"
  "--load-format safetensors" "--generation-config vllm" "--language-model-only" "--dtype bfloat16"
  "--tensor-parallel-size 1" "--max-model-len 32768" "--max-model-len 128k" "--max-num-batched-tokens 4096"
  "--gpu-memory-utilization 0.95" "--enable-chunked-prefill" "--reasoning-parser muse" "--tool-call-parser muse"
  "--enable-auto-tool-choice" "--max-num-seqs 32" "--reasoning-parser muse_glimmer"
  "--tensor-parallel-size 8" "--enable-expert-parallel" "--enforce-eager"
  "--distributed-executor-backend mp" "--pipeline-parallel-size 1" "--cpu-offload-gb 0" "--trust-remote-code"
)
# Refused with a message naming the flag (values that ask for what muse does
# anyway, above, are accepted). `--speculative-config` itself is
# supported; this one is refused because it names no drafter (`model`), which
# the embedded model has none of under that name.
refused=(
  "--attention-backend ROCM_AITER_FA" "--compilation-config {\"cudagraph_mode\":\"FULL_AND_PIECEWISE\"}"
  "--distributed-executor-backend ray" "--moe-backend triton" "--pipeline-parallel-size 2"
  "--speculative-config {\"method\":\"dspark\"}" "--kernel-config {\"enable_flashinfer_autotune\":false}"
  "--offload-backend uva" "--cpu-offload-gb 310" "--cpu-offload-params experts" "--quantization gptq"
  "--model-path x" "--tp-size 2" "--tensor-parallel-size 0"
)

# All accepted flags at once (as the recipes combine them): the server must
# come up and exit 0 on SIGINT. (--max-model-len appears twice: the last wins.)
# shellcheck disable=SC2046
timeout --preserve-status -s INT 3 "$muse" serve $(printf '%s ' "${accepted[@]}") >/tmp/muse_seed_$$.log 2>&1
rc=$?
if [ $rc -ne 0 ] || ! grep -q "ready" /tmp/muse_seed_$$.log; then
  echo "FAIL: the accepted flags should start the server (exit $rc)"; cat /tmp/muse_seed_$$.log; fail=1
else
  echo "ok: accepted ${accepted[*]}"
fi
for args in "${refused[@]}"; do
  flag=${args%% *}
  # shellcheck disable=SC2086
  out=$(timeout 5 "$muse" serve --host 127.0.0.1 --port 0 $args 2>&1)
  rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "$flag" <<<"$out"; then
    echo "FAIL: '$args' should be refused naming $flag (exit $rc): $out"; fail=1
  else
    echo "ok: refused $flag: ${out#muse serve: }"
  fi
done
rm -f /tmp/muse_seed_$$.log
[ $fail -eq 0 ] && echo "all seed flags recognised"
exit $fail
