#!/usr/bin/env bash
# tools/stage_target.sh on|off|split: the offline target's GGUF (and with WITH_DRAFT=1 the 0.5B's) onto a
# lent GPU machine in as few calls as the 64 MiB a call allows. A call carries the whole tracked tree plus one piece,
# so the tree's size sets the number of calls: the full tree (~61 MB) leaves under 5 MiB a piece; without the
# folders a staging call does not need (heads/, data/chat/, data/texts/, data/selfmath/, data/gsm8k/generated/,
# docs/: ~55 MB) a piece is 56 MiB, 19 calls. Every call after a refused start is refused too (15 s of device time
# each), so fewer calls is also less to lose.
#
#   bash tools/stage_target.sh on      # those folders out of the index (git rm --cached) and hidden (.git/info/exclude)
#   bash tools/stage_target.sh on data/chat docs   # only these (a work call's tree, with ~8 MB of wheels and kernels,
#                                      # must fit 64 MiB too, and the whole tree no longer does)
#   bash tools/stage_target.sh split   # pieces of the GGUF in .stage/p sized to the tree as it is now; .stage/assemble.sh
#   WITH_DRAFT=1 bash tools/stage_target.sh split   # the 0.5B draft model's GGUF too (~9 more pieces), for --drafter model
#   ... the device calls (below) ...
#   bash tools/stage_target.sh off     # the folders back in the index: `git status` as before. NEVER commit between
#
# The calls, each naming the same `kind`. First ONE call alone (`put 000`): where no machine comes it costs 15 s to 2
# minutes, not the 15 s of every call behind it in a message (two messages of 22 calls lost ~6 minutes each on
# 2026-12-06). Where it gets one, send all the other calls at once in the next message (the machine goes back ~30 s
# after a call ends; that day the next message of 21 calls arrived in time):
#   carry [".stage/assemble.sh", ".stage/p/manifest", ".stage/p/NNN"], command `bash .stage/assemble.sh put NNN`;
#   the last `bash .stage/assemble.sh put NNN && bash .stage/assemble.sh join` (checks the sha256); then the work
#   calls (carry [".whl", "minitorch/cuda_kernels"]). A work call that reads hidden folders either names them in its
#   carry (carry takes ignored paths, 8 at most, within the 64 MiB; the device README says so, not yet tried here):
#   a training [".whl", "minitorch/cuda_kernels", "heads", "data/chat", "data/texts", "data/selfmath",
#   "data/gsm8k/generated"] (~53 MB with the tree), a bench of a head [".whl", "minitorch/cuda_kernels", "heads"] and
#   the head's folder if elsewhere, so every call of a sitting can go in one message with the staging on; or runs
#   after `off` (a local bash call placed in the same message before it) and `on` with what it does not read (a
#   bench: data/chat data/texts data/selfmath data/gsm8k/generated; a training: docs).
#   A copy of heads/ that travels in a carried folder of its own (the tried route: .cand/heads_copy) goes back into
#   heads/ with tools/sitting_lib.sh's `heads_from .cand/heads_copy` (it checks each head's SHA256SUMS).
set -euo pipefail
cd "$(dirname "$0")/.."
SLIM=(heads data/chat data/texts data/selfmath data/gsm8k/generated docs)
EXCL=.git/info/exclude
MARK="# stage_target.sh: hidden while staging"
case "${1:-}" in
  on)  # on [FOLDER...]: those folders (default SLIM), e.g. all but what one work call reads
    git diff --cached --quiet || { echo "the index has staged changes: commit or unstage them first" >&2; exit 1; }
    grep -q "^$MARK" "$EXCL" 2>/dev/null && { echo "already on" >&2; exit 1; }
    shift; HIDE=("${@:-${SLIM[@]}}")
    git rm -r -q --cached "${HIDE[@]}"
    { echo "$MARK: ${HIDE[*]}"; for d in "${HIDE[@]}"; do echo "/$d/"; done; } >> "$EXCL"
    echo "tracked tree now $(git ls-files -z | xargs -0 cat | wc -c) bytes; 'off' puts ${HIDE[*]} back" ;;
  off)
    line=$(grep "^$MARK" "$EXCL" 2>/dev/null) || { echo "not on" >&2; exit 1; }
    read -r -a HIDE <<< "${line#"$MARK: "}"
    git reset -q -- "${HIDE[@]}"
    # only the marker and the folders it hid: `split` appends /.stage/ after them, and dropping it too made the next
    # call carry the pieces (over the 64 MiB a call takes; seen 2026-12-07)
    awk -v m="$line" -v hid="$(printf '/%s/ ' "${HIDE[@]}")" \
      'BEGIN { n = split(hid, h, " "); for (i = 1; i <= n; i++) skip[h[i]] = 1 }
       $0 == m { on = 1; next } on && ($0 in skip) { next } { on = 0; print }' "$EXCL" > "$EXCL.tmp"
    mv "$EXCL.tmp" "$EXCL"
    git status --short | head -5 ;;
  split)  # WITH_DRAFT=1: the 0.5B draft model too (9 more pieces), for runs of `--drafter model`
    cache="${MINITORCH_SPEC_CACHE:-$HOME/.cache/minitorch-spec}"
    files=(qwen2.5-coder-1.5b-instruct-q4_k_m.gguf); [ "${WITH_DRAFT:-0}" = 1 ] && files+=(qwen2.5-coder-0.5b-instruct.gguf)
    for f in "${files[@]}"; do
      [ -f "$cache/$f" ] || { echo "missing $cache/$f: run 'python -m minitorch.models.registry' first" >&2; exit 1; }
    done
    grep -qx '/.stage/' "$EXCL" 2>/dev/null || echo '/.stage/' >> "$EXCL"
    tree=$(git ls-files -z | xargs -0 cat | wc -c)
    psize=$(( 62 * 1048576 - tree ))
    [ "$psize" -gt 8388608 ] || { echo "the tree ($tree bytes) leaves no room for pieces" >&2; exit 1; }
    rm -rf .stage; mkdir -p .stage/p; : > .stage/p/manifest; start=0
    for f in "${files[@]}"; do  # pieces numbered on across the files; a manifest line: piece file sha256
      sum=$(cat "$cache/$f.verified" 2>/dev/null || sha256sum "$cache/$f" | cut -d' ' -f1)
      split -b "$psize" -d -a 3 --numeric-suffixes="$start" "$cache/$f" .stage/p/
      n=$(( ($(stat -c %s "$cache/$f") + psize - 1) / psize ))
      for ((i = start; i < start + n; i++)); do printf '%03d %s %s\n' "$i" "$f" "$sum" >> .stage/p/manifest; done
      start=$(( start + n ))
    done
    cat > .stage/assemble.sh <<'SH'
