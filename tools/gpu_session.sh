#!/usr/bin/env bash
# One device-machine session: build, bit-for-bit check, GPU tests and A/B timings in one call
# (kernels/NOTES.md method). Run from the repository root on the GPU machine:
#   [BASE=.snap/base] bash tools/gpu_session.sh [stage ...]
# The code under test is the current tree; BASE (optional) is a copy of the code before (e.g.
# `git archive <commit> | tar -x -C .snap/base`), built and timed in the same run for before/after
# ratios. Variant builds of the current tree with other -D flags go to /tmp/v_<name> (see VARIANTS).
# Logs go to $OUT (default /tmp/gpu_session); $OUT/logs.tgz holds them all (a call returns few files).
# Stages: env build bits tests bench final exact spec (default: env build bits tests bench).
set -u
OUT="${OUT:-/tmp/gpu_session}"; mkdir -p "$OUT"
BASE="${BASE:-}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s)
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
stages="${*:-env build bits tests bench}"
has() { case " $stages " in *" $1 "*) return 0;; esac; return 1; }
# name:flags (comma-separated) of the variant builds timed in the bench stage (round 3, call 2: the
# attention's early K/V loads and early trigger, each alone; call 1 timed each GEMV early-load change)
VARIANTS="${VARIANTS:-atkv:-DATT_EARLY_KV=1 attrig:-DATT_TRIGGER_EARLY=1}"
TLIMIT="${TLIMIT:-540}"  # seconds: benches that would start later are skipped (the call's limit is 600)
NB="$PWD/minitorch/cuda_kernels"
BB="$PWD/${BASE:-none}/minitorch/cuda_kernels"
bench() {  # bench LABEL TREE BUILD_DIR -- args
  local label=$1 tree=$2 bdir=$3; shift 3
  if [ $(( $(date +%s) - T0 )) -gt "$TLIMIT" ]; then log "bench $label skipped (time)"; return; fi
  log "bench $label: $*"
  local prog=project/bench/throughput.py  # a BASE tree from before the #13 move has it at project/
  [ -f "$tree/$prog" ] || prog=project/bench_throughput.py
  (cd "$tree" && MINITORCH_CUDA_BUILD_DIR="$bdir" timeout 240 python3 "$prog" --json "$OUT/$label.json" "$@") > "$OUT/bench_$label.log" 2>&1
  echo "rc=$?" >> "$OUT/bench_$label.log"
  grep -E "ours:|decode step|rc=|spec|Error|error" "$OUT/bench_$label.log" | sed "s/^/[$label] /" | cut -c1-200
}

if has env; then
  log env
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'transformers', transformers.__version__)"
  nvcc --version | tail -2
fi 2>&1 | tee "$OUT/env.log"

if has build; then
  log build
  (./compile_cuda.sh > "$OUT/build_new.log" 2>&1; echo "new rc=$?") &
  if has bench; then
    for v in $VARIANTS; do
      name=${v%%:*}; flags=${v#*:}
      (MINITORCH_CUDA_BUILD_DIR=/tmp/v_$name NVCC_FLAGS="${flags//,/ }" ./compile_cuda.sh > "$OUT/build_$name.log" 2>&1; echo "$name rc=$?") &
    done
  fi
  [ -n "$BASE" ] && (cd "$BASE" && ./compile_cuda.sh > "$OUT/build_base.log" 2>&1; echo "base rc=$?") &
  wait
  log build done
fi 2>&1 | tee -a "$OUT/env.log"

if has bits; then
  # every kernel that exists in both builds computes the same bits (the new tree's decoder on each build)
  log "bits: base vs new kernels (NVRTC compile of every source in the background)"
  (timeout 200 python3 -c "
from minitorch.cuda.runtime import KernelLibrary, KERNEL_FILES
k = KernelLibrary(force_nvrtc=True)
for f in sorted(set(KERNEL_FILES.values())): k.module(f)
print('nvrtc ok:', sorted(k.sources))" > "$OUT/nvrtc.log" 2>&1; echo "nvrtc rc=$?" >> "$OUT/nvrtc.log") &
  timeout 150 python3 tools/check_bits.py > "$OUT/bits_new.txt" 2> "$OUT/bits_new.err"; echo "new rc=$?"
  if [ -n "$BASE" ]; then
    MINITORCH_CUDA_BUILD_DIR="$BB" timeout 150 python3 tools/check_bits.py > "$OUT/bits_base.txt" 2> "$OUT/bits_base.err"; echo "base rc=$?"
    if diff "$OUT/bits_base.txt" "$OUT/bits_new.txt" > /dev/null; then echo "bits: IDENTICAL"; else echo "bits: DIFFER"; diff "$OUT/bits_base.txt" "$OUT/bits_new.txt" | head; fi
  fi
  cat "$OUT/bits_new.txt"; tail -2 "$OUT/bits_new.err"
fi 2>&1 | tee "$OUT/bits.log"

if has tests; then
  (
    log "pytest GPU tests"
    timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_attention.py tests/test_cuda_compile.py \
      tests/test_cuda_import.py tests/test_cuda_kernels.py tests/test_cuda_model.py tests/test_cuda_ops.py \
      tests/test_cuda_sampling.py -rfs 2>&1 | tail -40
    log "pytest core ops on CUDA"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_core_ops.py -k 'cuda or gpu or Cuda' 2>&1 | tail -8
    log "pytest PDL"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_pdl.py 2>&1 | tail -8
    log tests done
  ) > "$OUT/tests.log" 2>&1
  grep -E "passed|failed|error|FAILED|ERROR" "$OUT/tests.log" | tail -20
  wait  # the NVRTC check
  tail -2 "$OUT/nvrtc.log" 2>/dev/null
fi

if has bench; then
  [ -n "$BASE" ] && bench base "$BASE" "$BB"
  bench new . "$NB" --profile
  bench qkvnorm . "$NB" --qkv-norm consumer
  bench fused . "$NB" --fuse-norm
  for v in $VARIANTS; do name=${v%%:*}; bench "$name" . "/tmp/v_$name"; done
  bench r4 . "$NB" --rows-big 4
  bench cl . "$NB" --attn cluster
  bench new_again . "$NB"
fi
if has final; then
  [ -n "$BASE" ] && bench base "$BASE" "$BB"
  bench spec . "$NB" --spec --gammas 1 2 3 4 5 6 7 8 --profile
  bench qkvepi . "$NB" --qkv-norm epilogue
  bench spec_exact . "$NB" --gemv ours --spec --gammas 1 2 3 4
  bench new_again . "$NB"
  [ -n "$BASE" ] && bench base_again "$BASE" "$BB"
  bench new_again2 . "$NB"
fi
if has exact; then  # exact mode (our GEMV for verify steps too) before / after, and the default once more
  [ -n "$BASE" ] && bench base_exact "$BASE" "$BB" --gemv ours
  bench spec_exact . "$NB" --gemv ours --spec --gammas 1 2 3 4
  bench new_again . "$NB"
fi
if has spec; then
  bench spec . "$NB" --spec --gammas 1 2 3 4 5 6 7 8
  bench spec_exact . "$NB" --spec --gammas 2 3 4 5 --gemv ours
fi
log all done
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz *.log *.txt *.err *.json 2>/dev/null)
