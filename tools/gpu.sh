#!/usr/bin/env bash
# tools/gpu.sh: the maintainer's routines on a lent GPU machine, one mode a device call, run from the repository root
# there: `bash tools/gpu.sh MODE [ARGS]`. Logs and results go to $OUT (default /tmp/gpu); no mode or a wrong one
# prints this header. Modes, named for what they do:
#
# Tests and kernel checks (carry nothing but the tree, unless a line says so)
#   test-gpu [ARGS]      build the kernels, then python -m pytest -m gpu -q -x [ARGS]: the whole GPU suite, or the
#                        files named (e.g. tests/test_cuda_head_drafter.py, the head on the CUDA-graph path);
#                        junit XML and a summary line in $OUT
#   check-bits           digests of tools/check_bits.py with this tree's kernels and with $BASE's (a copy of an older
#                        commit: git archive COMMIT | tar -x -C .snap/base; carry .snap): IDENTICAL or DIFFER
#   step-costs           random-weight step costs and the cost model through project/bench/throughput.py: the coder
#                        pair and the R1 shapes with the CLI's defaults, and --gemv ours
#   ab-steps             tools/ab_steps.py over $BASE and this tree in one call, interleaved twice (step / verify /
#                        engine)
#   tc-tiles [ARGS]      tools/tc_tiles.py --profile 13: the target's steps of 1-16 tokens under several rules of the
#                        tensor-core GEMV's weight tiles (decoder.py tc_tiles), interleaved, bits checked
#
# Benchmarks of the real pair (staged in /root/cache by the workplace staging tool, stage_weights.sh, run on the
# developer machine: its header gives the calls, `join` rebuilds the GGUF files; carry .whl, the gguf and
# math-verify wheels)
#   bench-pair           GSM8K first 20 with the defaults and with --gpu-gemv ours, MATH-500 first 20
#   bench-pair-ab        GSM8K first 20 with the defaults in $BASE and in this tree: tokens/s of both and whether
#                        every text is the same
#   bench-head [G]       the draft head (--drafter head, $HEAD_DIR, else /root/head from an earlier call on this
#                        machine, else one trained here first for TRAIN_LIMIT s, default 200) and the 0.5B draft,
#                        first BENCH_N (20) of each set in SETS (default gsm8k; "gsm8k math500"), gamma G (default 4),
#                        BENCH_LIMIT s (170) a run; KINDS="head" (or "model") benches one drafter; files named by set,
#                        kind and gamma (texts and summaries in one archive, bench_gG.tgz)
#
# Training text and the draft head (the real pair staged; carry .whl and the built minitorch/cuda_kernels)
#   write-gsm8k-answers N  the target's own greedy answers to N GSM8K *train* problems from OFFSET (0), up to 384 new
#                        tokens, GEN_LIMIT s (420); kept in /root/gen for `train-head`, copied to $OUT/train_gen.jsonl
#                        (commit it under data/gsm8k/generated/)
#   write-selfmath N     the target writes N MATH-style problems (project/write_problems.py problems, sampled,
#                        PROB_LIMIT s, default 150) and answers them (answers, greedy, up to 512 new tokens, ANS_LIMIT s,
#                        default 330), in PAR (1) processes at once, shard k on items START + k*N (START default 0);
#                        GPUS="0 1" spreads the shards over those GPUs; ANS_ARGS: more flags for the answers; GEN_DIR
#                        (default /root/gen) keeps a run's files apart; copied to $OUT (commit them under data/selfmath/)
#   train-head           train_draft_head.py --backend cuda on GSM8K train (LIMIT_PROBLEMS, 3000) + every committed
#                        answer file (data/chat's general text too) + /root/gen's and /root/chat*'s, for TRAIN_LIMIT s
#                        (420), sequences cut at MAX_SEQ (2048) tokens, --ttt-steps TTT (3), --epochs EPOCHS (3.5),
#                        --lr LR (2e-3), --tokens-per-step TOKENS (8192; an H100 ran out of memory at ~450 steps of
#                        8192 on 2026-12-06); INIT=DIR starts from that head; the features stay in /root/features for the
#                        next call on the same data (FEATURES_ONLY=1: a call that only fills them, all its time;
#                        RESUME=1: go on with /root/head's checkpoint). The head goes to /root/head and, in 15 MB parts, to $OUT
#                        (`cat head.safetensors.part* > head.safetensors`); then (EVAL_N > 0, default 5) its acceptance
#                        on GSM8K test first EVAL_N and the 0.5B draft's, on the eager engine in float32.
#                        GEN_FILES: the --generated files instead of all of the above; SHIP=1: also compressed by
#                        project/ship_head.py into /root/head_int4 (back as head_int4.safetensors + head_int4.json),
#                        the logs packed in train_logs.tgz; NEED=FILE: stop at once when FILE is missing
#
# Batched decoding and the general text (the real target staged; carry .whl)
#   batch-check          tests/test_cuda_batch.py, then project/bench/batch_throughput.py on the real target (BATCHES,
#                        default "1 8 32 64 128 256"; products tcm and tcb; 512-token answers), then the GPU suite
#                        (-m gpu, ARGS: the files to take first) for the time left
#   write-chat N         project/write_chat.py with --batch BATCH (256): N requests of each of STYLES ("topics magpie";
#                        topics from START, default 0; magpie from START + 500000, texts from START + 1000000, their
#                        ids apart; each style's requests for REQ_LIMIT s, 110, with up to REQ_TOKENS new tokens, 512),
#                        then answers to all of them, --turns TURNS (2), up to 1,024 new tokens a turn, for the time
#                        left; files in GEN_DIR (/root/chat), continued with --resume by a later call on the same
#                        machine; copied gzipped to $OUT (commit under data/chat/; STYLES=texts TURNS=1 under
#                        data/texts/, a folder of its own: train-head holds out and reports each folder apart;
#                        TEXT_KINDS=translation: texts of that task alone, write_chat.py --kinds)
#
#   bench-tree [K,D,N...]  draft trees against the chain (issue 44), the shipped head (HEAD_DIR for another), greedy, one
#                        machine: GSM8K and MATH-500 first BENCH_N (20) with the chain (gamma 4) and each tree (default
#                        "3,4,12 2,4,8"), files named by set and shape, packed in bench_tree.tgz; each summary says
#                        whether every text is the target alone's
#   bench-specbench NAME  Spec-Bench on the CUDA-graph path (all 480 questions, or PER (per category)), spec and target,
#                        --drafter DRAFTER (head), HEAD_DIR (default: the shipped head) for a head, --draft-budget
#                        BUDGET (fixed), EXTRA flags; resumable: /root/sb_NAME.jsonl goes on where the last call on
#                        this machine stopped, for SB_LIMIT s (540) a call; the summary and texts come back each call
#
# A draft-head sitting: three calls on one machine after staging, each carrying [".whl", "minitorch/cuda_kernels"].
# The head lives on the machine between calls (it goes back ~30 s after a call ends: issue the three calls in ONE
# message) and comes back, in 15 MB parts, with the last. On a machine of two GPUs (nvidia-h200-x2) GPU 1 does the
# second half of each line at the same time; on one GPU that half is skipped. G: the gamma (default 4).
#   sitting-train        GPU 0: a head from scratch (or INIT=DIR) for TRAIN_LIMIT s (default 530; the features, at
#                        most half of it, stay in /root/features); GPU 1: the 0.5B's benchmarks (GSM8K and MATH-500
#                        first 20), then new self-written text from START (5116) for the rest of the call
#   sitting-train-more   GPU 0: on from the machine's head for TRAIN_LIMIT s with the same features (LR 1e-3); GPU 1:
#                        more text from START2 (START + 2080). Repeatable
#   sitting-bench        GPU 0: the head's benchmarks (both sets at gamma G, then MORE, default "math500:3 gsm8k:5": a
#                        set at another gamma each) and, on one GPU, the 0.5B's at gamma G (KINDS, default "head
#                        model"); the head comes back
# LIMITS: LIMIT (570 s) bounds the test, check and bench-pair modes' runs; at most 8 files come back a call, so the
# head and sitting modes pack their logs and texts into archives.
set -u
MODE="${1:-}"; [ $# -gt 0 ] && shift
OUT="${OUT:-/tmp/gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the device machine runs the checkout without pip install -e: the programs import the project package from here
cd "$(dirname "$0")/.." && export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
usage() { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 2; }
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
run() {  # run NAME TIMEOUT CMD...: log to $OUT/NAME.log, print the lines matching PAT
  local name=$1 t=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then log "$name skipped (time)"; return; fi
  [ "$t" -gt "$l" ] && t=$l
  log "$name (timeout ${t}s): $*"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?" >> "$OUT/$name.log"
  grep -E "${PAT:-tokens/sec|speedup|passed|failed|error|Error|rc=|cost model|engine|decode step}" "$OUT/$name.log" \
    | cut -c1-260 | tail -"${TAILN:-14}"
}
build() {  # this tree's kernels (compile_cuda.sh), unless already built
  [ -f minitorch/cuda_kernels/gemv.fatbin ] && [ -z "${REBUILD:-}" ] && return
  log build; ./compile_cuda.sh > "$OUT/build.log" 2>&1; echo "build rc=$?"
}
need_base() {
  [ -n "${BASE:-}" ] && [ -d "$BASE/minitorch" ] || { echo "set BASE to a copy of the older tree (see the header)"; exit 2; }
}
wheels() {  # the carried wheels (gguf, math-verify), once a machine: two modes at once share the one install
  [ -d .whl ] || return 0
  [ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } && export PYTHONPATH="/tmp/site:$PYTHONPATH"  # after the checkout (set above), not instead of it
}
real_env() { export MINITORCH_SPEC_CACHE=/root/cache; wheels; build; }  # the real pair staged, wheels, kernels
B="--limit 20 --backend cuda --no-plots --no-progress"
PG='speedup|^spec |^target |time:|identical|rc=|Error|error'

# train_head DIR SECONDS: train_draft_head.py on --backend cuda into DIR for SECONDS, on GSM8K train, the committed
# answers the target wrote and this machine's from a write-* call (a write-selfmath after the committed files needs
# START past their last item, or it writes the same problems again); INIT=DIR starts from that head; the target's
# features stay in /root/features, so a second call on the same data trains for its whole time limit
train_head() {
  local GEN=(--generated data/gsm8k/generated/*.jsonl $(ls data/selfmath/answers*.jsonl data/chat/answers*.jsonl.gz \
    data/texts/answers*.jsonl.gz /root/gen/*gen.jsonl /root/gen/answers*.jsonl /root/chat*/answers.jsonl \
    /root/texts/answers.jsonl 2>/dev/null)) INIT_ARGS=()
  [ -n "${GEN_FILES:-}" ] && GEN=(--generated $GEN_FILES)
  [ -n "${INIT:-}" ] && INIT_ARGS=(--init "$INIT")
  log "train ${GEN[*]} ${INIT_ARGS[*]}"
  python3 project/train_draft_head.py --backend cuda --limit "${LIMIT_PROBLEMS:-3000}" "${GEN[@]}" "${INIT_ARGS[@]}" \
    --epochs "${EPOCHS:-3.5}" --tokens-per-step "${TOKENS:-8192}" --lr "${LR:-2e-3}" --eval-every 100 --save-every 100 \
    --ttt-steps "${TTT:-3}" --max-seq-len "${MAX_SEQ:-2048}" --time-limit "$2" --output "$1" --features /root/features --quiet \
    $( [ -n "${FEATURES_ONLY:-}" ] && echo --features-only ) $( [ -n "${RESUME:-}" ] && echo --resume )
}
# pack NAME PATTERN...: the files of $OUT that match (existing ones only), as one archive
pack() { local name=$1 f; shift; (cd "$OUT" && shopt -s nullglob && set -- $@ && for f; do shift; [ -e "$f" ] && set -- "$@" "$f"; done
  [ $# -gt 0 ] && tar czf "$name" "$@" && rm -rf "$@"); }
# text DIR START LIMIT: GPU 1 writes problems and answers (two processes) until about LIMIT s from now
text() { mkdir -p "$OUT/$1"; OUT="$OUT/$1" GEN_DIR="/root/$1" GPUS=1 PAR=2 START="$2" PROB_LIMIT=$(( $3 * 2 / 5 )) \
  ANS_LIMIT=$(( $3 * 3 / 5 )) bash "$0" write-selfmath 520 > "$OUT/$1/selfmath.log" 2>&1; }
sitting_left() { echo $(( ${TRAIN_LIMIT:-530} + 40 - ($(date +%s) - T0) )); }  # what a sitting call has left
ngpu() { nvidia-smi -L 2>/dev/null | grep -c '^GPU'; }

case "$MODE" in
test-gpu)
  wheels; build
  PAT='passed|failed|error|rc=' TAILN=6 run tests 540 python3 -m pytest -m gpu -q -x -p no:cacheprovider \
      --junitxml="$OUT/gpu_tests.xml" "$@"
  ;;
check-bits)
  need_base; build
  log "base kernels from $BASE/kernels"
  MINITORCH_KERNELS_DIR="$BASE/kernels" MINITORCH_CUDA_BUILD_DIR=/tmp/base_build ./compile_cuda.sh > "$OUT/build_base.log" 2>&1
  echo "base build rc=$?"
  PAT='.' run bits_new 120 python3 tools/check_bits.py
  PAT='.' run bits_base 120 env MINITORCH_CUDA_BUILD_DIR=/tmp/base_build python3 tools/check_bits.py
  grep -v '^rc=' "$OUT/bits_new.log" > /tmp/a; grep -v '^rc=' "$OUT/bits_base.log" > /tmp/b
  diff /tmp/a /tmp/b > /dev/null && echo "bits: IDENTICAL digests" || echo "bits: DIGESTS DIFFER (see the logs)"
  ;;
step-costs)
  build
  S="project/bench/throughput.py --spec --max-len 32768 --gemv tc --draft-gemv ourstc --int8 draft --gammas 3 4 --extend 4"
  PAT='cost model|cost ratio|decode step|verify|rc=|Error' run step_coder 150 python3 $S --spec-pair coder
  PAT='cost model|cost ratio|decode step|verify|rc=|Error' run step_r1 200 python3 $S --spec-pair r1
  PAT='tokens/sec|decode step|rc=|Error' run step_ours 120 python3 project/bench/throughput.py --shape qwen2.5-coder-1.5b \
      --max-len 32768 --gemv ours
  ;;
