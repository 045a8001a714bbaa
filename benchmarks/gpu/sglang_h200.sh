#!/usr/bin/env bash
# deltaserve_sglang on CUDA SGLang 0.5.15, one H100/H200, bf16 (issue #18): `deltaserve conformance sglang`, the
# adapter's own module (per-step graph/eager log, captures against PEFT), and the exactness test through the
# engine (tests/sglang/test_coserve_sglang.py). Writes at most 8 files to $OUT (one folder, no subfolders).
#
# Prerequisite, here: bash benchmarks/gpu/prepare_sglang_h200.sh (-> .whl-sgl/p1, .whl-sgl/p2: 71 MiB, 2 parts).
# Device calls, back to back (the machine stays warm 30 s after a call; a cold one starts bare):
#   1. carry [".whl-sgl/p1"]   command: mkdir -p /tmp/sgl-wheels && cp .whl-sgl/p1/* /tmp/sgl-wheels/ && ls -la /tmp/sgl-wheels
#   2. carry [".whl-sgl/p2"]   command: DELTASERVE_COMMIT=<sha> bash benchmarks/gpu/sglang_h200.sh      (timeout_s 600)
#   (3. if a stage was skipped for time: carry [] on the still-warm machine, command
#       RUN="host" DELTASERVE_COMMIT=<sha> bash benchmarks/gpu/sglang_h200.sh -- the bundle stays installed in /tmp)
# The script installs the bundle (source .whl-sgl/pN/device-install.sh, ~15 s), installs this checkout --no-deps,
# then runs the stages below, each under its own timeout and skipped when too little of BUDGET is left, so the call
# ends inside its limit with whatever finished written to $OUT.
# Stages (stage name -> file): env -> sglang_cuda_env.json; import -> (in the env file); conformance ->
# conformance_sglang_cuda_bf16.txt (+ conformance_sglang_cuda_bf16.xml); host module -> test_sglang_host_cuda_bf16.txt
# + sglang_cuda_bf16_steps.json; exactness -> test_coserve_sglang_cuda_bf16.txt; summary -> sglang_h200_summary.json.
set -uo pipefail
OUT=${OUT:-benchmarks/results/h200}
BUDGET=${BUDGET:-570}   # seconds this script may take in all (the call's limit is 600)
T_CONF=${T_CONF:-200}; T_HOST=${T_HOST:-190}; T_EXACT=${T_EXACT:-170}
# host options for every stage, "key=value,key=value" (src/deltaserve_sglang/host.py), e.g. if SGLang's prefill graphs
# fail with LoRA: OPTIONS=cuda_graph_backend_prefill=disabled
OPTIONS=${OPTIONS:-}
export DELTASERVE_SGLANG_OPTIONS=$OPTIONS
OPTARGS=()
IFS=, read -ra _kv <<< "$OPTIONS"; for kv in "${_kv[@]}"; do [ -n "$kv" ] && OPTARGS+=(--option "$kv"); done
RUN=${RUN:-"conformance exactness host"}   # the stages to run (a later call on the warm machine can run the rest)
want() { case " $RUN " in *" $1 "*) return 0 ;; esac; return 1; }
DTYPE=${DTYPE:-bfloat16}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SGLANG_DISABLE_REQUEST_LOGGING=1
PART=$(ls -d .whl-sgl/p* 2>/dev/null | sort -V | tail -1)
if [ -n "$PART" ] && [ -f "$PART/device-install.sh" ]; then
  source "$PART/device-install.sh" || exit 1
elif [ -f /tmp/sglang-site/.installed ]; then
  export PYTHONPATH=/tmp/sglang-site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
else
  echo "no SGLang bundle: carry .whl-sgl/p1 in one call and the last part in this one (header)"; exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 \
  || python3 -m pip install -q --no-deps --no-build-isolation --no-index . || exit 1
left() { echo $((BUDGET - SECONDS)); }
# (0) versions, date, commit, and whether SGLang's scheduler imports at all (the first thing a missing wheel breaks)
python3 - "$OUT/sglang_cuda_env.json" <<'PY' 2>&1 | tail -20
import importlib.metadata as m, json, os, sys, time, traceback
info = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": os.environ.get("DELTASERVE_COMMIT", "unknown")}
for d in ("sglang", "sglang-kernel", "flashinfer-python", "transformers", "tokenizers", "torch", "triton", "peft", "deltaserve"):
    try:
        info[d] = m.version(d)
    except m.PackageNotFoundError:
        info[d] = None
