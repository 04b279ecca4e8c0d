#!/usr/bin/env bash
# The device loop (LAB_LOOP=device) under compute-sanitizer racecheck, piece by piece
# (scripts/sanitize_loop.py's modes), every piece a process of its own, all at once:
#   minimal, shared   a WHILE + SWITCH loop whose body is `advance` (and an rmsnorm)
#   kernel NAME       the loop's body is one of the step's kernels and `advance`, for each kernel
#   kernels A,B,...   the loop's body is those kernels (the step's first launch of each) and
#                     `advance`, for each set in KERNEL_SETS: which combinations crash it
#   one-body          the loop's body is the whole step (the first plan's)
#   loop              the engine's device loop (every plan a body)
#   body              no loop: the step captured into an ordinary graph per plan, replayed
# Writes OUTDIR/sanitize/<piece>.log and OUTDIR/sanitize_loop.txt: per piece the exit status
# (139 or 11: the process was killed by a segmentation fault) and racecheck's summary line.
# Two pieces try the smallest crashing body (the step's first two launches, then advance) with a
# workaround each: prefix-2-warm (its kernels run once eagerly before the loop is built) and
# prefix-2-eager (CUDA_MODULE_LOADING=EAGER: every kernel loaded at module load, none lazily).
# ONLY=sets runs the KERNEL_SETS pieces and those two alone (a short bisection run).
#   scripts/sanitize_loop.sh OUTDIR
set -uo pipefail
out=${1:?usage: scripts/sanitize_loop.sh OUTDIR}
mkdir -p "$out/sanitize"
tool=(compute-sanitizer --tool racecheck --report-api-errors no)
kernels="embed rmsnorm matvec rope_kv_append attn_partial attn_combine swiglu_up matvec_residual argmax_next"
run() {  # piece, then sanitize_loop.py's arguments (ENV=NAME=VALUE before run: one variable more)
  local piece=$1; shift
  env ${ENV:-} timeout 300 "${tool[@]}" python3 -X faulthandler scripts/sanitize_loop.py "$@" \
    > "$out/sanitize/$piece.log" 2>&1
  echo "$piece $?" > "$out/sanitize/$piece.status"
}
# 2, 3 and 4 different kernels (advance counted) in a body, in either order, one kernel thrice
sets=${KERNEL_SETS:-"embed,rmsnorm rmsnorm,embed rmsnorm,matvec matvec,rmsnorm matvec,matvec,matvec rmsnorm,matvec,swiglu_up"}
if [ "${ONLY:-all}" != sets ]; then
  run minimal --mode minimal &
  run shared --mode shared &
  run one-body --mode one-body &
  run loop --mode loop &
  run body --mode body &
  for k in $kernels; do run "kernel-$k" --mode kernel --kernel "$k" & done
  for n in ${PREFIXES:-2 4 8 16 36}; do run "prefix-$n" --mode prefix --count "$n" & done
fi
for s in $sets; do run "kernels-${s//,/-}" --mode kernels --kernels "$s" & done
run prefix-2-warm --mode prefix --count 2 --warm &
ENV=CUDA_MODULE_LOADING=EAGER run prefix-2-eager --mode prefix --count 2 &
wait
{
  echo "compute-sanitizer racecheck on the device loop, piece by piece ($(compute-sanitizer --version | grep -o 'Version [^ ]*'); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader))"
  echo "piece exit ok-line / racecheck summary (exit 11 or 139: segmentation fault)"
  for f in "$out"/sanitize/*.status; do
    piece=$(basename "$f" .status)
    read -r _ code < "$f"
    ok=$(grep -c "^sanitize_loop .*: ok" "$out/sanitize/$piece.log")
    summary=$(grep -o "RACECHECK SUMMARY.*" "$out/sanitize/$piece.log" | head -1)
    echo "$piece $code $ok / ${summary:-no summary}"
  done
} | tee "$out/sanitize_loop.txt"