ab-steps)
  need_base; build
  [ -f "$BASE/minitorch/cuda_kernels/gemv.fatbin" ] || (cd "$BASE" && ./compile_cuda.sh > "$OUT/build_base.log" 2>&1)
  for i in 1 2; do  # interleaved, twice: the two trees see the same machine state
    PAT='"tree"' run ab_base_$i 120 env PYTHONPATH="$BASE" python3 tools/ab_steps.py base  # $BASE's minitorch
    PAT='"tree"' run ab_new_$i 120 env PYTHONPATH=. python3 tools/ab_steps.py new
  done
  ;;
tc-tiles)
  build
  PAT='"rule"|rc=|Error' TAILN=60 run tc_tiles 400 python3 tools/tc_tiles.py --profile 13 "$@"
  ;;
bench-pair)
  real_env
  PAT=$PG TAILN=8 run gsm8k_default 150 python3 project/benchmark_gsm8k.py $B -o "$OUT/gsm8k_default.jsonl"
  PAT=$PG TAILN=8 run gsm8k_ours 150 python3 project/benchmark_gsm8k.py $B --gpu-gemv ours -o "$OUT/gsm8k_ours.jsonl"
  PAT=$PG TAILN=8 run math500_default 170 python3 project/benchmark_limo.py --dataset math500 $B \
      -o "$OUT/math500_default.jsonl"
  ;;
