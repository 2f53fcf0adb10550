#!/usr/bin/env bash
# The draft head on the GPU machine (real pair staged in /root/cache by the workplace staging tool (stage_weights.sh, run on the developer machine); carry .whl
# and the built minitorch/cuda_kernels). Modes, one device call each:
#   bash tools/gpu_head.sh gen N     the target's own greedy answers to N GSM8K *train* problems from ${OFFSET:-0} (the
#                                    CUDA-graph path, speculative mode = the target's text), kept in /root/gen for
#                                    the next call and copied to $OUT/train_gen.jsonl (commit it under data/)
#   bash tools/gpu_head.sh selfmath N  the target writes N MATH-style problems (project/write_problems.py problems,
#                                    sampled, ${PROB_LIMIT:-150} s at most) and answers them (answers, greedy, up to 512
#                                    new tokens, ${ANS_LIMIT:-330} s at most), in PAR processes at once (N each), kept
#                                    in /root/gen for the next call and copied to $OUT (commit them under data/selfmath/);
#                                    ANS_ARGS: more flags for the answers (e.g. "--drafter head --head /root/head0 --gamma 4":
#                                    the same greedy text, drafted by an earlier head); GPUS="0 1" spreads the shards
#                                    over those GPUs (shard k on GPU k mod their number); GEN_DIR (default /root/gen)
#                                    keeps a run's files apart, e.g. one writing the next round's text beside `train`
#   bash tools/gpu_head.sh train     train a head with --backend cuda on GSM8K train (+ /root/gen's answers) for
#                                    TRAIN_LIMIT s (default 420; --ttt-steps ${TTT:-3}), then (EVAL_N > 0, default 5)
#                                    its acceptance on GSM8K test first EVAL_N (CPU engine on the CUDA backend, float32)
#                                    and the 0.5B draft's on the same engine; INIT=DIR starts from that head (--init); the head (float16, in 15 MB parts:
#                                    `cat head.safetensors.part* > head.safetensors`) and its report to $OUT
#   bash tools/gpu_head.sh tests     the head on the CUDA-graph path against the CPU HeadDrafter:
#                                    pytest -m gpu tests/test_cuda_head_drafter.py (junit XML in $OUT; carry nothing)
#   bash tools/gpu_head.sh bench [G] the head on the CUDA-graph path (bf16, --drafter head) and the default 0.5B draft,
#                                    GSM8K first ${BENCH_N:-20}, gamma G (default 4), one call: tokens/s, acceptance,
#                                    identical texts. The head: $HEAD_DIR, else /root/head from an earlier `train` call
#                                    on this machine, else one trained here first (TRAIN_LIMIT, default 200 s);
#                                    KINDS="head" benches the head alone; SETS="gsm8k math500" (default gsm8k)
#                                    names the sets (MATH-500 through benchmark_limo.py, first BENCH_N too); files are
#                                    named by set, kind and gamma, so one call can bench several gammas
set -u  # (the help above: lines 2-28)
OUT="${OUT:-/tmp/gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 MINITORCH_SPEC_CACHE=/root/cache
T0=$(date +%s)
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
# the carried wheels, once a machine (two of these scripts at once share the one install)
[ -d .whl ] && { [ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.done; }; } && export PYTHONPATH=/tmp/site
[ -f minitorch/cuda_kernels/gemv.fatbin ] || { log build; ./compile_cuda.sh > "$OUT/build.log" 2>&1; echo "build rc=$?"; }
# train_head DIR SECONDS: train_draft_head.py on --backend cuda into DIR for SECONDS, on GSM8K train, the committed
# answers the target wrote and this machine's from a `gen`/`selfmath` call (a `selfmath` after the committed ones
# needs START past their last item, or it writes the same problems again); INIT=DIR starts from that head; the
# target's features stay in /root/features, so a second call on the same data (INIT=/root/head_a after
# `mv /root/head /root/head_a`) trains for its whole TRAIN_LIMIT instead of extracting them again
train_head() {
  local GEN=(--generated data/gsm8k/generated/*.jsonl $(ls data/selfmath/answers*.jsonl /root/gen/*gen.jsonl \
    /root/gen/answers*.jsonl 2>/dev/null)) INIT_ARGS=()
  [ -n "${INIT:-}" ] && INIT_ARGS=(--init "$INIT")
  log "train ${GEN[*]} ${INIT_ARGS[*]}"
  python3 project/train_draft_head.py --backend cuda --limit "${LIMIT_PROBLEMS:-3000}" "${GEN[@]}" "${INIT_ARGS[@]}" \
    --epochs "${EPOCHS:-3.5}" --tokens-per-step 8192 --lr "${LR:-2e-3}" --eval-every 100 --save-every 100 \
    --ttt-steps "${TTT:-3}" --time-limit "$2" --output "$1" --features /root/features --quiet
}
case "${1:-}" in
gen)
  N="${2:-300}"; mkdir -p /root/gen
  log "gen $N"
  timeout "${GEN_LIMIT:-420}" python3 project/benchmark_gsm8k.py --data-file data/gsm8k/train.jsonl.gz --offset "${OFFSET:-0}" --limit "$N" \
    --modes spec --backend cuda --max-new-tokens 384 --no-plots --no-progress -o /root/gen/train_gen.jsonl \
    > "$OUT/gen.log" 2>&1; echo "gen rc=$?"
  tail -5 "$OUT/gen.log"
  wc -l /root/gen/train_gen.jsonl; cp /root/gen/train_gen.jsonl "$OUT/"
  ;;
selfmath)
  # PAR shards (default 1) run at once on the one GPU, shard k on items START+k*N.. (its own seeds), each writing
  # problems then answers to $G_DIR/{problems,answers}_k.jsonl: batch-1 decoding leaves the GPU idle between
  # launches and each program's GGUF dequantizing (~30 s) runs on its own CPU core
  N="${2:-600}"; P="${PAR:-1}"; G_DIR="${GEN_DIR:-/root/gen}"; mkdir -p "$G_DIR"; read -r -a GPU_LIST <<< "${GPUS:-}"
  log "selfmath: $P shard(s) of $N problems from ${START:-0}"
  for k in $(seq 0 $((P - 1))); do
    (
      [ ${#GPU_LIST[@]} -gt 0 ] && export CUDA_VISIBLE_DEVICES=${GPU_LIST[$((k % ${#GPU_LIST[@]}))]}
      timeout "${PROB_LIMIT:-150}" python3 project/write_problems.py problems --n "$N" --start $(( ${START:-0} + k * N )) \
        --backend cuda --no-progress -o $G_DIR/problems_$k.jsonl \
        $( [ -f $G_DIR/problems_$k.jsonl ] && echo --resume ) > "$OUT/shard_$k.log" 2>&1
      echo "shard $k problems rc=$?"
      timeout "${ANS_LIMIT:-330}" python3 project/write_problems.py answers $G_DIR/problems_$k.jsonl --backend cuda \
        --no-progress -o $G_DIR/answers_$k.jsonl ${ANS_ARGS:-} \
        $( [ -f $G_DIR/answers_$k.jsonl ] && echo --resume ) >> "$OUT/shard_$k.log" 2>&1
      echo "shard $k answers rc=$?"
    ) &
  done
  wait
  for k in $(seq 0 $((P - 1))); do tail -n 4 "$OUT/shard_$k.log"; done
  wc -l $G_DIR/problems_*.jsonl $G_DIR/answers_*.jsonl
  cat $G_DIR/problems_*.jsonl > "$OUT/problems.jsonl"; cat $G_DIR/answers_*.jsonl > "$OUT/answers.jsonl"
  ;;
train)
  train_head /root/head "${TRAIN_LIMIT:-420}" 2>&1 | tee "$OUT/train.log" | tail -25
  split -b 15000000 -d -a 1 /root/head/head.safetensors "$OUT/head.safetensors.part"  # 16 MiB a file comes back
  cp /root/head/head.json /root/head/report.json /root/head/loss.png "$OUT/" 2>/dev/null
  [ "${EVAL_N:-5}" -gt 0 ] || { log done; exit 0; }
  log "acceptance"
  timeout "${EVAL_LIMIT:-200}" python3 project/benchmark_gsm8k.py --backend cuda --dtype float32 --drafter head \
    --head /root/head --gamma 4 --limit "${EVAL_N:-5}" --max-new-tokens 256 --modes spec --no-plots --no-progress \
    -o /tmp/gsm8k_head_eager.jsonl > "$OUT/eval.log" 2>&1; echo "eval rc=$?"
  tail -14 "$OUT/eval.log"
  log "the 0.5B draft model, same engine"
  timeout 100 python3 project/benchmark_gsm8k.py --backend cuda --dtype float32 --drafter model --gamma 4 --draft-extend 0 \
    --limit "${EVAL_N:-5}" --max-new-tokens 256 --modes spec --no-plots --no-progress -o /tmp/gsm8k_draft_eager.jsonl \
    > /tmp/eval_draft.log 2>&1; echo "rc=$?"; tail -8 /tmp/eval_draft.log
  ;;
tests)
  log "tests"
  timeout "${TEST_LIMIT:-560}" python3 -m pytest -m gpu -q -x tests/test_cuda_head_drafter.py \
    --junitxml="$OUT/junit_head.xml" > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
  tail -25 "$OUT/tests.log"
  ;;
bench)
  G="${2:-4}"; HEAD="${HEAD_DIR:-/root/head}"
  if [[ " ${KINDS:-head model} " == *" head "* ]] && [ ! -f "$HEAD/head.safetensors" ]; then  # KINDS=model needs none
    log "no head in $HEAD: training one (${TRAIN_LIMIT:-200} s)"
    train_head "$HEAD" "${TRAIN_LIMIT:-200}" > "$OUT/train.log" 2>&1
    echo "train rc=$?"
    tail -6 "$OUT/train.log"
    cp "$HEAD/head.json" "$HEAD/report.json" "$HEAD/loss.png" "$OUT/" 2>/dev/null
  fi
  for set in ${SETS:-gsm8k}; do
    for kind in ${KINDS:-head model}; do
      log "$set first ${BENCH_N:-20}, --backend cuda --drafter $kind --gamma $G"
      EXTRA=(); [ "$kind" = head ] && EXTRA=(--head "$HEAD")
      PROG=(project/benchmark_gsm8k.py); [ "$set" = gsm8k ] || PROG=(project/benchmark_limo.py --dataset "$set")
      timeout "${BENCH_LIMIT:-170}" python3 "${PROG[@]}" --limit "${BENCH_N:-20}" --backend cuda \
        --drafter "$kind" "${EXTRA[@]}" --gamma "$G" --no-plots --no-progress -o "$OUT/${set}_${kind}_g$G.jsonl" \
        > "$OUT/bench_${set}_${kind}_g$G.log" 2>&1; echo "bench $set $kind rc=$?"
      tail -16 "$OUT/bench_${set}_${kind}_g$G.log"
    done
  done
  for set in ${SETS:-gsm8k}; do
    python3 - "$OUT/${set}_head_g$G.jsonl" "$OUT/${set}_model_g$G.jsonl" <<'PY' || true
import json, sys
def texts(p):
    try:
        rows = [json.loads(l) for l in open(p)]
    except OSError:
        return {}
    return {(r.get("id"), r.get("mode")): r.get("text", r.get("output")) for r in rows}
a, b = texts(sys.argv[1]), texts(sys.argv[2])
same = [k for k in a if k in b and a[k] == b[k]]
print(f"{sys.argv[1]}: texts identical between the head and the 0.5B runs: {len(same)} of {len(set(a) & set(b))} (greedy: all expected)")
PY
  done
  # at most 8 files come back from the GPU machine: the texts and summaries travel as one archive
  (cd "$OUT" && shopt -s nullglob && f=(*.jsonl *.summary.json) && [ ${#f[@]} -gt 0 ] && tar czf bench_g$G.tgz "${f[@]}" && rm -f "${f[@]}")
  ;;
*) sed -n '2,28p' "$0"; exit 2;;
esac
log done
