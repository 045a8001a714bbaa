#!/usr/bin/env bash
# Run every proof (or the ones named: p01 p07 ...) one at a time; results in results.tsv, logs in logs_pNN.txt.
set -u
cd "$(dirname "$0")"
PY=${PY:-/work/main/.venv/bin/python}
SRC=${SRC:-$(cd ../../../../src && pwd)}
export OMP_NUM_THREADS=1 PYTHONPATH="$SRC:$(cd "$SRC/../conformance" && pwd):$(cd .. && pwd)" BLIND_CACHE=${BLIND_CACHE:-/tmp/deltaserve-blind-cache12}
proofs=("$@"); [ ${#proofs[@]} -eq 0 ] && proofs=($(ls p[0-9][0-9].py | sed 's/\.py$//'))
[ -f results.tsv ] || printf 'proof\trc\tseconds\tverdict\n' > results.tsv
for p in "${proofs[@]}"; do
  t0=$(date +%s.%N)
  "$PY" "$p.py" > "logs_$p.txt" 2>&1; rc=$?
  t1=$(date +%s.%N)
  v=$(grep -E "^\[$p\] (proof holds|proof does NOT hold)" "logs_$p.txt" | tail -1)
  grep -v "^$p	" results.tsv > results.tsv.tmp; mv results.tsv.tmp results.tsv
  printf '%s\t%s\t%.1f\t%s\n' "$p" "$rc" "$(echo "$t1 - $t0" | bc)" "${v:-no verdict}" >> results.tsv
  echo "$p rc=$rc ${v:-no verdict}"
done