bench-pair-ab)
  need_base; real_env
  [ -f "$BASE/minitorch/cuda_kernels/gemv.fatbin" ] || (cd "$BASE" && ./compile_cuda.sh > "$OUT/build_base.log" 2>&1)
  PAT=$PG TAILN=8 run gsm8k_base 200 env PYTHONPATH="$BASE:${PYTHONPATH:-}" python3 "$BASE/project/benchmark_gsm8k.py" $B \
      -o "$OUT/gsm8k_base.jsonl"
  PAT=$PG TAILN=8 run gsm8k_new 200 python3 project/benchmark_gsm8k.py $B -o "$OUT/gsm8k_new.jsonl"
  python3 - "$OUT/gsm8k_base.jsonl" "$OUT/gsm8k_new.jsonl" <<'PY'
import json, sys
def load(p):
    return {(r["id"], r["mode"]): r for r in map(json.loads, open(p)) if "mode" in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
same = sum(a[k]["text"] == b[k]["text"] for k in a if k in b)
print(f"bench-ab: {same} of {len(a)} texts identical ({len(b)} in the new run)")
PY
  ;;
write-gsm8k-answers)
  real_env
  N="${1:-300}"; mkdir -p /root/gen
  log "gen $N"
  timeout "${GEN_LIMIT:-420}" python3 project/benchmark_gsm8k.py --data-file data/gsm8k/train.jsonl.gz --offset "${OFFSET:-0}" --limit "$N" \
    --modes spec --backend cuda --max-new-tokens 384 --no-plots --no-progress -o /root/gen/train_gen.jsonl \
    > "$OUT/gen.log" 2>&1; echo "gen rc=$?"
  tail -5 "$OUT/gen.log"
  wc -l /root/gen/train_gen.jsonl; cp /root/gen/train_gen.jsonl "$OUT/"
  ;;
