#!/usr/bin/env bash
# Build .venv-sglang (scripts/setup_sglang.sh) and run the SGLang tests against SGLang's real CPU engine: the host
# tests with the conformance suite, the end-to-end co-serving tests, `deltaserve conformance sglang` through the
# CLI and the multi-process plugin smoke test. Each module starts one engine; modules run in separate pytest
# processes so that each gets a fresh process (SGLang keeps process-wide runtime state).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_sglang.sh
export OMP_NUM_THREADS=1
export DELTASERVE_CACHE=${DELTASERVE_CACHE:-$PWD/.cache/deltaserve}
# Engine tests fail, rather than skip, when setup did not install their engine.
export DELTASERVE_REQUIRE_ENGINES=${DELTASERVE_REQUIRE_ENGINES:-1}
status=0
for module in tests/sglang/test_*.py; do
  .venv-sglang/bin/python -m pytest "$module" -p no:cacheprovider -q "$@" || status=1
done
exit $status
