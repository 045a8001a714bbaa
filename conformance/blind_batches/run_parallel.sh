#!/usr/bin/env bash
# Run the conformance suite against every host of one blind batch, JOBS hosts at a time (each host's suite is one
# single-threaded process), for a machine with more cores than this one (e.g. the GPU machine's 16, where the suite
# still runs the reference host on its CPU). Same verdict per host as the batch's own run_batch.sh (rc 1 = caught,
# 0 = missed, failed checks from the log), written to $OUT/runs_suite_$SUITE.tsv and $OUT/logs_suite_$SUITE/.
#   BATCH=2026-12-07b SUITE=<commit> JOBS=14 OUT=/tmp/out PY=python3 T_HOST=480 bash conformance/blind_batches/run_parallel.sh
# T_HOST bounds each host's run (rc 124 = ran out of time: neither caught nor missed; run that host again).
set -u
R=$(cd "$(dirname "$0")/../.." && pwd)
B="$R/conformance/blind_batches/${BATCH:?BATCH=<folder under conformance/blind_batches>}"
SUITE=${SUITE:-unset}
OUT=${OUT:-$B}
PY=${PY:-$R/.venv/bin/python}
JOBS=${JOBS:-$(nproc)}
export B R SUITE OUT PY
mkdir -p "$OUT/logs_suite_$SUITE"
printf 'host\trc\tseconds\tfailed_checks\n' > "$OUT/runs_suite_$SUITE.tsv"
one() {
  module=$1
  t0=$(date +%s)
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout "${T_HOST:-86400}" env DELTASERVE_CACHE="${DELTASERVE_CACHE:-$R/.cache/deltaserve}" \
    PYTHONPATH="$B:$R/src:$R/conformance${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" -m deltaserve_core.cli conformance "blindhosts.${module}:Host" -- -q -p no:cacheprovider \
    > "$OUT/logs_suite_$SUITE/${module}.txt" 2>&1
  rc=$?
  failed=$(grep -oE "AssertionError: \[[a-z_]+\]" "$OUT/logs_suite_$SUITE/${module}.txt" \
    | sed -E 's/AssertionError: \[([a-z_]+)\]/\1/' | sort -u | paste -sd, -)
  printf '%s\t%s\t%s\t%s\n' "$module" "$rc" "$(( $(date +%s) - t0 ))" "${failed:-}" >> "$OUT/runs_suite_$SUITE.tsv"
  echo "$module rc=$rc ${failed:-}"
}
export -f one
if [ $# -gt 0 ]; then
  modules=$(for h in "$@"; do (cd "$B/blindhosts" && ls ${h}_*.py); done | sed 's/\.py$//')
else
  modules=$(cd "$B/blindhosts" && ls h[0-9][0-9]_*.py | sed 's/\.py$//')
fi
echo "$modules" | xargs -P "$JOBS" -I{} bash -c 'one {}'
awk -F'\t' 'NR > 1 { n++; if ($2 == 1) c++ } END { printf "caught %d of %d\n", c, n }' "$OUT/runs_suite_$SUITE.tsv"