write-selfmath)
  # PAR shards run at once on the one GPU (or spread over GPUS), shard k on items START+k*N.. (its own seeds), each
  # writing problems then answers to $G_DIR/{problems,answers}_k.jsonl: batch-1 decoding leaves the GPU idle between
  # launches and each program's GGUF dequantizing (~30 s) runs on its own CPU core
  real_env
  N="${1:-600}"; P="${PAR:-1}"; G_DIR="${GEN_DIR:-/root/gen}"; mkdir -p "$G_DIR"; read -r -a GPU_LIST <<< "${GPUS:-}"
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
batch-check)
  real_env
  PAT='passed|failed|error|rc=' TAILN=8 run batch_tests 150 python3 -m pytest -q -p no:cacheprovider -rf \
      --junitxml="$OUT/batch_tests.xml" tests/test_cuda_batch.py
  PAT='B=|model|memory|GiB|rc=|Error' TAILN=20 run batch_real 170 python3 project/bench/batch_throughput.py \
      --model qwen2.5-coder-1.5b-instruct --batches ${BATCHES:-1 8 32 64 128 256} --products tcm tcb --new 512 \
      --json "$OUT/batch_real.json"
  PAT='FAILED|ERROR|passed|failed|rc=' TAILN=20 run gpu_suite 600 python3 -m pytest -m gpu -v -p no:cacheprovider -rf \
      --junitxml="$OUT/gpu_tests.xml" "$@" tests
  ;;
