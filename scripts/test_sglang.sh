#!/usr/bin/env bash
# Build .venv-sglang (scripts/setup_sglang.sh) and run the SGLang tests against SGLang's real CPU engine: the host
# tests with the conformance suite, the end-to-end co-serving tests, `deltaserve conformance sglang` through the
# CLI and the multi-process plugin smoke test. Each module starts one engine; modules run in separate pytest
# processes so that each gets a fresh process (SGLang keeps process-wide runtime state).
#
# Arguments as for scripts/test.sh (scripts/test_args.sh): options go to every pytest call; paths under
# tests/sglang pick the modules (or tests) to run, one process each; paths elsewhere are not this script's, and
# when only those are given nothing runs here. A -k/-m selection that leaves a module without tests is a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test_args.sh
split_test_args "$@"
if [[ $HAVE_PATHS == 1 && ${#SGLANG_PATHS[@]} == 0 ]]; then
  echo "test_sglang: no test path under tests/sglang given; the SGLang tests are not run"
  exit 0
fi
run bash scripts/setup_sglang.sh
export OMP_NUM_THREADS=1
export DELTASERVE_CACHE=${DELTASERVE_CACHE:-$PWD/.cache/deltaserve}
# Engine tests fail, rather than skip, when setup did not install their engine.
export DELTASERVE_REQUIRE_ENGINES=${DELTASERVE_REQUIRE_ENGINES:-1}
if [[ ${#SGLANG_PATHS[@]} == 0 ]]; then SGLANG_PATHS=(tests/sglang/test_*.py); fi
# One pytest process per module (SGLang keeps process-wide state: one engine per process), two at a time: each
# mostly waits on its single-threaded engine, so two use both cores. Each module's output is printed whole when it
# ends.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
i=0
for target in "${SGLANG_PATHS[@]}"; do
  while (( $(jobs -rp | wc -l) >= 2 )); do wait -n || true; done
  i=$((i + 1))
  ( rc=0
    run .venv-sglang/bin/python -m pytest "$target" -p no:cacheprovider -q ${TEST_OPTIONS[@]+"${TEST_OPTIONS[@]}"} \
      > "$logs/$i.log" 2>&1 || rc=$?
    echo "$rc" > "$logs/$i.rc"
    printf '=== %s (exit %s)\n' "$target" "$rc"; cat "$logs/$i.log" ) &
done
wait
status=0
for ((n = 1; n <= i; n++)); do
  pytest_ok "$(cat "$logs/$n.rc" 2>/dev/null || echo 1)" || status=1
done
exit $status