import torch
info["cuda"] = torch.version.cuda
info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
t = time.time()
try:
    import sglang.srt.managers.scheduler  # noqa: F401
    from deltaserve_sglang.versions import check_hook_shapes, check_supported_sglang
    check_supported_sglang()
    info["legacy_shapes"] = check_hook_shapes()
    info["import"] = "ok"
except Exception:
    info["import"] = traceback.format_exc(limit=-4)
info["import_s"] = round(time.time() - t, 1)
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info, indent=1))
PY
grep -q '"import": "ok"' "$OUT/sglang_cuda_env.json" || { echo "SGLang does not import: see $OUT/sglang_cuda_env.json"; exit 1; }
status() {  # name, exit code, log
  echo "{\"stage\": \"$1\", \"rc\": $2, \"seconds\": $3, \"tail\": $(tail -3 "$4" 2>/dev/null | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}"
}
STAGES=()
# (1) the conformance suite, bf16, SGLang's CUDA defaults (decode + prefill graphs) for inference-only steps
if want conformance && [ "$(left)" -gt 90 ]; then
  t0=$SECONDS
  timeout $(( $(left) < T_CONF ? $(left) : T_CONF )) deltaserve conformance sglang --device cuda --dtype "$DTYPE" "${OPTARGS[@]}" -v \
    -- --junitxml="$OUT/conformance_sglang_cuda_bf16.xml" > "$OUT/conformance_sglang_cuda_bf16.txt" 2>&1
  rc=$?; STAGES+=("$(status conformance $rc $((SECONDS - t0)) "$OUT/conformance_sglang_cuda_bf16.txt")")
  grep -E "FAILED|ERROR|passed|failed" "$OUT/conformance_sglang_cuda_bf16.txt" | tail -8
fi
# (2) the exactness test through the engine (train on the GPU, compare with fp32 PEFT on the CPU) and the other
#     end-to-end co-serving tests (client outputs unchanged, no row reaches a client, loss decreases, crash recovery)
if want exactness && [ "$(left)" -gt 90 ]; then
  t0=$SECONDS
  DELTASERVE_SGLANG_DEVICE=cuda DELTASERVE_SGLANG_DTYPE="$DTYPE" \
    timeout $(( $(left) < T_EXACT ? $(left) : T_EXACT )) python3 -m pytest tests/sglang/test_coserve_sglang.py -v -s \
    -p no:cacheprovider -rs > "$OUT/test_coserve_sglang_cuda_bf16.txt" 2>&1
  rc=$?; STAGES+=("$(status exactness $rc $((SECONDS - t0)) "$OUT/test_coserve_sglang_cuda_bf16.txt")")
  grep -E "exactness |FAILED|ERROR|passed|failed" "$OUT/test_coserve_sglang_cuda_bf16.txt" | tail -8
fi
# (3) the adapter's own module on CUDA: the suite again plus the per-step graph/eager log, decode/mixed joins with
#     captures against PEFT, radix cache, abort
if want host && [ "$(left)" -gt 90 ]; then
  t0=$SECONDS
  DELTASERVE_SGLANG_DEVICE=cuda DELTASERVE_SGLANG_DTYPE="$DTYPE" DELTASERVE_STEP_LOG="$OUT/sglang_cuda_bf16_steps.json" \
    timeout $(( $(left) < T_HOST ? $(left) : T_HOST )) python3 -m pytest tests/sglang/test_sglang_host.py -v -s \
    -p no:cacheprovider -rs -k "not TestSglangConformance" > "$OUT/test_sglang_host_cuda_bf16.txt" 2>&1
  rc=$?; STAGES+=("$(status host_module $rc $((SECONDS - t0)) "$OUT/test_sglang_host_cuda_bf16.txt")")
  grep -E "FAILED|ERROR|passed|failed" "$OUT/test_sglang_host_cuda_bf16.txt" | tail -8
fi
( IFS=,; echo "{\"total_s\": $SECONDS, \"stages\": [${STAGES[*]}]}" ) > "$OUT/sglang_h200_summary.json"
cat "$OUT/sglang_h200_summary.json"
