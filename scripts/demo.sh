#!/usr/bin/env bash
# Set up .venv and run the co-serving demo (default: reference host, SmolLM2-135M-Instruct, Alpaca demo data).
# Extra arguments go to `deltaserve demo` (e.g. --model tiny --duration 30).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
exec .venv/bin/deltaserve demo "$@"
