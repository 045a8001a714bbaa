#!/usr/bin/env bash
# SGLang 0.5.15's CPU engine here, with no GPU: the legacy code paths of deltaserve_sglang (0.5.15's internals: the
# running batch on the scheduler, decoder layers taking the residual, ranks as Scheduler arguments) under the same
# tests CI runs against 0.5.23. Not CI: a developer's check before a GPU run (issue #18).
#
# usage: bash scripts/test_sglang_0515_cpu.sh [pytest args]   (default: tests/sglang/test_sglang_host.py -q)
# Uses .venv-sglang (scripts/setup_sglang.sh) for everything but SGLang itself: sglang 0.5.15's wheel, transformers
# 5.12.1 and tokenizers 0.22.2 (0.5.15's pins) are unpacked into /tmp/sglang-0515 and put first on PYTHONPATH;
# tests/sglang/legacy_cpu stands in for flashinfer (imported at import time, unused on the CPU). The installed
# distribution metadata still says 0.5.23; deltaserve_sglang picks its code path from the internals' shapes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_VENV:-.venv-sglang}
DIR=${SGLANG_0515_DIR:-/tmp/sglang-0515}
if [ ! -f "$DIR/.done" ]; then
  rm -rf "$DIR"; mkdir -p "$DIR/w" "$DIR/site"
  PLAT=""
  for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64; do PLAT="$PLAT --platform $p"; done
  "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
    -d "$DIR/w" sglang==0.5.15 transformers==5.12.1 tokenizers==0.22.2
  # the sglang wheel is cp312-only for its gRPC extension, which the CPU engine does not load: its Python files serve 3.11
  for w in "$DIR"/w/*.whl; do (cd "$DIR/site" && python3 -m zipfile -e "$w" .); done
  touch "$DIR/.done"
fi
[ $# -gt 0 ] || set -- tests/sglang/test_sglang_host.py -q
OMP_NUM_THREADS=1 PYTHONPATH="$DIR/site:$PWD/tests/sglang/legacy_cpu:$PWD/src:$PWD/conformance:$PWD/tests/sglang/shims" \
  "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
