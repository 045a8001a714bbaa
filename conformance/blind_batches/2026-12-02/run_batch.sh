#!/usr/bin/env bash
# Run the conformance suite against every host of this blind batch, one at a time (2-5 min each on 2 cores), and
# append "host rc seconds failed-checks" lines to runs.tsv here (rc 1 with checks named: caught; rc 0: missed). Usage, from the repo root:
#   bash conformance/blind_batches/2026-12-02/run_batch.sh [h01 h07 ...]   (default: every host)
set -u
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1 DELTASERVE_CACHE=${DELTASERVE_CACHE:-$PWD/.cache/deltaserve} PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$here/logs"
hosts=("$@")
[ ${#hosts[@]} -eq 0 ] && hosts=($(cd "$here/blindhosts" && ls h[0-9]*.py | sed 's/\.py$//'))
for h in "${hosts[@]}"; do
  m=$(cd "$here/blindhosts" && ls ${h}*.py | head -1 | sed 's/\.py$//')
  t0=$(date +%s)
  "$py" -m deltaserve_core.cli conformance "blindhosts.$m:Host" -- -q > "$here/logs/$m.txt" 2>&1
  rc=$?
  # the checks that failed, by name (rc 0: the suite passed the host, a miss)
  summ=$(grep -oE "AssertionError: \[[a-z_]+\]" "$here/logs/$m.txt" | sort -u | sed 's/AssertionError: //' | tr '\n' ' ')
  printf "%s\t%s\t%s\t%s\n" "$m" "$rc" "$(( $(date +%s) - t0 ))" "$summ" | tee -a "$here/runs.tsv"
done
