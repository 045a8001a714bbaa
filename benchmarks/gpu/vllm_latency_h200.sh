#!/usr/bin/env bash
# The latency model's held-out error through real vLLM 0.26 on one H200, per execution mode (CUDA graphs for decode,
# eager for everything else, including every step that carries fine-tuning rows): a 1B-parameter Llama shape
# (16 layers, hidden 2048, random bf16 weights -- no checkpoint can be fetched on that machine; random weights time
# the same as trained ones), bf16, vLLM's default async scheduling (AsyncDeltaServeScheduler).
#
# Prerequisite: vllm==0.26.0 installed on the GPU machine (../shared/tools/vllm-gpu: carry .whl/p1..p4 in
# back-to-back calls, then `source .whl/p5/device-install.sh && bash benchmarks/gpu/vllm_latency_h200.sh`).
# Run from the repository root; OUT defaults to benchmarks/results/h200.
set -uo pipefail
OUT=${OUT:-benchmarks/results/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} VLLM_NO_USAGE_STATS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
MODEL=${MODEL:-/tmp/m1b}
[ -d "$MODEL" ] || python3 -c "import sys, torch; from deltaserve_core.testing.tiny_model import build_tiny_llama as b; b(sys.argv[1], num_layers=16, hidden_size=2048, num_heads=16, num_kv_heads=8, intermediate_size=5632, vocab_size=512, max_position_embeddings=8192, dtype=torch.bfloat16)" "$MODEL"
timeout ${T_LAT:-540} python3 benchmarks/latency_model.py --host vllm --model "$MODEL" --device cuda --dtype bfloat16 \
  --json "$OUT/latency_model_vllm_1b-shape_cuda.json" --no-progress --max-prefill 2048 --max-decode 64 --max-kv 4096 \
  ${LAT_ARGS:-} 2>&1 | grep -v "WARNING\|INFO\|Warning\|warn(" | tail -30
