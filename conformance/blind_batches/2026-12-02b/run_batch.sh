#!/usr/bin/env bash
# Runs the conformance suite against every blind host, one at a time (2 shared CPU cores: never in parallel).
# Appends "host<TAB>rc<TAB>seconds<TAB>failed-checks" to runs.tsv; rc 0 = the suite passed the host = a MISS.
# Usage: ./run_batch.sh [hNN_name ...]   (default: every host in blindhosts/)
# WT (the worktree whose suite runs), RUNS and LOGS override where the suite comes from and where results go;
# the defaults are the blind run's (run_batch_after.sh reruns the batch after issue #15 into runs_after.tsv).
WT=${WT:-/work/wt-blind2} RUNS=${RUNS:-runs.tsv} LOGS=${LOGS:-logs}
set -u
B="$(cd "$(dirname "$0")" && pwd)"
cd "$B"
mkdir -p "$LOGS"
[ -f "$RUNS" ] || echo -e "host\trc\tseconds\tfailed_checks" > "$RUNS"
if [ $# -gt 0 ]; then mods=("$@"); else
  mods=(); for f in blindhosts/h[0-9][0-9]_*.py; do m=$(basename "$f" .py); mods+=("$m"); done
fi
for module in "${mods[@]}"; do
  start=$(date +%s)
  OMP_NUM_THREADS=1 DELTASERVE_CACHE=/work/main/.cache/deltaserve \
    PYTHONPATH="$B:$WT/src:$WT/conformance" \
    /work/main/.venv/bin/python -m deltaserve_core.cli conformance "blindhosts.${module}:Host" -- -q \
    > "$LOGS/${module}.txt" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  failed=$(grep -oE "AssertionError: \[[a-z_]+\]" "$LOGS/${module}.txt" | sort -u | sed -E 's/AssertionError: \[([a-z_]+)\]/\1/' | paste -sd, -)
  echo -e "${module}\t${rc}\t${secs}\t${failed:--}" >> "$RUNS"
  echo "$(date -u +%H:%M:%S) ${module} rc=${rc} ${secs}s ${failed:--}"
done
echo "$(date -u +%H:%M:%S) batch done"
