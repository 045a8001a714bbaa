#!/usr/bin/env bash
# The exact LoRA backward on one H200, Llama-3-8B shape (random bf16 weights: no checkpoint is reachable there; random
# weights run at the speed of trained ones), side by side with plain PEFT on the same batches:
# packed units (the default) vs one sample per unit vs transformers + PEFT, at the paper's 256-token optimizer step
# and at 2048 tokens; preemption/abort latency at 2048 (a packed unit is the preemption granularity).
# Writes $OUT/backward_throughput-llama8b-shape-cuda-{256,2048}.json.
#
# Needs only torch/transformers/peft (the machine's image has them): `bash benchmarks/gpu/backward_h200.sh`.
# Budget: ~4 min.
set -uo pipefail
OUT=${OUT:-benchmarks/results/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
timeout ${T_256:-150} python3 benchmarks/backward_throughput.py --model llama8b-shape --device cuda --dtype bfloat16 \
  --batch-tokens 256 --batches 8 --repeats 1 --skip-latency \
  --json "$OUT/backward_throughput-llama8b-shape-cuda-256.json" 2>&1 | grep -v -E "Warning|warn\(" | tail -3
timeout ${T_2048:-300} python3 benchmarks/backward_throughput.py --model llama8b-shape --device cuda --dtype bfloat16 \
  --batch-tokens 2048 --batches 3 --repeats 1 --trials 6 \
  --json "$OUT/backward_throughput-llama8b-shape-cuda-2048.json" 2>&1 | grep -v -E "Warning|warn\(" | tail -6
