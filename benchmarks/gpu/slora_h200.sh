#!/usr/bin/env bash
# deltaserve_slora on stock S-LoRA, one CUDA GPU (H200 here): build a trimmed copy of S-LoRA, run
# `deltaserve conformance slora` (fp16) and tests/test_slora_gpu.py (patch record, outputs vs. stock S-LoRA, the
# operator path `python -m deltaserve_slora.launch` over S-LoRA's HTTP API against its plain server,
# exactness through the engine), write the JSON summary.
#
#   SLORA_SRC=/path/to/S-LoRA  [SLORA_WHEELS=dir-of-wheels] [SLORA_KERNELS=prebuilt _kernels*.so] \
#   [OUT=benchmarks/results] bash benchmarks/gpu/slora_h200.sh
#
# The user's checkout is never edited: it is copied to $BUILD (default /tmp/slora-build) and only the copy's bgmv
# kernel table (slora/csrc/bgmv/bgmv_config.h) is cut to the widths/ranks tested (hidden 128; ranks 8, 16: the
# conformance tiny Llama and its adapters); the full table instantiates 440 kernels (>10 min to build).
# SLORA_WHEELS: wheels of S-LoRA's pure-Python needs missing on the machine (rpyc, plumbum, pyzmq; for its API
# server, which the operator-path test starts: fastapi, starlette, uvicorn, pydantic, pydantic-core,
# annotated-types, typing-inspection, typing-extensions), installed to /tmp/site. SLORA_COMMIT names the S-LoRA
# commit in the JSON when the source has no git metadata.
# A partial run (SLORA_CONFORMANCE=0, SLORA_PYTEST_ARGS selecting tests, e.g. "-k operator_path") skips the
# conformance suite and the JSON summary. SLORA_CONFORMANCE_ARGS: pytest arguments for the conformance suite (default
# none: the whole suite, every abort check included now that the host declares supports_abort); a selection, e.g.
# SLORA_CONFORMANCE_ARGS='-k "abort or layer_input_arrives or stateful"', also skips the JSON summary.
# SLORA_REPRO=1 builds, runs benchmarks/gpu/slora_repro.py only, and exits.
#
# On the borrowed GPU (see ../shared/tools/slora-gpu/README.md for preparing .slora: the S-LoRA source by
# `git archive` into .slora/src, the wheels S-LoRA needs into .slora/whl), a `run` call with carry [".slora"]:
#   SLORA_SRC=.slora/src SLORA_WHEELS=.slora/whl SLORA_COMMIT=c1ddf48 T_CONF=300 T_TEST=330 \
#     DELTASERVE_COMMIT=$(git rev-parse --short HEAD) OUT=$OUT/slora bash benchmarks/gpu/slora_h200.sh
set -uo pipefail
SLORA_SRC=${SLORA_SRC:?set SLORA_SRC to an S-LoRA checkout}
OUT=${OUT:-benchmarks/results}
BUILD=${BUILD:-/tmp/slora-build}
WIDTHS=${SLORA_WIDTHS:-128}
RANKS=${SLORA_RANKS:-8 16}
mkdir -p "$OUT/slora_logs"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc}
if [ -n "${SLORA_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$SLORA_WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || export PYTHONPATH=$PWD/src:$PWD/conformance:${PYTHONPATH:-}

rm -rf "$BUILD" && mkdir -p "$BUILD" && cp -r "$SLORA_SRC"/. "$BUILD"/
python3 - "$BUILD/slora/csrc/bgmv/bgmv_config.h" "$WIDTHS" "$RANKS" <<'PY'
import re, sys
path, widths, ranks = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
src = open(path).read()
wide = "#define FOR_BGMV_WIDE(f, T, narrow) \\\n" + "".join(f"    f(T, narrow, {w}) \\\n" for w in widths) + "\n"
narrow = "#define FOR_BGMV_WIDE_NARROW(f, T) \\\n" + "".join(f"    FOR_BGMV_WIDE(f, T, {r}) \\\n" for r in ranks) + "\n"
src = re.sub(r"#define FOR_BGMV_WIDE\(f, T, narrow\).*?\n\n", wide, src, flags=re.S)
src = re.sub(r"#define FOR_BGMV_WIDE_NARROW\(f, T\).*?\n\n", narrow, src, flags=re.S)
open(path, "w").write(src)
PY
if [ -n "${SLORA_KERNELS:-}" ]; then
  cp "$SLORA_KERNELS" "$BUILD/slora/"
else
  t0=$(date +%s)
  (cd "$BUILD" && TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} python3 setup.py build_ext --inplace) \
    > "$OUT/slora_logs/build.txt" 2>&1 || { tail -30 "$OUT/slora_logs/build.txt"; exit 1; }
  echo "built S-LoRA kernels in $(( $(date +%s) - t0 )) s"
fi
export DELTASERVE_SLORA_PATH="$BUILD"

if [ "${SLORA_REPRO:-0}" = 1 ]; then  # only the replay of the 2026-12-02 conformance failure (slora_repro.py)
  timeout ${T_REPRO:-300} python3 benchmarks/gpu/slora_repro.py --stock-offload 2>&1 | tee "$OUT/slora_logs/repro.txt"
  exit "${PIPESTATUS[0]}"
fi

if [ "${SLORA_CONFORMANCE:-1}" = 1 ]; then
eval "conf_args=(${SLORA_CONFORMANCE_ARGS:-})"  # a list of pytest arguments, shell-quoted (a -k expression)
timeout ${T_CONF:-240} deltaserve conformance slora --device cuda --dtype float16 -v -- -p no:cacheprovider \
  --junitxml="$OUT/slora_logs/conformance.xml" "${conf_args[@]}" 2>&1 | tee "$OUT/slora_logs/conformance.txt" | tail -25
fi
# shellcheck disable=SC2086  # SLORA_PYTEST_ARGS is a list of pytest arguments
timeout ${T_TEST:-420} python3 -m pytest tests/test_slora_gpu.py ${SLORA_PYTEST_ARGS:-} -v -s -p no:cacheprovider -rs \
  --junitxml="$OUT/slora_logs/gpu_tests.xml" 2>&1 | tee "$OUT/slora_logs/gpu_tests.txt" \
  | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|adapter after|bug reproduced|Error" | tail -40
# the operator-path test's server logs (launcher, stock server, calibration), kept for reading
find /tmp/pytest-of-*/ -path "*slora-operator*" -name "*.log" -exec cp --backup=numbered {} "$OUT/slora_logs/" \; 2>/dev/null
[ "${SLORA_CONFORMANCE:-1}" = 1 ] && [ -z "${SLORA_CONFORMANCE_ARGS:-}" ] || exit 0
python3 benchmarks/gpu/slora_results.py --logs "$OUT/slora_logs" --slora "$BUILD" --out "$OUT/slora_h200.json"
