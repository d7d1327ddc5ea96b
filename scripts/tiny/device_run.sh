#!/usr/bin/env bash
# Build muse-tiny end to end on the GPU machine: data, tokenizer, target, drafter, gates.
#
#   bash scripts/tiny/device_run.sh TRAIN_CONVERSATIONS TARGET_SECONDS DRAFTER_SECONDS GATE_PROMPTS
#
# Writes into $OUT (default /tmp/tiny-out) at most 4 files (the device returns 8): the model
# directory as tar parts of at most 15 MiB (muse-tiny.tar.part-*) and logs.tar (run_log.txt,
# train_log.json, drafter_log.json, gates.json, acceptance.json, data_stats.json). Each phase
# prints its wall time. Extra train.py flags (e.g. --profile) come from $TRAIN_FLAGS.
set -euo pipefail
N=${1:-300000}
T_TARGET=${2:-270}
T_DRAFTER=${3:-80}
GATES=${4:-100}
OUT=${OUT:-/tmp/tiny-out}
W=/tmp/tiny-work
MODEL=$W/muse-tiny
S=scripts/tiny
CPUS=$(nproc)
mkdir -p "$OUT/logs" "$W" "$MODEL"
export PYTHONUNBUFFERED=1
FINAL_OUT=$OUT
OUT=$OUT/logs
exec > >(tee -a "$OUT/run_log.txt") 2>&1
pack_logs() { tar cf "$FINAL_OUT/logs.tar" -C "$FINAL_OUT" logs; }
trap pack_logs EXIT
phase() { echo "== $(date +%s) $*"; }

phase "data: $N train conversations"
python3 $S/gen_data.py --count "$N" --out $W/train.jsonl --workers "$CPUS"
python3 $S/gen_data.py --count 3000 --seed muse-tiny-heldout --out $W/heldout.jsonl --workers "$CPUS"

phase tokenizer
python3 $S/train_tokenizer.py --data $W/train.jsonl --limit 60000 --out $MODEL
cp models/muse-tiny/chat_template.jinja $MODEL/

phase tokenize
python3 $S/tokenized_data.py $W/train.jsonl $MODEL/tokenizer.json $W/train.npz --workers "$CPUS" | tee $OUT/data_stats.json
python3 $S/tokenized_data.py $W/heldout.jsonl $MODEL/tokenizer.json $W/heldout.npz --workers "$CPUS" | tee -a $OUT/data_stats.json

phase "target: ${T_TARGET}s"
python3 $S/train.py --train $W/train.npz --heldout $W/heldout.npz --out $MODEL --log $OUT/train_log.json \
  --seconds "$T_TARGET" --evals 3 --tokens-per-batch 65536 ${TRAIN_FLAGS:-}
# Keep the trained target even if a later phase dies.
tar cf - -C $W muse-tiny | split -b 15m - $FINAL_OUT/muse-tiny.tar.part-

phase "drafter (${T_DRAFTER}s, GPU) and gates (CPU) in parallel"
python3 $S/train_drafter.py --target $MODEL --train $W/train.npz --heldout $W/heldout.npz --out $MODEL/drafter \
  --log $OUT/drafter_log.json --seconds "$T_DRAFTER" > $OUT/drafter_stdout.txt 2>&1 &
DRAFTER_PID=$!
timeout 200 python3 $S/eval_gates.py --model $MODEL --n "$GATES" --workers $((CPUS - 2)) --out $OUT/gates.json || true
wait $DRAFTER_PID
cat $OUT/drafter_stdout.txt | tail -n 5

phase acceptance
timeout 60 python3 $S/eval_gates.py --model $MODEL --drafter $MODEL/drafter --records $OUT/gates_records.json \
  --device cuda --out $OUT/acceptance.json || true
rm -f $OUT/gates_records.json

phase package
du -ab $MODEL
rm -f $FINAL_OUT/muse-tiny.tar.part-*
tar cf - -C $W muse-tiny | split -b 15m - $FINAL_OUT/muse-tiny.tar.part-
ls -la $FINAL_OUT
phase done
