#!/bin/bash
# ours: the CLI's CPU settings (int8 activations), a prefill of N random tokens, LM head on the last row; llama.cpp:
# llama-bench pp N, 2 threads; alternating, 3 rounds each. Run from the repository root with its venv active:
#   bash docs/results/cpu_zen4_specbench_10_prefill_kernel/prefill_vs_llama.sh <llama.cpp build>/bin/llama-bench 512
# (stop 69 ran it from /work/main with /work/venv)
set -e
LB=$1; N=${2:-512}
G=${GGUF:-$HOME/.cache/minitorch-spec/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
for r in 1 2 3; do
  $LB -m $G -p $N -n 0 -t 2 -r 2 -o md 2>/dev/null | grep -E "pp$N|model"
  python - <<PY
import time, numpy as np, argparse, minitorch
from project.cli_common import load_models
from project.settings import add_engine_args, resolve_settings
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args(["--drafter", "model"])), need_draft=False, progress=False).target
ids = [int(i) for i in np.random.default_rng(0).integers(100, 20000, $N)]
best = []
with minitorch.no_grad():
    for k in range(3):
        c = m.new_cache($N + 8); t = time.perf_counter(); m(ids, c, last_n=1); best.append(time.perf_counter() - t)
print(f"ours pp$N: {$N / min(best[1:]):.1f} tok/s (runs {[round(x, 2) for x in best]})")
PY
done
