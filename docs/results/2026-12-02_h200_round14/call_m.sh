#!/usr/bin/env bash
# Round 14, after `gpu_head.sh bench`: the head from /root/head on MATH-500 first 20 and GSM8K at temperature 0.6,
# the 0.5B draft on MATH-500, the fastest target alone (--gpu-gemv ours); the head back in parts.
set -u
OUT="${OUT:-/tmp/gpu}"; mkdir -p "$OUT/r"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 MINITORCH_SPEC_CACHE=/root/cache
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
G="${G:-4}"; H=/root/head
run() { name=$1; shift; echo "=== $(date -u +%H:%M:%S) $name: $*"; timeout "${LIM:-150}" python3 "$@" --no-plots --no-progress -o "$OUT/r/$name.jsonl" > "$OUT/r/$name.log" 2>&1; echo "rc=$?"; tail -14 "$OUT/r/$name.log"; }
[ -f $H/head.safetensors ] || { echo "no head in $H"; exit 3; }
run gsm8k_model project/benchmark_gsm8k.py --limit 20 --backend cuda
run math_head project/benchmark_limo.py --dataset math500 --limit 20 --backend cuda --drafter head --head $H --gamma $G
run math_model project/benchmark_limo.py --dataset math500 --limit 20 --backend cuda
run gsm8k_head_t06 project/benchmark_gsm8k.py --limit 20 --backend cuda --drafter head --head $H --gamma $G --temperature 0.6 --top-p 0.95
run gsm8k_target_ours project/benchmark_gsm8k.py --limit 20 --backend cuda --gpu-gemv ours --modes target
split -b 15000000 -d -a 1 $H/head.safetensors "$OUT/head.safetensors.part"
cp $H/head.json "$OUT/" 2>/dev/null
tar czf "$OUT/results_m.tgz" -C "$OUT" r && rm -rf "$OUT/r"
ls -la "$OUT"
