# tools/sitting_lib.sh: a GPU sitting as a queue of jobs, sourced by a sitting's own script (see
# docs/results/h200_head/sitting.sh). Each device call runs that script again: a job already done on this machine
# (/root/done/NAME) is skipped, a job whose time would run out is left for the next call, an interrupted Spec-Bench run
# resumes from its JSONL, and `pack` puts what the call finished into one archive under $OUT (logs, JSONL, summaries).
#
#   source tools/sitting_lib.sh               # LIMIT (seconds this call may use, default 560) read here
#   job NAME TIMEOUT COMMAND...               # COMMAND may be `sb NAME ARGS...` (Spec-Bench on CUDA, then its summary)
#   pack                                      # at the end
#   heads_from DIR                            # a carried copy of heads/ (hidden while staging) into heads/
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MINITORCH_SPEC_CACHE=/root/cache
T0=$(date +%s); LIMIT=${LIMIT:-560}; W=/root/work; mkdir -p $W /root/done
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
job() { local name=$1 t=$2; shift 2; local l; l=$(left)
  [ -f /root/done/$name ] && return
  if [ "$l" -lt 40 ]; then log "$name skipped (time)"; return; fi
  [ "$t" -gt "$l" ] && t=$l
  log "$name (timeout ${t}s)"
  # timeout cannot run a shell function: sb goes through bash -c
  timeout "$t" bash -c "$(declare -f sb); W=$W; \"\$@\"" _ "$@" >> "$W/$name.log" 2>&1; local rc=$?; echo "rc=$rc" >> "$W/$name.log"
  [ $rc -eq 0 ] && touch /root/done/$name
  grep -E "speedup|^spec |^target |passed|failed|rc=|Error|acceptance by|identical" "$W/$name.log" | cut -c1-300 | tail -8; }
sb() { local name=$1; shift; local f=$W/$name.jsonl
  python3 project/benchmark_specbench.py --backend cuda --no-plots --no-progress -o $f $( [ -s $f ] && echo --resume ) "$@" \
    && python3 project/benchmark_specbench.py summary $f > $W/$name.summary.txt 2>&1 && tail -30 $W/$name.summary.txt; }
pack() { (cd $W && for f in *.jsonl; do [ -f "$f" ] && gzip -kf "$f"; done
  tar czf $OUT/sitting_$(date -u +%H%M%S).tgz *.log *.jsonl.gz *.summary.txt 2>/dev/null); ls -la $OUT; }
setup() {  # the wheels the machine lacks (gguf, math-verify: .whl/) and the CUDA kernels, once a machine
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  [ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done; }
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
  [ -f minitorch/cuda_kernels/gemv.fatbin ] || { log build; ./compile_cuda.sh > "$W/build.log" 2>&1; echo "build rc=$?"; }; }
heads_from() {  # DIR: a carried copy of heads/ into heads/, each head's SHA256SUMS checked. `cp -r DIR heads` would copy
  # into heads/DIR where the machine already holds a heads/ folder (2026-12-07: --drafter auto then found no head)
  mkdir -p heads && cp -r "$1"/. heads/ || return 1
  local d; for d in heads/*/; do
    [ -f "$d/SHA256SUMS" ] || continue; (cd "$d" && sha256sum -c --quiet SHA256SUMS) || return 1; done
  echo "heads/ from $1: sha256 checked"; }
