#!/usr/bin/env bash
# One H200 sitting for the draft head, as three device calls after the pair is staged (stage_weights.sh, the
# workplace tool; its header gives the ~39 piece calls). Each call carries [".whl", "minitorch/cuda_kernels"] and
# runs `bash tools/gpu_sitting.sh STEP`; a machine of two GPUs (nvidia-h200-x2) does the GPU-1 parts at the same time,
# one GPU skips them. The head lives on the machine between calls (the machine goes back ~30 s after a call ends:
# issue the next call at once: the three in ONE message, since a turn's thinking outlasts the 30 s) and comes back,
# in 15 MB parts, only with the last call.
#   train1  GPU 0: a head from scratch (or INIT=DIR) for TRAIN_LIMIT s (default 530; the features, at most half of
#           it, stay in /root/features); GPU 1: the 0.5B draft's benchmarks (GSM8K and MATH-500 first 20, gamma
#           $G, default 4), then new self-written text from START (default 5116) for the rest of the call
#   train2  GPU 0: on from train1's head for TRAIN_LIMIT s with the same features (no extraction); GPU 1: more text
#           from START2 (default START + 2080)
#   bench   GPU 0: the head's benchmarks (both sets at gamma $G, then MORE, default "math500:3 gsm8k:5": a set at
#           another gamma each) and, on one GPU (where train1 could not), the 0.5B draft's at gamma $G in the same
#           call (KINDS, default "head model"); the head comes back
# At most 8 files come back a call: each call packs its logs and texts into archives.
set -u
STEP="${1:-}"; O="${OUT:-/tmp/gpu}"; G="${G:-4}"; mkdir -p "$O"
export MINITORCH_SPEC_CACHE=/root/cache PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ -d .whl ] && { [ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; }; } && export PYTHONPATH=/tmp/site
# pack NAME PATTERN...: the files of $O that match (existing ones only), as one archive
pack() { local name=$1 f; shift; (cd "$O" && shopt -s nullglob && set -- $@ && for f; do shift; [ -e "$f" ] && set -- "$@" "$f"; done
  [ $# -gt 0 ] && tar czf "$name" "$@" && rm -rf "$@"); }
# text DIR START LIMIT: GPU 1 writes problems and answers (two processes) until about LIMIT s from now
text() { mkdir -p "$O/$1"; OUT="$O/$1" GEN_DIR="/root/$1" GPUS=1 PAR=2 START="$2" PROB_LIMIT=$(( $3 * 2 / 5 )) \
  ANS_LIMIT=$(( $3 * 3 / 5 )) bash tools/gpu_head.sh selfmath 520 > "$O/$1/selfmath.log" 2>&1; }
T0=$(date +%s); left() { echo $(( ${TRAIN_LIMIT:-530} + 40 - ($(date +%s) - T0) )); }
case "$STEP" in
train1)
  if [ "$NGPU" -ge 2 ]; then
    (mkdir -p "$O/m"; CUDA_VISIBLE_DEVICES=1 OUT="$O/m" SETS="gsm8k math500" KINDS=model BENCH_N=20 BENCH_LIMIT=110 \
       bash tools/gpu_head.sh bench "$G" > "$O/m/bench.log" 2>&1; text text1 "${START:-5116}" "$(left)") &
  fi
  CUDA_VISIBLE_DEVICES=0 TTT=3 TRAIN_LIMIT="${TRAIN_LIMIT:-530}" EVAL_N=0 LIMIT_PROBLEMS="${LIMIT_PROBLEMS:-1500}" \
    bash tools/gpu_head.sh train
  wait; rm -f "$O"/head.safetensors.part*  # the head stays in /root/head for train2
  pack model.tgz m; pack text1.tgz text1; pack train1.tgz head.json report.json loss.png train.log
  ;;
train2)
  rm -rf /root/head_a && mv /root/head /root/head_a
  [ "$NGPU" -ge 2 ] && text text2 "${START2:-$(( ${START:-5116} + 2080 ))}" "$(left)" &
  CUDA_VISIBLE_DEVICES=0 INIT=/root/head_a TTT=3 TRAIN_LIMIT="${TRAIN_LIMIT:-530}" EVAL_N=0 EPOCHS=10 LR=1e-3 \
    LIMIT_PROBLEMS="${LIMIT_PROBLEMS:-1500}" bash tools/gpu_head.sh train
  wait; rm -f "$O"/head.safetensors.part*
  pack text2.tgz text2; pack train2.tgz head.json report.json loss.png train.log
  ;;
bench)
  K=head; [ "$NGPU" -ge 2 ] || K="head model"
  CUDA_VISIBLE_DEVICES=0 SETS="gsm8k math500" KINDS="${KINDS:-$K}" BENCH_N=20 BENCH_LIMIT=110 bash tools/gpu_head.sh bench "$G"
  for r in ${MORE-math500:3 gsm8k:5}; do
    CUDA_VISIBLE_DEVICES=0 SETS="${r%%:*}" KINDS=head BENCH_N=20 BENCH_LIMIT=110 bash tools/gpu_head.sh bench "${r##*:}"
  done
  split -b 15000000 -d -a 1 /root/head/head.safetensors "$O/head.safetensors.part"
  pack logs.tgz "bench_*.log"
  ;;
*) sed -n '2,16p' "$0"; exit 2;;
esac
ls -la "$O"
