# Sourced by scripts/test.sh, scripts/test_sglang.sh and scripts/test_vllm_low.sh: how their pytest arguments are
# shared out.
#
# split_test_args ARGS... sets
#   TEST_OPTIONS   every argument that is not a test path: -k EXPR, -m MARK, -x, -v, ... (all pytest calls get them)
#   MAIN_PATHS     test paths outside tests/sglang (the main environment's pytest)
#   SGLANG_PATHS   test paths under tests/sglang (.venv-sglang's pytest, one process each)
#   VLLM_LOW_PATHS the MAIN_PATHS that are vLLM tests (tests/test_vllm_*.py, tests/test_coserve_vllm.py): the ones
#                  scripts/test_vllm_low.sh runs again against the oldest supported vLLM (.venv-vllm-low)
#   HAVE_PATHS     1 when any test path was given: then a part with no path of its own is skipped
# A test path is an argument that starts with tests/ or conformance/ or ends in .py (a ::node suffix allowed). By
# that rule an option's value is never taken for a path unless it looks like one (-k test_x.py would be).
# run CMD...          runs CMD, or prints it when DELTASERVE_TEST_PLAN=1 (what the scripts would run, for tests)
# pytest_ok RC        whether pytest's status RC is a pass: 0, or 5 (nothing collected) when -k/-m/--deselect
#                     was given, since a selection may leave a module without tests

split_test_args() {
  TEST_OPTIONS=() MAIN_PATHS=() SGLANG_PATHS=() VLLM_LOW_PATHS=() HAVE_PATHS=0
  local arg file
  for arg in "$@"; do
    file=${arg%%::*}
    if [[ $file == tests/* || $file == conformance/* || $file == *.py ]]; then
      HAVE_PATHS=1
      if [[ ${file#./} == tests/sglang* ]]; then SGLANG_PATHS+=("$arg"); else MAIN_PATHS+=("$arg"); fi
      if [[ ${file#./} == tests/test_vllm_*.py || ${file#./} == tests/test_coserve_vllm.py ]]; then
        VLLM_LOW_PATHS+=("$arg")
      fi
    else
      TEST_OPTIONS+=("$arg")
    fi
  done
}

run() {
  if [[ ${DELTASERVE_TEST_PLAN:-0} == 1 ]]; then
    printf 'plan:'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

pytest_ok() {
  local rc=$1 opt
  [[ $rc == 0 ]] && return 0
  [[ $rc == 5 ]] || return 1
  for opt in ${TEST_OPTIONS[@]+"${TEST_OPTIONS[@]}"}; do
    [[ $opt == -k* || $opt == -m* || $opt == --deselect* ]] && return 0
  done
  return 1
}
