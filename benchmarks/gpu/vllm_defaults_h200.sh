#!/usr/bin/env bash
# deltaserve_vllm on CUDA vLLM 0.26.0 under the settings vLLM ships with (issue #17): tests/test_vllm_host.py on one
# H200 in bf16 (the whole conformance suite, the adapter's own tests, the per-step graph/eager log and the exactness
# measurement through the engine), once per host-option set in RUNS, each writing $OUT/test_vllm_host_<label>.txt.
#
# Default RUNS: "default" (DeltaServe's defaults, vLLM's own: torch.compile + vLLM's CUDA-graph mode, async
# scheduling, the model runner vLLM picks), "sync" (async_scheduling=false) and "eager" (compile=false: eager kernels,
# full CUDA graphs for decodes only). Prerequisite:
# the vLLM wheel bundle installed (benchmarks/gpu/vllm_h200.sh's header). Run from the repository root; ~2 min a run.
#
# vLLM's model runner: a run whose label starts with "v2" exports VLLM_USE_V2_MODEL_RUNNER=1, one starting with "v1"
# exports 0, every other run leaves it unset (vLLM's choice, the host's default), e.g. RUNS="v2: v2async:async_scheduling=true v2eager:compile=false". The module's
# test_the_worker_follows_the_model_runner_vllm_built checks the worker really ran V2 (docs/vllm-adapter.md,
# "The V2 model runner").
set -uo pipefail
OUT=${OUT:-benchmarks/results/h200}
RUNS=${RUNS:-"default: sync:async_scheduling=false eager:compile=false"}
T_RUN=${T_RUN:-190}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} VLLM_NO_USAGE_STATS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "commit ${DELTASERVE_COMMIT:-unknown}" > "$OUT/vllm_defaults_env.txt"
python3 -c "import torch, importlib.metadata as m; print('vllm', m.version('vllm'), 'torch', torch.__version__)" \
  >> "$OUT/vllm_defaults_env.txt" 2>&1
for run in $RUNS; do
  label=${run%%:*}
  opts=${run#*:}
  case "$label" in v2*) runner=(VLLM_USE_V2_MODEL_RUNNER=1) ;; v1*) runner=(VLLM_USE_V2_MODEL_RUNNER=0) ;;
    *) runner=(-u VLLM_USE_V2_MODEL_RUNNER) ;; esac
  echo "[vllm_defaults] $label: options '${opts}', ${runner[*]}"
  env "${runner[@]}" DELTASERVE_VLLM_DEVICE=cuda DELTASERVE_VLLM_DTYPE=bfloat16 DELTASERVE_VLLM_OPTIONS="$opts" \
    DELTASERVE_STEP_LOG="$OUT/vllm_cuda_bf16_steps_$label.json" \
    timeout "$T_RUN" python3 -m pytest tests/test_vllm_host.py -v -s -p no:cacheprovider -rs 2>&1 \
    | grep -v "environ(" > "$OUT/test_vllm_host_$label.txt"
  grep -E "FAILED|ERROR|exactness |passed|failed" "$OUT/test_vllm_host_$label.txt" | tail -12
done