write-chat)
  real_env
  N="${1:-2000}"; D="${GEN_DIR:-/root/chat}"; mkdir -p "$D"; S="${START:-0}"
  W=(python3 project/write_chat.py); F=(--batch "${BATCH:-256}" --backend cuda --no-progress)
  STYLES="${STYLES:-topics magpie}"
  for style in $STYLES; do
    start=$S; [ $style = magpie ] && start=$(( S + 500000 )); [ $style = texts ] && start=$(( S + 1000000 ))
    f="$D/requests_$style.jsonl"; have=$(cat "$f" 2>/dev/null | wc -l)
    [ "$have" -ge "$N" ] && continue
    PAT='rc=|Error|error|wrote|tokens' run req_$style "${REQ_LIMIT:-110}" "${W[@]}" requests --style $style --n "$N" \
        --start $start --max-new-tokens "${REQ_TOKENS:-512}" "${F[@]}" -o "$f" $( [ -s "$f" ] && echo --resume ) \
        $( [ $style = texts ] && [ -n "${TEXT_KINDS:-}" ] && echo --kinds "$TEXT_KINDS" )
    wc -l "$f"
  done
  (for style in $STYLES; do cat "$D/requests_$style.jsonl"; done) > "$D/requests.jsonl"
  PAT='rc=|Error|error|wrote|tokens' run answers $(( $(left) - 15 )) "${W[@]}" answers "$D/requests.jsonl" --turns "${TURNS:-2}" \
      "${F[@]}" -o "$D/answers.jsonl" $( [ -s "$D/answers.jsonl" ] && echo --resume )
  python3 - "$D/answers.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"answers: {len(rows)} conversations, {sum(r['generated_tokens'] for r in rows)} tokens written, "
      f"{sum(r['turns'] == 2 for r in rows)} of two turns")
