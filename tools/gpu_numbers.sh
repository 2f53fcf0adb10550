#!/usr/bin/env bash
# tools/gpu_numbers.sh: on a lent GPU with the target staged (tools/stage_target.sh; carry [".whl", "minitorch/cuda_kernels"]),
# GSM8K and MATH-500 first 20 with the shipped head (the CUDA-graph defaults: cost budget, lookup 2; WHAT="gsm8k head"
# ... picks), then with PER=N Spec-Bench's first N of each category at temperature 0.6 (sampling: lossless, so the texts
# differ from the target alone's). Logs and records come back in numbers.tgz. The 0.5B is not staged: --drafter model
# needs its GGUF too.
set -u
OUT="${OUT:-/tmp/gpu}"; mkdir -p "$OUT"; cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" MINITORCH_SPEC_CACHE=/root/cache PYTHONUNBUFFERED=1
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done; }
export PYTHONPATH="$PWD:/tmp/site"
[ -f minitorch/cuda_kernels/gemv.fatbin ] || ./compile_cuda.sh > "$OUT/build.log" 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
for what in ${WHAT:-"gsm8k head" "math500 head"}; do
  set -- $what
  PROG=(project/benchmark_gsm8k.py); [ "$1" = gsm8k ] || PROG=(project/benchmark_limo.py --dataset "$1")
  echo "=== $(date -u +%H:%M:%S) $1 $2"
  timeout "${EACH:-150}" python3 "${PROG[@]}" --limit 20 --backend cuda --drafter "$2" --no-plots --no-progress \
    -o "$OUT/${1}_$2.jsonl" > "$OUT/${1}_$2.log" 2>&1; echo "rc=$?"
  grep -E "speedup|^spec |^target |identical|tau|Error" "$OUT/${1}_$2.log" | head -6
done
if [ -n "${PER:-}" ]; then
  echo "=== $(date -u +%H:%M:%S) specbench T 0.6 per $PER"
  timeout "${SBT:-200}" python3 project/benchmark_specbench.py --backend cuda --drafter head --per-category "$PER" \
    --temperature 0.6 --no-plots --no-progress -o "$OUT/sb_t06.jsonl" > "$OUT/sb_t06.log" 2>&1; echo "rc=$?"
  tail -22 "$OUT/sb_t06.log"
fi
cd "$OUT" && tar czf numbers.tgz *.log *.jsonl 2>/dev/null && rm -f *.jsonl *.log; ls
