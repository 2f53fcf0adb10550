#!/usr/bin/env bash
# Issue 14 device calls, one mode a call (run from the repository root on the GPU machine; logs under $OUT,
# LIMIT = the call's seconds). Each mode's comment says what to carry.
# Round 11: realx (the host lookup, gamma / --draft-extend pairs), then realy (the device lookup and the new
# defaults, gamma 3 + --draft-extend 4) with the real pair: docs/GPU_RESULTS.md round 11.
# Random weights: bash tools/gpu_issue14.sh i8t2   the draft's 8-bit rows and gemv "ourstc": tests, broken build, steps
# Real weights: after `.stage/assemble.sh join` (the staging tool beside the repository writes .stage/; with the
# tracked tree now over 4 MB its 60 MiB pieces no longer fit a call's 64 MiB: round 10 split the GGUFs into
# 56 MiB pieces, 29 calls, with the same manifest and assemble.sh):
#   bash tools/gpu_issue14.sh realq    round 10: the defaults (graph prefill, ourstc, 8-bit draft) against round 9's
#                                      settings, MATH-500, t=0.6, gamma 5 / 6, --gpu-gemv ours, the demo
#   bash tools/gpu_issue14.sh realtc   the benchmarks with the defaults against --gpu-gemv ours, the demo
# Earlier rounds' modes (rs, tc, pt, probe, fast, i8, i8v, real, realpf) are kept to re-run their measurements.
set -u
OUT="${OUT:-/tmp/gpu14}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s)
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
run() {  # run NAME TIMEOUT CMD...: log to $OUT/NAME.log, print its tail
  local name=$1 t=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then log "$name skipped (time)"; return; fi
  [ "$t" -gt "$l" ] && t=$l
  log "$name (timeout ${t}s): $*"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?" >> "$OUT/$name.log"
  grep -E "${PAT:-tokens/sec|speedup|passed|failed|error|Error|rc=|tree|cost model|engine|decode step}" "$OUT/$name.log" | cut -c1-260 | tail -${TAILN:-14}
}
real_env() {  # the real pair staged in /root/cache, the carried wheels (gguf, math-verify), the kernels built
  export MINITORCH_SPEC_CACHE=/root/cache
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
  [ -f minitorch/cuda_kernels/gemv.fatbin ] || ./compile_cuda.sh > /dev/null 2>&1
}
case "${1:-}" in
rs)  # the verify GEMVs' reduce-scatter: bits, a deliberately broken order, A/B against -DGEMV_RS=0
  G="-gencode=arch=compute_90,code=sm_90"
  mkdir -p /tmp/v_rs0 /tmp/v_broken
  log build
  (./compile_cuda.sh > "$OUT/build_new.log" 2>&1; echo "new rc=$?") &
  (nvcc -fatbin -O3 -std=c++17 $G -Ikernels/includes -DGEMV_RS=0 -o /tmp/v_rs0/gemv.fatbin kernels/gemv.cu; echo "rs0 rc=$?") &
  (nvcc -fatbin -O3 -std=c++17 $G -Ikernels/includes -DGEMV_RS_BROKEN=1 -o /tmp/v_broken/gemv.fatbin kernels/gemv.cu; echo "broken rc=$?") &
  wait
  for d in /tmp/v_rs0 /tmp/v_broken; do for f in minitorch/cuda_kernels/*.fatbin; do [ "$(basename $f)" = gemv.fatbin ] || cp $f $d/; done; done
  PAT='passed|failed|rc=' run tests 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_gemv_tokens.py \
      tests/test_cuda_long_cache.py tests/test_cuda_pdl.py tests/test_cuda_model.py tests/test_cuda_attention.py \
      -k "gemv or long_cache or pdl or exact or variants or greedy_speculative"
  PAT='shape' run ab_new1 40 env PYTHONPATH=. python3 tools/ab_variants.py short
  PAT='shape' run ab_rs0 40 env PYTHONPATH=. MINITORCH_CUDA_BUILD_DIR=/tmp/v_rs0 python3 tools/ab_variants.py short
  PAT='shape' run ab_new2 40 env PYTHONPATH=. python3 tools/ab_variants.py short
  PAT='passed|failed|rc=' run broken 60 env MINITORCH_CUDA_BUILD_DIR=/tmp/v_broken python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_cuda_gemv_tokens.py tests/test_cuda_model.py -k "gemv or exact_mode"
  PAT='cost model|verify step|rc=' run spec_r1_exact 60 python3 project/bench/throughput.py --spec --gemv ours --gammas 2 3 4 5
  ;;
tc)  # the tensor-core GEMV (gemv="tc"): build, bits, a deliberately broken build, A/B against gemv="ours"
  G="-gencode=arch=compute_90,code=sm_90"
  V=${V:-"broken:-DGEMV_TC_BROKEN=1 u6:-DGEMV_TC_U8=6 w2:-DGEMV_TC_U8W=2 w6:-DGEMV_TC_U8W=6"}
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  log build
  (./compile_cuda.sh > "$OUT/build_new.log" 2>&1; echo "new rc=$?") &
  for v in $V; do n=${v%%:*}; mkdir -p /tmp/v_$n
    (nvcc -fatbin -O3 -std=c++17 $G -Ikernels/includes ${v#*:} -o /tmp/v_$n/gemv.fatbin kernels/gemv.cu; echo "$n rc=$?") &
  done
  wait
  for v in $V; do d=/tmp/v_${v%%:*}; for f in minitorch/cuda_kernels/*.fatbin; do [ "$(basename $f)" = gemv.fatbin ] || cp $f $d/; done; done
  PAT='passed|failed|rc=|Error' run tests_tc 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_gemv_tokens.py \
      tests/test_cuda_model.py tests/test_cuda_long_cache.py -k "tc or exact or greedy_speculative or gemv or matches_cpu"
  PAT='passed|failed|rc=' run broken 60 env MINITORCH_CUDA_BUILD_DIR=/tmp/v_broken python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_cuda_gemv_tokens.py tests/test_cuda_model.py -k "tc"
  S="--spec --spec-pair coder --gammas 2 3 4 --max-len 32768"
  P='cost model|decode step|rc=|Error'
  PAT=$P run coder_ours 60 python3 project/bench/throughput.py $S --gemv ours
  PAT=$P run coder_tc 60 python3 project/bench/throughput.py $S --gemv tc
  PAT=$P run coder_tc_narrow 60 python3 project/bench/throughput.py $S --gemv tc --tc-wide off
  for v in ${VB:-u6 w2 w6}; do PAT=$P run coder_tc_$v 60 env MINITORCH_CUDA_BUILD_DIR=/tmp/v_$v python3 project/bench/throughput.py $S --gemv tc; done
  PAT=$P run coder_ours_again 60 python3 project/bench/throughput.py $S --gemv ours
  PAT='gemv|attn|total|rc=' TAILN=30 run profile_tc 60 python3 project/bench/throughput.py --shape qwen2.5-coder-1.5b --gemv tc --profile
  cd "$OUT" && tar czf all_tc.tgz *.log && rm -f coder_*.log build_new.log
  ;;
pt)  # the persistent draft step (kernels/persistent.cu): build, tests, a broken build, phases, A/B on the coder shapes
  G="-gencode=arch=compute_90,code=sm_90"
  V=${V:-"broken:-DPT_BROKEN=1 timing:-DPT_TIMING=1 bars:-DPT_TIMING=1+-DPT_ONLY_BARRIERS=1"}
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  log build
  (./compile_cuda.sh > "$OUT/build_new.log" 2>&1; echo "new rc=$?") &
  for v in $V; do n=${v%%:*}; f=${v#*:}; mkdir -p /tmp/v_$n
    (nvcc -fatbin -O3 -std=c++17 $G -Ikernels/includes ${f//+/ } -o /tmp/v_$n/persistent.fatbin kernels/persistent.cu; echo "$n rc=$?") &
  done
  wait
  for v in $V; do d=/tmp/v_${v%%:*}; for f in minitorch/cuda_kernels/*.fatbin; do [ "$(basename $f)" = persistent.fatbin ] || cp $f $d/; done; done
  if [ -n "${ALLTESTS:-}" ]; then  # the whole GPU suite
    PAT='passed|failed|rc=|Error' TAILN=30 run tests_all 300 python3 -m pytest -q -m gpu -p no:cacheprovider
  else
    PAT='passed|failed|rc=|Error|assert' TAILN=30 run tests_pt 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_cuda_persistent.py tests/test_cuda_pdl.py tests/test_cuda_sampling.py -k "persistent or pdl or top_k_1 or seeds"
  fi
  PAT='passed|failed|rc=' run broken 90 env MINITORCH_CUDA_BUILD_DIR=/tmp/v_broken python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_cuda_persistent.py
  PAT='T=|rc=|Error' run phases 60 env PYTHONPATH=. MINITORCH_CUDA_BUILD_DIR=/tmp/v_timing python3 tools/pt_phases.py
  for b in bars; do [ -d /tmp/v_$b ] && PAT='T=|rc=|Error' run phases_$b 60 env PYTHONPATH=. MINITORCH_CUDA_BUILD_DIR=/tmp/v_$b python3 tools/pt_phases.py; done
  S="--shape qwen2.5-coder-0.5b --max-len 32768 --gemv ours"
  P='decode step|rc=|Error'
  PAT=$P run s_kernels 60 python3 project/bench/throughput.py $S
  PAT=$P run s_pt 60 python3 project/bench/throughput.py $S --persistent on
  for v in ${VB-}; do [ -f /tmp/v_$v/persistent.fatbin ] && PAT=$P run s_pt_$v 60 env MINITORCH_CUDA_BUILD_DIR=/tmp/v_$v python3 project/bench/throughput.py $S --persistent on; done
  PAT='cost model|cost ratio|rc=|Error' run spec_pt 90 python3 project/bench/throughput.py --spec --spec-pair coder --gammas 3 4 5 6 --max-len 32768 --gemv tc --persistent draft
  cd "$OUT" && tar czf all_pt.tgz *.log && rm -f s_*.log build_new.log
  ;;
probe)  # build, the persistent tests, then tools/overlap_probe.py (two streams; each draft kernel's cost in its graph)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  [ -f minitorch/cuda_kernels/persistent.fatbin ] || { log build; ./compile_cuda.sh > "$OUT/build_new.log" 2>&1; echo "new rc=$?"; }
  PAT='passed|failed|rc=|Error|assert' TAILN=20 run tests_pt 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_cuda_persistent.py tests/test_cuda_sampling.py -k "persistent or top_k_1 or seeds or vocab"
  PAT='.' TAILN=40 run probe_overlap 150 env PYTHONPATH=. python3 tools/overlap_probe.py overlap
  PAT='.' TAILN=60 run probe_marginal 150 env PYTHONPATH=. python3 tools/overlap_probe.py marginal
  ;;
fast)  # the compact attention kernel (attn_partial_bf16_d64/_d128): tests, a broken build, A/B against the generic one
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  [ -f minitorch/cuda_kernels/attention.fatbin ] || { log build; ./compile_cuda.sh > "$OUT/build_new.log" 2>&1; echo "new rc=$?"; }
  if [ -n "${ALLTESTS:-}" ]; then  # the whole GPU suite
    PAT='passed|failed|rc=|Error' TAILN=30 run tests_all 330 python3 -m pytest -q -m gpu -p no:cacheprovider
  else
    PAT='passed|failed|rc=|Error|assert' TAILN=20 run tests_fast 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_cuda_attention.py tests/test_cuda_long_cache.py tests/test_cuda_pdl.py tests/test_cuda_persistent.py \
        tests/test_cuda_model.py -k "attention or long_cache or pdl or persistent or exact or greedy_speculative or matches_cpu"
  fi
  if [ -d .probe/broken ]; then
    for f in minitorch/cuda_kernels/*.fatbin; do [ "$(basename $f)" = attention.fatbin ] || cp $f .probe/broken/; done
    PAT='passed|failed|rc=' run broken 60 env MINITORCH_CUDA_BUILD_DIR=.probe/broken python3 -m pytest -q -m gpu \
        -p no:cacheprovider tests/test_cuda_attention.py -k fast
  fi
  P="python3 tools/attn_probe.py"
  if [ -d .probe/prev ]; then  # the previous attention build, for a same-call A/B
    for f in minitorch/cuda_kernels/*.fatbin; do [ "$(basename $f)" = attention.fatbin ] || cp $f .probe/prev/; done
    PAT='ctx|rc=|Error' run probe_prev 150 bash -c "PYTHONPATH=. $P new; PYTHONPATH=. MINITORCH_CUDA_BUILD_DIR=.probe/prev $P prev; PYTHONPATH=. $P new_kb64 --kb 64; PYTHONPATH=. $P new_kb64_1024 --kb 64 --ctx 1024; PYTHONPATH=. $P new_1024 --ctx 1024; PYTHONPATH=. MINITORCH_CUDA_BUILD_DIR=.probe/prev $P prev_again; PYTHONPATH=. $P new_again"
  else
    PAT='ctx|rc=|Error' run probe_fast 120 bash -c "PYTHONPATH=. $P fast; PYTHONPATH=. $P generic --generic; PYTHONPATH=. $P fast_1024 --ctx 1024; PYTHONPATH=. $P generic_1024 --ctx 1024 --generic; PYTHONPATH=. $P fast_again"
  fi
  PAT='cost model|decode step|rc=|Error' run spec_tc 90 python3 project/bench/throughput.py --spec --spec-pair coder --gammas 3 4 5 6 --max-len 32768 --gemv tc
  PAT='decode step|tokens/sec|rc=|Error' run target_ours 60 python3 project/bench/throughput.py --shape qwen2.5-coder-1.5b --max-len 32768 --gemv ours
  ;;
i8)  # round 9, call 2: the draft's one-token steps on 8-bit rows (kernels/gemv.cu gemv1*_i8); carry
  # minitorch/cuda_kernels and .probe/vars (i8b: a -DGEMV_I8_BROKEN=1 gemv build)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  V=.probe/vars
  [ -f minitorch/cuda_kernels/gemv.fatbin ] && [ -d $V/i8b ] || { echo "carry minitorch/cuda_kernels and $V"; exit 2; }
  for d in $V/*; do for f in minitorch/cuda_kernels/*.fatbin; do [ -f $d/$(basename $f) ] || cp $f $d/; done; done
  PAT='passed|failed|rc=|Error' TAILN=30 run tests_int8 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_int8.py
  PAT='passed|failed|rc=' run broken_i8 60 env MINITORCH_CUDA_BUILD_DIR=$V/i8b python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_cuda_int8.py
  S="--spec --spec-pair coder --gammas 3 4 5 --max-len 32768 --gemv tc"
  P='cost model|decode step|rc=|Error'
  S0="--shape qwen2.5-coder-0.5b --max-len 32768 --gemv ours"
  PAT='decode step|rc=|Error' run s05_bf16 40 python3 project/bench/throughput.py $S0
  PAT='decode step|rc=|Error' run s05_int8 40 python3 project/bench/throughput.py $S0 --int8 on
  PAT='decode step|rc=|Error' run s05_bf16b 40 python3 project/bench/throughput.py $S0
  PAT='decode step|rc=|Error' run s05_int8b 40 python3 project/bench/throughput.py $S0 --int8 on
  PAT='decode step|rc=|Error' run s15_int8 40 python3 project/bench/throughput.py --shape qwen2.5-coder-1.5b --max-len 32768 --gemv ours --int8 on
  PAT=$P run spec_bf16 60 python3 project/bench/throughput.py $S
  PAT=$P run spec_int8 60 python3 project/bench/throughput.py $S --int8 draft
  PAT='passed|failed|rc=|Error' TAILN=30 run tests_all 330 python3 -m pytest -q -m gpu -p no:cacheprovider
  cd "$OUT" && tar czf all_i8.tgz *.log && rm -f spec_*.log s05_*.log
  ;;
vars)  # ON THE BOX (nvcc, no GPU), before an i8v call: the sm_90 gemv variants it carries in .probe/vars
  ./compile_cuda.sh > /dev/null && V=.probe/vars && rm -rf $V && mkdir -p $V/c8i $V/c16p $V/c16i $V/i8b
  G="-gencode=arch=compute_90,code=sm_90"
  for v in "c8i:-DGEMV_I8_PRMT=0" "c16p:-DGEMV_I8_CHUNK=16" "c16i:-DGEMV_I8_CHUNK=16 -DGEMV_I8_PRMT=0" "i8b:-DGEMV_I8_BROKEN=1"; do
    # shellcheck disable=SC2086
    nvcc -fatbin -O3 -std=c++17 $G -Ikernels/includes ${v#*:} -o $V/${v%%:*}/gemv.fatbin kernels/gemv.cu &
  done
  wait; ls $V/*
  ;;
i8v)  # round 9, last call: 8-bit draft rows, variants of the chunk (8 / 16 codes) and the code -> float
  # conversion (byte permute / I2F); carry minitorch/cuda_kernels (default: 8 codes, permute) and .probe/vars
  V=.probe/vars
  [ -f minitorch/cuda_kernels/gemv.fatbin ] && [ -d $V/i8b ] || { echo "carry minitorch/cuda_kernels and $V"; exit 2; }
  for d in $V/*; do for f in minitorch/cuda_kernels/*.fatbin; do [ -f $d/$(basename $f) ] || cp $f $d/; done; done
  S0="--shape qwen2.5-coder-0.5b --max-len 32768 --gemv ours"
  PD='decode step|rc=|Error'
  PAT=$PD run s05_bf16 40 python3 project/bench/throughput.py $S0
  PAT=$PD run s05_c8p 40 python3 project/bench/throughput.py $S0 --int8 on
  for v in c8i c16p c16i; do PAT=$PD run s05_$v 40 env MINITORCH_CUDA_BUILD_DIR=$V/$v python3 project/bench/throughput.py $S0 --int8 on; done
  PAT=$PD run s05_bf16b 40 python3 project/bench/throughput.py $S0
  PAT=$PD run s05_c8pb 40 python3 project/bench/throughput.py $S0 --int8 on
  PAT='passed|failed|rc=|Error' TAILN=30 run tests_int8 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_int8.py \
      tests/test_cuda_sampling.py tests/test_cuda_model.py
  PAT='passed|failed|rc=' run broken_i8 60 env MINITORCH_CUDA_BUILD_DIR=$V/i8b python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_cuda_int8.py
  for v in c8i c16p c16i; do PAT='passed|failed|rc=' run t_$v 40 env MINITORCH_CUDA_BUILD_DIR=$V/$v python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_cuda_int8.py -k "float64"; done
  # graph prefill (CudaDecoder.fill_cache, --gpu-prefill graph), written after the last call of round 9
  PAT='passed|failed|rc=|Error' TAILN=20 run tests_prefill 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_prefill.py
  cd "$OUT" && tar czf all_i8v.tgz *.log && rm -f s05_*.log t_*.log
  ;;
realtc)  # after `.stage/assemble.sh join`: the tensor-core exact mode (default) against gemv "ours", real pair
  real_env
  T=qwen2.5-coder-1.5b-instruct; D=qwen2.5-coder-0.5b-instruct
  B="--limit 20 --backend cuda --no-plots --no-progress"
  PB='tokens/sec|decode step|rc=|Error|error'
  PG='speedup|accuracy|alpha|tok/s|tokens/s|identical|same|rc=|Error|error'
  PAT=$PG TAILN=25 run gsm8k_tc 130 python3 project/benchmark_gsm8k.py $B -o $OUT/gsm8k_tc.jsonl
  PAT=$PG TAILN=25 run gsm8k_ours 130 python3 project/benchmark_gsm8k.py $B --gpu-gemv ours -o $OUT/gsm8k_ours.jsonl
  PAT=$PG TAILN=25 run math500_tc 140 python3 project/benchmark_limo.py --dataset math500 $B -o $OUT/math500_tc.jsonl
  PAT=$PG TAILN=25 run gsm8k_t06_tc 130 python3 project/benchmark_gsm8k.py $B --temperature 0.6 --top-p 0.95 -o $OUT/gsm8k_t06_tc.jsonl
  PAT=$PB run bench_target_ours 70 python3 project/bench/throughput.py --model $T --engine --max-len 32768 --gemv ours
  PAT='.' TAILN=12 run demo 60 python3 project/run_spec_decoding.py --backend cuda
  cd "$OUT" && tar czf real_tc.tgz *.log *.jsonl *.json 2>/dev/null; rm -f *.jsonl *.log *.json
  ;;
i8t2)  # round 10, calls 2-4: the 8-bit draft rows' two-token kernels (gemv2*_i8) and gemv="ourstc" (the draft's
  # steps of 2..16 tokens on tensor cores); carry minitorch/cuda_kernels and .probe/vars (i8b: -DGEMV_I8_BROKEN=1,
  # built by `bash tools/gpu_issue14.sh vars`); ALL=1 adds the whole GPU suite
  V=.probe/vars
  [ -f minitorch/cuda_kernels/gemv.fatbin ] && [ -d $V/i8b ] || { echo "carry minitorch/cuda_kernels and $V"; exit 2; }
  for f in minitorch/cuda_kernels/*.fatbin; do [ -f $V/i8b/$(basename $f) ] || cp $f $V/i8b/; done
  PAT='passed|failed|rc=|Error' TAILN=30 run tests_int8 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_int8.py \
      tests/test_cuda_sampling.py tests/test_cuda_prefill.py tests/test_cuda_model.py
  PAT='passed|failed|rc=' run broken_i8 60 env MINITORCH_CUDA_BUILD_DIR=$V/i8b python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_cuda_int8.py
  S0="--shape qwen2.5-coder-0.5b --max-len 32768 --gemv ours"
  PD='decode step|rc=|Error'
  PAT=$PD run s05_bf16 40 python3 project/bench/throughput.py $S0
  PAT=$PD run s05_int8 40 python3 project/bench/throughput.py $S0 --int8 on
  S="--spec --spec-pair coder --gammas 4 5 6 --max-len 32768 --gemv tc"
  P='cost model|decode step|rc=|Error'
  PAT=$P run spec_ours 60 python3 project/bench/throughput.py $S --draft-gemv ours
  PAT=$P run spec_ourstc 60 python3 project/bench/throughput.py $S --draft-gemv ourstc
  PAT=$P run spec_ourstc_i8 60 python3 project/bench/throughput.py $S --draft-gemv ourstc --int8 draft
  [ -n "${ALL:-}" ] && PAT='passed|failed|rc=|Error' TAILN=30 run tests_all 330 python3 -m pytest -q -m gpu -p no:cacheprovider
  cd "$OUT" && tar czf all_i8t2.tgz *.log && rm -f spec_*.log s05_*.log
  ;;
ext)  # round 11, first call: --draft-extend on the GPU (written after round 10's last call); carry
  # minitorch/cuda_kernels (sampling.cu changed: spec_accept's gq)
  PAT='passed|failed|rc=|Error' TAILN=30 run tests_ext 300 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_cuda_sampling.py tests/test_cuda_int8.py tests/test_cuda_prefill.py tests/test_cuda_model.py
  [ -n "${ALL:-}" ] && PAT='passed|failed|rc=|Error' TAILN=30 run tests_all 330 python3 -m pytest -q -m gpu -p no:cacheprovider
  cd "$OUT" && tar czf all_ext.tgz *.log
  ;;
realy)  # round 11, second staging: prompt lookup on the device (kernels/lookup.cu) and the new CUDA defaults
  # (gamma 3 + --draft-extend 4): GPU tests, a -DLOOKUP_BROKEN=1 build, then the benchmarks; carry .whl,
  # minitorch/cuda_kernels and .probe/lookb (the broken lookup.fatbin)
  real_env
  [ -n "${SKIPTESTS:-}" ] || PAT='passed|failed|rc=|Error' TAILN=20 run tests_lookup 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_cuda_lookup.py tests/test_cuda_sampling.py
  for f in minitorch/cuda_kernels/*.fatbin; do [ -f .probe/lookb/$(basename $f) ] || cp $f .probe/lookb/; done
  [ -n "${SKIPTESTS:-}" ] || PAT='passed|failed|rc=' run broken_lookup 60 env MINITORCH_CUDA_BUILD_DIR=.probe/lookb python3 -m pytest -q -m gpu \
      -p no:cacheprovider tests/test_cuda_lookup.py
  B="--limit 20 --backend cuda --no-plots --no-progress"
  PG='speedup|^spec |^target |time:|acceptance by|rc=|Error|error'
  PAT=$PG TAILN=8 run gsm8k_default 100 python3 project/benchmark_gsm8k.py $B -o $OUT/gsm8k_default.jsonl
  PAT=$PG TAILN=8 run gsm8k_g4x0 100 python3 project/benchmark_gsm8k.py $B --gamma 4 --draft-extend 0 -o $OUT/gsm8k_g4x0.jsonl
  PAT=$PG TAILN=8 run math500_default 110 python3 project/benchmark_limo.py --dataset math500 $B -o $OUT/math500_default.jsonl
  PAT=$PG TAILN=8 run gsm8k_t06_default 100 python3 project/benchmark_gsm8k.py $B --temperature 0.6 --top-p 0.95 -o $OUT/gsm8k_t06_default.jsonl
  PAT='.' TAILN=12 run demo_default 60 python3 project/run_spec_decoding.py --backend cuda
  PAT=$PG TAILN=8 run gsm8k_g4x3 100 python3 project/benchmark_gsm8k.py $B --gamma 4 --draft-extend 3 -o $OUT/gsm8k_g4x3.jsonl
  PAT='.' TAILN=12 run demo_g4x0 60 python3 project/run_spec_decoding.py --backend cuda --gamma 4 --draft-extend 0
  cd "$OUT" && tar czf real_y.tgz *.log *.jsonl *.json 2>/dev/null; rm -f *.jsonl *.log *.json
  ;;
realx)  # round 11, after `.stage/assemble.sh join`: --draft-extend 0 / 2 / 3 / 4 with the defaults, one call;
  # carry .whl and minitorch/cuda_kernels
  real_env
  B="--limit 20 --backend cuda --no-plots --no-progress"
  PG='speedup|^spec |^target |time:|rc=|Error|error'
  # tools/sim_draft_extend.py predicts (round 10's GSM8K outputs): gamma 4: 1.456x plain (measured 1.44x), + 3
  # looked up 1.616x; gamma 3 + 4 looked up 1.666x
  for gx in "4 0" "4 3" "3 4" "3 3" "4 2"; do
    set -- $gx
    PAT=$PG TAILN=8 run gsm8k_g$1_x$2 100 python3 project/benchmark_gsm8k.py $B --gamma $1 --draft-extend $2 \
      -o $OUT/gsm8k_g$1_x$2.jsonl
  done
  PAT=$PG TAILN=8 run math500_x3 110 python3 project/benchmark_limo.py --dataset math500 $B --draft-extend 3 -o $OUT/math500_x3.jsonl
  PAT=$PG TAILN=8 run gsm8k_t06_x3 100 python3 project/benchmark_gsm8k.py $B --draft-extend 3 --temperature 0.6 --top-p 0.95 -o $OUT/gsm8k_t06_x3.jsonl
  PAT=$PG TAILN=8 run gsm8k_x3_ours 100 python3 project/benchmark_gsm8k.py $B --draft-extend 3 --gpu-gemv ours -o $OUT/gsm8k_x3_ours.jsonl
  PAT='.' TAILN=12 run demo_x3 60 python3 project/run_spec_decoding.py --backend cuda --draft-extend 3
  cd "$OUT" && tar czf real_x.tgz *.log *.jsonl *.json 2>/dev/null; rm -f *.jsonl *.log *.json
  ;;
realq)  # round 10, after `.stage/assemble.sh join`: graph prefill, the draft's two-token steps on tensor cores
  # (ourstc) and its 8-bit rows against round 9's settings, one call; carry .whl and minitorch/cuda_kernels
  real_env
  B="--limit 20 --backend cuda --no-plots --no-progress"
  N="--gpu-prefill graph --gpu-draft-gemv ourstc --gpu-draft-weights int8"
  PG='speedup|^spec |^target |time:|rc=|Error|error'
  PAT=$PG TAILN=8 run gsm8k_r9 100 python3 project/benchmark_gsm8k.py $B --gpu-prefill eager --gpu-draft-gemv ours --gpu-draft-weights bf16 -o $OUT/gsm8k_r9.jsonl
  PAT=$PG TAILN=8 run gsm8k_new 100 python3 project/benchmark_gsm8k.py $B $N -o $OUT/gsm8k_new.jsonl
  PAT=$PG TAILN=8 run gsm8k_tc2 100 python3 project/benchmark_gsm8k.py $B --gpu-prefill eager --gpu-draft-gemv ourstc --gpu-draft-weights bf16 -o $OUT/gsm8k_tc2.jsonl
  PAT=$PG TAILN=8 run gsm8k_pf 100 python3 project/benchmark_gsm8k.py $B --gpu-prefill graph --gpu-draft-gemv ourstc --gpu-draft-weights bf16 -o $OUT/gsm8k_pf.jsonl
  PAT=$PG TAILN=8 run gsm8k_new_g5 100 python3 project/benchmark_gsm8k.py $B $N --gamma 5 -o $OUT/gsm8k_new_g5.jsonl
  PAT=$PG TAILN=8 run math500_new 110 python3 project/benchmark_limo.py --dataset math500 $B $N -o $OUT/math500_new.jsonl
  PAT=$PG TAILN=8 run gsm8k_t06_new 100 python3 project/benchmark_gsm8k.py $B $N --temperature 0.6 --top-p 0.95 -o $OUT/gsm8k_t06_new.jsonl
  PAT=$PG TAILN=8 run gsm8k_new_ours 100 python3 project/benchmark_gsm8k.py $B $N --gpu-gemv ours -o $OUT/gsm8k_new_ours.jsonl
  PAT='.' TAILN=12 run demo 60 python3 project/run_spec_decoding.py --backend cuda $N
  PAT=$PG TAILN=8 run gsm8k_new_g6 100 python3 project/benchmark_gsm8k.py $B $N --gamma 6 -o $OUT/gsm8k_new_g6.jsonl
  cd "$OUT" && tar czf real_q.tgz *.log *.jsonl *.json 2>/dev/null; rm -f *.jsonl *.log *.json
  ;;
realpf)  # after `.stage/assemble.sh join`: --gpu-prefill eager against graph, same call (carry .whl, minitorch/cuda_kernels)
  real_env
  B="--limit 20 --backend cuda --no-plots --no-progress"
  PG='speedup|^spec |^target |identical|same|rc=|Error|error'
  PAT=$PG TAILN=8 run gsm8k_eager 130 python3 project/benchmark_gsm8k.py $B -o $OUT/gsm8k_eager.jsonl
  PAT=$PG TAILN=8 run gsm8k_graph 130 python3 project/benchmark_gsm8k.py $B --gpu-prefill graph -o $OUT/gsm8k_graph.jsonl
  PAT=$PG TAILN=8 run gsm8k_graph_ours 130 python3 project/benchmark_gsm8k.py $B --gpu-prefill graph --gpu-gemv ours -o $OUT/gsm8k_graph_ours.jsonl
  PAT=$PG TAILN=8 run math500_graph 140 python3 project/benchmark_limo.py --dataset math500 $B --gpu-prefill graph -o $OUT/math500_graph.jsonl
  cd "$OUT" && tar czf real_pf.tgz *.log *.jsonl *.json 2>/dev/null; rm -f *.jsonl *.log *.json
  ;;
real)  # after `.stage/assemble.sh join`; the wheels (gguf, math-verify) carried in .whl
  real_env
  [ -f minitorch/cuda_kernels/attention.fatbin ] || ./compile_cuda.sh > /dev/null 2>&1
  L=/tmp/gpu14logs; mkdir -p $L
  T=qwen2.5-coder-1.5b-instruct; D=qwen2.5-coder-0.5b-instruct
  B="--limit 20 --backend cuda --no-plots --no-progress"
  PAT='tokens/sec|Bandwidth|decode step|rc=|Error|error' OUT=$L run bench_target 150 python3 project/bench/throughput.py --model $T --engine --max-len 32768 --json $L/bench_target.json
  PAT='speedup|accuracy|alpha|tok/s|tokens/s|identical|same|rc=|Error|error' TAILN=25 OUT=$L run gsm8k 150 python3 project/benchmark_gsm8k.py $B -o $L/gsm8k.jsonl
  PAT='speedup|accuracy|alpha|tok/s|tokens/s|identical|same|rc=|Error|error' TAILN=25 OUT=$L run math500 170 python3 project/benchmark_limo.py --dataset math500 $B -o $L/math500.jsonl
  PAT='speedup|accuracy|alpha|tok/s|tokens/s|identical|same|rc=|Error|error' TAILN=25 OUT=$L run gsm8k_t06 150 python3 project/benchmark_gsm8k.py $B --temperature 0.6 --top-p 0.95 -o $L/gsm8k_t06.jsonl
  PAT='.' TAILN=30 OUT=$L run demo 90 python3 project/run_spec_decoding.py --backend cuda
  PAT='tokens/sec|Bandwidth|decode step|rc=|Error|error' OUT=$L run bench_draft 90 python3 project/bench/throughput.py --model $D --engine --max-len 32768 --json $L/bench_draft.json
  PAT='speedup|accuracy|alpha|tok/s|tokens/s|identical|same|rc=|Error|error' TAILN=25 OUT=$L run gsm8k_fast 150 python3 project/benchmark_gsm8k.py $B --fast-verify -o $L/gsm8k_fast.jsonl
  tar czf "$OUT/real_logs.tgz" -C /tmp gpu14logs
  ;;
*)
  echo "usage: bash tools/gpu_issue14.sh MODE (the modes: the comments at the top and at each mode)"; exit 2
  ;;
esac
log done