PY
  for f in "$D"/requests.jsonl "$D"/answers.jsonl; do gzip -c "$f" > "$OUT/$(basename "$f").gz"; done
  ls -la "$OUT"
  ;;
bench-tree)
  real_env
  H=(); [ -n "${HEAD_DIR:-}" ] && H=(--head "$HEAD_DIR")
  TB="--limit ${BENCH_N:-20} --backend cuda --no-plots --no-progress --drafter head ${H[*]}"
  for set in gsm8k math500; do
    prog=(python3 project/benchmark_gsm8k.py); [ $set = math500 ] && prog=(python3 project/benchmark_limo.py --dataset math500)
    PAT=$PG TAILN=4 run ${set}_chain 150 "${prog[@]}" $TB --gamma 4 -o "$OUT/${set}_chain.jsonl"
    for t in ${@:-3,4,12 2,4,8}; do
      PAT=$PG TAILN=4 run ${set}_tree_${t//,/_} 150 "${prog[@]}" $TB --draft-tree "$t" -o "$OUT/${set}_tree_${t//,/_}.jsonl"
    done
  done
  pack bench_tree.tgz "*.jsonl" "*.log"  # at most 8 files come back
  ;;
bench-specbench)
  real_env
  NAME="${1:-head}"; F="/root/sb_$NAME.jsonl"; H=()
  [ "${DRAFTER:-head}" = head ] && [ -n "${HEAD_DIR:-}" ] && H=(--head "$HEAD_DIR")
  PAT='speedup|^spec |^target |identical|rc=|Error|error|^[a-z_]+ +[0-9]+ ' TAILN=20 run "sb_$NAME" "${SB_LIMIT:-540}" \
      python3 project/benchmark_specbench.py --backend cuda --drafter "${DRAFTER:-head}" "${H[@]}" \
      --draft-budget "${BUDGET:-fixed}" $( [ -n "${PER:-}" ] && echo --per-category "$PER" ) ${EXTRA:-} --no-plots \
      --no-progress -o "$F" $( [ -s "$F" ] && echo --resume )
  python3 project/benchmark_specbench.py summary "$F" > "$OUT/sb_${NAME}_summary.txt" 2>&1; tail -22 "$OUT/sb_${NAME}_summary.txt"
  gzip -c "$F" > "$OUT/sb_$NAME.jsonl.gz"
  ;;
