#!/usr/bin/env bash
# One device-machine session: build, GPU tests and A/B timings in one call (kernels/NOTES.md method).
# Run from the repository root on the GPU machine:  bash kernels/gpu_session.sh [stage ...]
# Trees: $SNAP/new (the code under test) and optionally $SNAP/base (the code before, for before/after
# ratios in the same run); default SNAP=. with no base. Logs go to $OUT (default /tmp/gpu_session).
# Stages: env build tests bench final spec (default: env build tests bench).
set -u
OUT="${OUT:-/tmp/gpu_session}"; mkdir -p "$OUT"
SNAP="${SNAP:-}"
NEW="${SNAP:+$SNAP/new}"; NEW="${NEW:-.}"
BASE="${SNAP:+$SNAP/base}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s)
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
stages="${*:-env build tests bench}"
has() { case " $stages " in *" $1 "*) return 0;; esac; return 1; }
bench() {  # bench LABEL TREE [extra env] -- args
  local label=$1 tree=$2; shift 2
  log "bench $label: $*"
  (cd "$tree" && MINITORCH_CUDA_BUILD_DIR="${BDIR:-}" timeout 240 python3 project/bench_throughput.py --json "$OUT/$label.json" "$@") > "$OUT/bench_$label.log" 2>&1
  echo "rc=$?" >> "$OUT/bench_$label.log"
  grep -E "ours:|decode step|Bandwidth|rc=|spec|Error|error" "$OUT/bench_$label.log" | sed "s/^/[$label] /" | cut -c1-230
}
if has env; then
  log env
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'transformers', transformers.__version__)"
  nvcc --version | tail -2
fi 2>&1 | tee "$OUT/env.log"
if has build; then
  log build
  (cd "$NEW" && ./compile_cuda.sh > "$OUT/build_new.log" 2>&1; echo "new rc=$?") &
  has bench && (cd "$NEW" && MINITORCH_CUDA_BUILD_DIR=/tmp/pf_all NVCC_FLAGS=-DGEMV_PREFETCH_BLOCKS=2147483647 ./compile_cuda.sh > "$OUT/build_pf_all.log" 2>&1; echo "pf_all rc=$?") &
  has bench && (cd "$NEW" && MINITORCH_CUDA_BUILD_DIR=/tmp/pf_wave NVCC_FLAGS=-DGEMV_PREFETCH_BLOCKS=1056 ./compile_cuda.sh > "$OUT/build_pf_wave.log" 2>&1; echo "pf_wave rc=$?") &
  [ -n "$BASE" ] && (cd "$BASE" && ./compile_cuda.sh > "$OUT/build_base.log" 2>&1; echo "base rc=$?") &
  wait
  log build done
fi 2>&1 | tee -a "$OUT/env.log"
if has tests; then
  (
    cd "$NEW"
    log "pytest GPU tests"
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_attention.py tests/test_cuda_compile.py \
      tests/test_cuda_import.py tests/test_cuda_kernels.py tests/test_cuda_model.py tests/test_cuda_ops.py -rfs 2>&1 | tail -60
    log "pytest core ops on CUDA"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_core_ops.py -k 'cuda or gpu or Cuda' 2>&1 | tail -15
    log "pytest PDL"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_pdl.py 2>&1 | tail -15
    log tests done
  ) > "$OUT/tests.log" 2>&1
  grep -E "passed|failed|error|FAILED|ERROR" "$OUT/tests.log" | tail -20
fi
if has bench; then
  [ -n "$BASE" ] && bench base "$BASE"
  bench new "$NEW" --profile
  bench new_noepi "$NEW" --norm-epilogue off
  bench new_norope "$NEW" --qkv-rope off
  BDIR=/tmp/pf_all bench new_pf_all "$NEW"
  BDIR=/tmp/pf_wave bench new_pf_wave "$NEW"
  bench new_exact "$NEW" --gemv ours
  bench new_again "$NEW"
fi
if has final; then
  [ -n "$BASE" ] && bench base "$BASE"
  bench spec "$NEW" --spec --gammas 1 2 3 4 5 6 7 8 --profile
  bench new_noepi "$NEW" --norm-epilogue off
  bench spec_exact "$NEW" --gemv ours --spec --gammas 1 2 3 4
  bench new_again "$NEW"
fi
if has spec; then
  bench spec "$NEW" --spec --gammas 1 2 3 4 5 6 7 8
  bench spec_exact "$NEW" --spec --gammas 2 3 4 5 --gemv ours
fi
log all done
