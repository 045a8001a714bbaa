#!/usr/bin/env bash
# The H200 figures for the reference host (benchmarks/results/h200/): conformance on CUDA in fp32 and bf16, and the
# latency model's held-out error on a 1B-parameter Llama shape (16 layers, hidden 2048, random bf16 weights: no
# checkpoint can be fetched there; random weights time the same as trained ones).
# Run on a CUDA machine from the repository root (the GPU image already has torch, transformers, peft, scipy,
# scikit-learn, pytest); OUT defaults to benchmarks/results/h200.
set -euo pipefail
OUT=${OUT:-benchmarks/results/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc}
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
deltaserve conformance reference --device cuda -v | tee "$OUT/conformance_reference_cuda_fp32.txt" | tail -1
deltaserve conformance reference --device cuda --dtype bfloat16 -v | tee "$OUT/conformance_reference_cuda_bf16.txt" | tail -1
MODEL=${MODEL:-/tmp/m1b}
python3 -c "import sys, torch; from deltaserve_core.testing.tiny_model import build_tiny_llama as b; b(sys.argv[1], num_layers=16, hidden_size=2048, num_heads=16, num_kv_heads=8, intermediate_size=5632, vocab_size=512, max_position_embeddings=8192, dtype=torch.bfloat16)" "$MODEL"
python3 benchmarks/latency_model.py --host reference --model "$MODEL" --device cuda --dtype bfloat16 \
  --json "$OUT/latency_model_reference_1b-shape_cuda.json" --no-progress --max-prefill 2048 --max-decode 64 --max-kv 4096