train-head)
  [ -n "${NEED:-}" ] && [ ! -s "$NEED" ] && { echo "NEED: $NEED is missing: not training"; exit 3; }
  real_env
  train_head /root/head "${TRAIN_LIMIT:-420}" 2>&1 | tee "$OUT/train.log" | tail -25
  [ -n "${FEATURES_ONLY:-}" ] && { df -h /root | tail -1; log done; exit 0; }
  split -b 15000000 -d -a 1 /root/head/head.safetensors "$OUT/head.safetensors.part"  # 16 MiB a file comes back
  cp /root/head/head.json /root/head/report.json /root/head/loss.png "$OUT/" 2>/dev/null
  if [ -n "${SHIP:-}" ]; then
    python3 project/ship_head.py /root/head -o /root/head_int4 2>&1 | tail -3
    cp /root/head_int4/head.safetensors "$OUT/head_int4.safetensors"; cp /root/head_int4/head.json "$OUT/head_int4.json"
    pack train_logs.tgz head.json report.json loss.png train.log  # at most 8 files come back
  fi
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
bench-head)
  real_env
  G="${1:-4}"; HEAD="${HEAD_DIR:-/root/head}"
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
sitting-train)
  export MINITORCH_SPEC_CACHE=/root/cache; wheels; G="${G:-4}"; T0=$(date +%s)  # the call's time counts from here
  if [ "$(ngpu)" -ge 2 ]; then
    (mkdir -p "$OUT/m"; CUDA_VISIBLE_DEVICES=1 OUT="$OUT/m" SETS="gsm8k math500" KINDS=model BENCH_N=20 BENCH_LIMIT=110 \
       bash "$0" bench-head "$G" > "$OUT/m/bench.log" 2>&1; text text1 "${START:-5116}" "$(sitting_left)") &
  fi
  CUDA_VISIBLE_DEVICES=0 TTT=3 TRAIN_LIMIT="${TRAIN_LIMIT:-530}" EVAL_N=0 LIMIT_PROBLEMS="${LIMIT_PROBLEMS:-1500}" \
    bash "$0" train-head
  wait; rm -f "$OUT"/head.safetensors.part*  # the head stays in /root/head for sitting-train-more
  pack model.tgz m; pack text1.tgz text1; pack train1.tgz head.json report.json loss.png train.log
  ls -la "$OUT"
  ;;
sitting-train-more)
  export MINITORCH_SPEC_CACHE=/root/cache; wheels; T0=$(date +%s)  # the call's time counts from here
  rm -rf /root/head_a && mv /root/head /root/head_a
  [ "$(ngpu)" -ge 2 ] && text text2 "${START2:-$(( ${START:-5116} + 2080 ))}" "$(sitting_left)" &
  CUDA_VISIBLE_DEVICES=0 INIT=/root/head_a TTT=3 TRAIN_LIMIT="${TRAIN_LIMIT:-530}" EVAL_N=0 EPOCHS=10 LR=1e-3 \
    LIMIT_PROBLEMS="${LIMIT_PROBLEMS:-1500}" bash "$0" train-head
  wait; rm -f "$OUT"/head.safetensors.part*
  pack text2.tgz text2; pack train2.tgz head.json report.json loss.png train.log
  ls -la "$OUT"
  ;;
sitting-bench)
  export MINITORCH_SPEC_CACHE=/root/cache; wheels; G="${G:-4}"; T0=$(date +%s)  # the call's time counts from here
  K=head; [ "$(ngpu)" -ge 2 ] || K="head model"
  CUDA_VISIBLE_DEVICES=0 SETS="gsm8k math500" KINDS="${KINDS:-$K}" BENCH_N=20 BENCH_LIMIT=110 bash "$0" bench-head "$G"
  for r in ${MORE-math500:3 gsm8k:5}; do
    CUDA_VISIBLE_DEVICES=0 SETS="${r%%:*}" KINDS=head BENCH_N=20 BENCH_LIMIT=110 bash "$0" bench-head "${r##*:}"
  done
  split -b 15000000 -d -a 1 /root/head/head.safetensors "$OUT/head.safetensors.part"
  pack logs.tgz "bench_*.log"
  ls -la "$OUT"
  ;;
*)
  usage
  ;;
esac
log done
