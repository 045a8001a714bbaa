#!/usr/bin/env bash
# Reruns the batch with the suite of the issue-#15 worktree (after the six misses were fixed), into runs_after.tsv
# and logs_after/; runs.tsv and logs/ stay the blind result. Usage: ./run_batch_after.sh [hNN_name ...]
cd "$(dirname "$0")" && WT=${WT:-/work/wt-misses} RUNS=runs_after.tsv LOGS=logs_after exec ./run_batch.sh "$@"
