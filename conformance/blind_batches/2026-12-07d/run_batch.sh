#!/usr/bin/env bash
# Run the conformance suite against each blind host (all, or the ones named: h01 h07 ...), one at a time.
# Appends host<TAB>rc<TAB>seconds<TAB>failed_checks to runs_suite_${SUITE:-unset}.tsv (rc 1 = caught, 0 = missed); logs in logs_suite_${SUITE:-unset}/.
set -u
B=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$B/../../.." && pwd)
cd "$B"
mkdir -p logs_suite_${SUITE:-unset}
[ -f runs_suite_${SUITE:-unset}.tsv ] || printf 'host\trc\tseconds\tfailed_checks\n' > runs_suite_${SUITE:-unset}.tsv
if [ $# -gt 0 ]; then
  modules=()
  for h in "$@"; do modules+=($(cd blindhosts && ls ${h}_*.py | sed 's/\.py$//')); done
else
  modules=($(cd blindhosts && ls h[0-9][0-9]_*.py | sed 's/\.py$//'))
fi
for module in "${modules[@]}"; do
  t0=$(date +%s)
  OMP_NUM_THREADS=1 DELTASERVE_CACHE="$R/.cache/deltaserve" PYTHONPATH="$B:$R/src:$R/conformance" "$R/.venv/bin/python" -m deltaserve_core.cli conformance "blindhosts.${module}:Host" -- -q > logs_suite_${SUITE:-unset}/${module}.txt 2>&1
  rc=$?
  t1=$(date +%s)
  failed=$(grep -oE "AssertionError: \[[a-z_]+\]" logs_suite_${SUITE:-unset}/${module}.txt | sed -E 's/AssertionError: \[([a-z_]+)\]/\1/' | sort -u | paste -sd, -)
  printf '%s\t%s\t%s\t%s\n' "${module}" "$rc" "$((t1 - t0))" "${failed:-}" >> runs_suite_${SUITE:-unset}.tsv
  echo "${module} rc=$rc ${failed:-}"
done