#!/usr/bin/env bash
# On the GPU machine: `put NNN` keeps piece NNN in /root/stage; `join` rebuilds each GGUF in /root/cache, sha256 checked.
set -euo pipefail
R=/root; mkdir -p "$R/stage" "$R/cache"
case "$1" in
  put) cp ".stage/p/$2" .stage/p/manifest "$R/stage/"
       echo "have $(ls "$R/stage" | grep -vc manifest) of $(wc -l < .stage/p/manifest) pieces";;
  join) for f in $(cut -d' ' -f2 "$R/stage/manifest" | uniq); do
          sum=$(awk -v f="$f" '$2 == f { print $3; exit }' "$R/stage/manifest")
          awk -v f="$f" -v d="$R/stage/" '$2 == f { print d $1 }' "$R/stage/manifest" | xargs cat > "$R/cache/$f"
          echo "$sum  $R/cache/$f" | sha256sum -c -
          echo "$sum" > "$R/cache/$f.verified"
        done
        rm -rf "$R/stage"; echo "export MINITORCH_SPEC_CACHE=$R/cache";;
esac
SH
    echo "$(wc -l < .stage/p/manifest) pieces of $(( psize / 1048576 )) MiB in .stage/p (tree $tree bytes)" ;;
  *) sed -n '2,21p' "$0"; exit 2 ;;
esac
