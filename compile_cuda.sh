#!/usr/bin/env bash
# Build every kernels/*.cu into minitorch/cuda_kernels/<name>.fatbin with nvcc:
# machine code for sm_80 (A100) and sm_90 (H100/H200) plus compute_90 PTX for newer GPUs.
# Fails loudly (non-zero exit, the compiler's message) on the first compile error.
# Usage: ./compile_cuda.sh   (env overrides: NVCC, NVCC_FLAGS, MINITORCH_CUDA_BUILD_DIR, MINITORCH_KERNELS_DIR)
# At run time a missing build falls back to NVRTC over the same sources (minitorch/cuda/runtime.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NVCC="${NVCC:-nvcc}"
OUT="${MINITORCH_CUDA_BUILD_DIR:-$ROOT/minitorch/cuda_kernels}"
SRC="${MINITORCH_KERNELS_DIR:-$ROOT/kernels}"
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "compile_cuda.sh: nvcc not found (set NVCC=/path/to/nvcc or add the CUDA toolkit to PATH)" >&2
  exit 1
fi
mkdir -p "$OUT"
GENCODE="-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90"
status=0
pids=()
names=()
for src in "$SRC"/*.cu; do
  name="$(basename "$src" .cu)"
  # shellcheck disable=SC2086
  "$NVCC" -fatbin -O3 -std=c++17 $GENCODE -I"$ROOT/kernels/includes" -I"$SRC/includes" ${NVCC_FLAGS:-} \
    -o "$OUT/$name.fatbin.tmp" "$src" &
  pids+=("$!")
  names+=("$name")
done
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    mv "$OUT/${names[$i]}.fatbin.tmp" "$OUT/${names[$i]}.fatbin"
    echo "built $OUT/${names[$i]}.fatbin"
  else
    echo "compile_cuda.sh: FAILED to compile $SRC/${names[$i]}.cu" >&2
    rm -f "$OUT/${names[$i]}.fatbin.tmp"
    status=1
  fi
done
exit $status
