#!/usr/bin/env bash
# Issue #21 on one H200: two vLLM replicas (two engine processes, each with its own CoServer and backward process,
# 0.3 of the GPU's memory each) co-serve one fine-tuning job over a Llama-3.2-1B-shaped model with random bf16
# weights, meeting only through the job's store; their adapter is compared with plain PEFT on the union of each
# global step's samples (tests/test_data_parallel_engines.py, the module CI runs with two reference hosts on CPU).
# Writes $OUT/data_parallel_engines.txt. Prerequisite: the vLLM wheel bundle installed (vllm_h200.sh's header).
# Run from the repository root; ~4 min on a fresh machine (model build, two engine starts, two epochs, two replays).
set -uo pipefail
OUT=${OUT:-benchmarks/results/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} VLLM_NO_USAGE_STATS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
{ echo "commit ${DELTASERVE_COMMIT:-unknown}"; python3 -c "import torch, importlib.metadata as m; \
print('vllm', m.version('vllm'), 'torch', torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/data_parallel_env.txt" 2>&1
DELTASERVE_DP_ENGINE=vllm DELTASERVE_DP_DEVICE=cuda DELTASERVE_DP_DTYPE=bfloat16 DELTASERVE_DP_SHAPE=1b \
  timeout "${T_RUN:-540}" python3 -m pytest tests/test_data_parallel_engines.py -v -s -p no:cacheprovider -rA 2>&1 \
  | grep -v -E "environ\(|Loading weights" > "$OUT/data_parallel_engines.txt"
grep -E "two engine processes|passed|failed|Error" "$OUT/data_parallel_engines.txt" | tail -12
