#!/usr/bin/env bash
# `deltaserve bench` on one H200 with CUDA vLLM 0.26.0 and a Llama-3-8B-shaped model with random bf16 weights (no
# checkpoint is reachable there; random weights run at the speed of real ones -- say so wherever these figures go).
# Writes benchmarks/results/bench/bench_vllm_llama8b-shape_<trace>.{json,csv,png}.
#
# Prerequisites:
#   here:  bash benchmarks/gpu/prepare_bench_h200.sh          (makes .whl/x: tokenizer, lengths.csv, Alpaca set)
#          and the vLLM wheels as in ../shared/tools/vllm-gpu/README.md (.whl/p1..p5: each part travels with the working tree under the 64 MiB limit; p1..p4 in short calls)
#   there: last call with carry=[".whl/p5", ".whl/x"]:
#          source .whl/p5/device-install.sh && bash benchmarks/gpu/bench_h200.sh
# Budget: ~8 min on a fresh machine (vLLM's first start compiles Triton kernels ~90 s; building the 16 GB model ~1 min;
# calibration ~1 min; 6 systems x (20 s trace + ~15 s start-up)). TRACE, DURATION, T_BENCH override the defaults.
#
# Systems as on CPU. The split pool runs its trainer under MPS at SPLIT_MPS % of the SMs (the MPS daemon is started
# here, before any CUDA context, so vLLM, the backward process and the trainer are all MPS clients -- DeltaServe's own
# backward runs under MPS by design). vLLM gets GPU_UTIL of the memory so the backward process (which shares the base
# weights through CUDA IPC) and the split-pool trainer (its own 16 GB copy) fit beside it.
set -uo pipefail
OUT=${OUT:-benchmarks/results/bench}
TRACE=${TRACE:-burst-light}
DURATION=${DURATION:-20}
SPLIT_MPS=${SPLIT_MPS:-25}
GPU_UTIL=${GPU_UTIL:-0.45}
BWD_TOKENS=${BWD_TOKENS:-256}     # tokens per optimizer step, every fine-tuning system alike
BUFFER=${BUFFER:-2048}            # activation buffer S_max
NAME=${NAME:-bench_vllm_llama8b-shape_$TRACE}
MODEL=${MODEL:-/tmp/llama8b-shape}
X=${X:-.whl/x}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} VLLM_NO_USAGE_STATS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1

# (1) the model folder: Llama-3-8B shape, random weights (seeded), bf16, the carried tokenizer
if [ ! -f "$MODEL/model.safetensors.index.json" ] && [ ! -f "$MODEL/model.safetensors" ]; then
  timeout 300 python3 - "$MODEL" "$X/tokenizer" <<'PY' || exit 1
import shutil, sys, time, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out, tok = Path(sys.argv[1]), Path(sys.argv[2])
t = time.time()
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
for f in tok.iterdir():
    shutil.copy(f, out / f.name)
print(f"built {out} in {time.time() - t:.0f} s")
PY
fi

# (2) MPS for the split pool (and the backward process)
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d 2>/dev/null || echo "MPS daemon already running or unavailable"

# (3) the benchmark: every system, same arrivals, one run. SLOs: the paper's A100 figures (400 ms / 120 ms).
timeout ${T_BENCH:-560} deltaserve bench --host vllm --model "$MODEL" --device cuda --dtype bfloat16 \
  --trace "$TRACE" --duration "$DURATION" --lengths "$X/lengths.csv" --dataset "$X/alpaca_en_demo.json" \
  --max-prompt 1024 --max-output 256 --max-running 64 --max-batch-tokens 8192 --ttft 0.4 --tpot 0.12 \
  --option gpu_memory_utilization=$GPU_UTIL --split-mps-percentage "$SPLIT_MPS" --dedicated 10 \
  --backward-batch-tokens "$BWD_TOKENS" --buffer-tokens "$BUFFER" --systems "${SYSTEMS:-all}" \
  --out "$OUT" --name "$NAME" --no-progress 2>&1 \
  | grep -v -E "Warning|warn\(|^\s*$" | tee "$OUT/$NAME.log" | tail -30
echo quit | nvidia-cuda-mps-control 2>/dev/null || true
