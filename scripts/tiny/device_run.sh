#!/usr/bin/env bash
# Build muse-tiny end to end on the GPU machine inside a fixed wall-clock budget: data, target,
# drafter and gates, drafter acceptance.
#
#   bash scripts/tiny/device_run.sh TOTAL_SECONDS [TRAIN_CONVERSATIONS] [DRAFTER_SECONDS] [GATE_PROMPTS] [GATE_SECONDS]
#
# The shipped tokenizer (models/muse-tiny/tokenizer.json) is reused, so token ids stay stable.
# The target trains for what TOTAL_SECONDS leaves after data generation and the reserved tail:
# the drafter (GPU) and the gates (CPU cores, stopped at GATE_SECONDS and scored on the prompts
# finished by then) run side by side; the acceptance measurement runs only if time is left.
# Writes into $OUT (default /tmp/tiny-out) at most 4 files (the device returns 8): the model
# directory as tar parts of at most 15 MiB (muse-tiny.tar.part-*, written right after the
# target is trained and again at the end) and logs.tar (run_log.txt, train_log.json,
# drafter_log.json, gates.json, acceptance.json, data_stats.json). Extra train.py flags (e.g.
# --profile) come from $TRAIN_FLAGS, extra train_drafter.py flags from $DRAFTER_FLAGS (local smoke
# tests: TRAIN_FLAGS=--tiny DRAFTER_FLAGS=--tiny HELDOUT=300).
# Continuing a checkpoint over several calls on one warm machine (the third checkpoint):
# TRAIN_FLAGS="--init-from DIR ..."; DATA_SEED=<seed> names the training conversations
# ($W/train-<seed>.npz, generated unless a previous call left it there); NEXT_DATA_SEED=<seed>
# generates the next call's conversations on the idle CPU cores while the target trains;
# TRAIN_ONLY=1 spends the whole budget on the target (no drafter, gates or acceptance: for all
# but the last call); AUTO_BATCH= skips the batch-size trial.
set -euo pipefail
T0=$(date +%s)
TOTAL=${1:-435}
N=${2:-240000}
T_DRAFTER=${3:-75}
GATES=${4:-100}
T_GATES=${5:-110}
OUT=${OUT:-/tmp/tiny-out}
W=/tmp/tiny-work
MODEL=$W/muse-tiny
S=scripts/tiny
CPUS=$(nproc)
mkdir -p "$OUT/logs" "$W" "$MODEL"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
FINAL_OUT=$OUT
OUT=$OUT/logs
exec > >(tee -a "$OUT/run_log.txt") 2>&1
pack_logs() { tar cf "$FINAL_OUT/logs.tar" -C "$FINAL_OUT" logs; }
trap pack_logs EXIT
elapsed() { echo $(( $(date +%s) - T0 )); }
phase() { echo "== $(elapsed)s $*"; }

phase "setup: $CPUS cores, $(nvidia-smi --query-gpu=name,memory.used --format=csv,noheader 2>/dev/null || echo no GPU)"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json chat_template.jinja; do
  cp models/muse-tiny/$f $MODEL/
done

SEED=${DATA_SEED:-muse-tiny-train}
TRAIN=$W/train-$SEED.npz
if [ -f "$TRAIN" ]; then
  phase "data: $TRAIN from an earlier call"
else
  phase "data: $N train conversations, generated and tokenized on $CPUS cores"
  python3 $S/gen_data.py --count "$N" --seed "$SEED" --out $TRAIN.tmp.npz --tokenizer $MODEL/tokenizer.json --workers "$CPUS" | tee $OUT/data_stats.json
  mv $TRAIN.tmp.npz $TRAIN
fi
if [ ! -f $W/heldout.npz ]; then
  python3 $S/gen_data.py --count "${HELDOUT:-3000}" --seed muse-tiny-heldout --out $W/heldout.tmp.npz --tokenizer $MODEL/tokenizer.json \
    --workers "$CPUS" | tee -a $OUT/data_stats.json
  mv $W/heldout.tmp.npz $W/heldout.npz
fi
if [ -n "${NEXT_DATA_SEED:-}" ] && [ ! -f "$W/train-$NEXT_DATA_SEED.npz" ]; then
  ( python3 $S/gen_data.py --count "$N" --seed "$NEXT_DATA_SEED" --out $W/next.tmp.npz --tokenizer $MODEL/tokenizer.json \
      --workers $(( CPUS > 4 ? CPUS - 4 : 1 )) > $OUT/next_data_stats.json 2>&1 \
    && mv $W/next.tmp.npz "$W/train-$NEXT_DATA_SEED.npz" ) &
  NEXT_PID=$!
fi

TAIL=$(( T_GATES > T_DRAFTER + 20 ? T_GATES : T_DRAFTER + 20 ))
if [ -n "${TRAIN_ONLY:-}" ]; then TAIL=0; fi
T_TARGET=$(( TOTAL - $(elapsed) - TAIL - 25 ))  # 25: train.py start-up, final evaluation, saving
if [ "$T_TARGET" -lt 30 ]; then T_TARGET=30; fi
phase "target: ${T_TARGET}s"
python3 $S/train.py --train $TRAIN --heldout $W/heldout.npz --out $MODEL --log $OUT/train_log.json \
  --seconds "$T_TARGET" --evals 3 --tokens-per-batch 65536 ${AUTO_BATCH---auto-batch} ${TRAIN_FLAGS:-}
# Keep the trained target even if a later phase dies.
tar cf - -C $W muse-tiny | split -b 15m - $FINAL_OUT/muse-tiny.tar.part-
if [ -n "${NEXT_PID:-}" ]; then wait "$NEXT_PID" || echo "next data failed"; fi
if [ -n "${TRAIN_ONLY:-}" ]; then cp $OUT/train_log.json $W/; phase "done (TRAIN_ONLY)"; exit 0; fi

phase "drafter (${T_DRAFTER}s, GPU) and gates (CPU, at most ${T_GATES}s) side by side"
python3 $S/train_drafter.py --target $MODEL --train $TRAIN --heldout $W/heldout.npz --out $MODEL/drafter \
  --log $OUT/drafter_log.json --seconds "$T_DRAFTER" ${DRAFTER_FLAGS:-} > $OUT/drafter_stdout.txt 2>&1 &
DRAFTER_PID=$!
timeout $(( T_GATES + 30 )) python3 $S/eval_gates.py --model $MODEL --n "$GATES" --workers $(( CPUS > 2 ? CPUS - 1 : 1 )) \
  --out $OUT/gates.json --deadline "$T_GATES" || true
wait $DRAFTER_PID || echo "drafter failed"
tail -n 5 $OUT/drafter_stdout.txt

LEFT=$(( TOTAL - $(elapsed) - 10 ))
if [ -f $MODEL/drafter/model.safetensors ] && [ "$LEFT" -gt 20 ]; then
  phase "acceptance (at most ${LEFT}s)"
  timeout "$LEFT" python3 $S/eval_gates.py --model $MODEL --drafter $MODEL/drafter --records $OUT/gates_records.json \
    --device cuda --out $OUT/acceptance.json || true
else
  phase "acceptance skipped (${LEFT}s left)"
fi
rm -f $OUT/gates_records.json

phase package
du -ab $MODEL
rm -f $FINAL_OUT/muse-tiny.tar.part-*
tar cf - -C $W muse-tiny | split -b 15m - $FINAL_OUT/muse-tiny.tar.part-
ls -la $FINAL_OUT
phase done
