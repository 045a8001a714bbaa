#!/usr/bin/env bash
# Runs every proof, one at a time; prints "pNN rc seconds" and writes proofs/results.tsv.
cd "$(dirname "$0")"
B=$(cd .. && pwd)
: > results.tsv
for p in p[0-9][0-9].py; do
  t=$(date +%s.%N)
  OMP_NUM_THREADS=1 PYTHONPATH="$B:/work/wt-blind2/src:/work/wt-blind2/conformance" \
    timeout 120 /work/main/.venv/bin/python "$p" > "logs_${p%.py}.txt" 2>&1
  rc=$?
  s=$(python3 -c "import time;print(round(time.time()-$t,1))")
  echo -e "${p%.py}\t$rc\t$s" | tee -a results.tsv
done
