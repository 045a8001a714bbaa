"""One fine-tuning job over two data-parallel ranks that live in two engine processes, as two replicas of a real
deployment do: each process runs its own host (engine), CoServer (admission, buffer) and backward process, and the
ranks meet only through the job's store (deltaserve_core.data_parallel).

The job trains two epochs while both replicas also serve client requests. Checked: every sample is trained once per
epoch by one rank or the other, both ranks saw the same global steps and end on the same adapter bit for bit, and
that adapter is the plain transformers + PEFT + AdamW loop over the union of each global step's samples: within 1e-4
in fp32, within the dtype's own noise otherwise (the update is as close to fp32 PEFT as plain PEFT's own update in
that dtype is: test_coserve.assert_within_precision).

CI runs it on CPU with the reference host. On a GPU, the same test puts two vLLM replicas on one GPU (issue #21's
single-GPU run): ``DELTASERVE_DP_ENGINE=vllm DELTASERVE_DP_DEVICE=cuda DELTASERVE_DP_DTYPE=bfloat16
DELTASERVE_DP_SHAPE=1b`` (a Llama-3.2-1B-shaped model with random weights; ``benchmarks/gpu/data_parallel_h200.sh``).
The replicas split the GPU's memory (``DELTASERVE_DP_GPU_SHARE`` each) and start one after the other, so that each
engine's memory profiling sees a quiet device.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import multiprocessing
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from deltaserve_core.job_config import JobConfig
from test_data_parallel import _free_port, _two_rank_job  # noqa: E402  (tests/ is on sys.path)

pytestmark = pytest.mark.data_parallel

ENGINE = os.environ.get("DELTASERVE_DP_ENGINE", "reference")
DEVICE = os.environ.get("DELTASERVE_DP_DEVICE", "cpu")
DTYPE = os.environ.get("DELTASERVE_DP_DTYPE", "float32")
SHAPE = os.environ.get("DELTASERVE_DP_SHAPE", "tiny")
GPU_SHARE = float(os.environ.get("DELTASERVE_DP_GPU_SHARE", "0.3"))
#: seconds a rank may take from its host's start to the job's end (a 1B model's engine start and compile included)
RANK_TIMEOUT_S = float(os.environ.get("DELTASERVE_DP_TIMEOUT", "240" if DEVICE == "cpu" else "480"))

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("DELTASERVE_DP_DEVICE=cuda needs a CUDA GPU", allow_module_level=True)

def _model_dir(cache: Path) -> Path:
    from deltaserve_core.testing.tiny_model import build_tiny_llama

    if SHAPE == "tiny":
        return build_tiny_llama(cache / "conformance" / "tiny-llama")
    if SHAPE == "1b":  # Llama-3.2-1B's shape: 16 layers, hidden 2048, 32 heads / 8 KV, tied head, 128256 rows
        return build_tiny_llama(cache / "llama1b-shape", num_layers=16, hidden_size=2048, num_heads=32,
                                num_kv_heads=8, intermediate_size=8192, model_vocab_size=128256,
                                tie_word_embeddings=True, max_position_embeddings=2048, rope_theta=500000.0,
                                dtype=torch.bfloat16)
    raise ValueError(f"DELTASERVE_DP_SHAPE={SHAPE!r}: use tiny or 1b")


def _wait_for(path: Path, procs: list[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        assert not dead, f"a rank process exited with {dead} before {path.name}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout_s:.0f} s"
        time.sleep(0.2)


def _rank_main(rank: int, model: str, job: JobConfig, folder: str) -> None:
    """One replica: host, CoServer with its rank, client traffic, and the job run to its end. Writes what the test
    compares to ``rank-<r>.pt``, then stays up until the other rank has written its own (rank 0's controller hosts
    the store the other one still needs). Marker files in ``folder`` order the two processes' starts."""
    from deltaserve_core.coserve import CoServer
    from deltaserve_core.driver import HostConfig
    from deltaserve_core.registry import create_host

    from test_coserve import _model, _requests

    out = Path(folder)
    options: dict[str, Any] = {}
    if ENGINE == "vllm" and DEVICE == "cuda":
        # the replicas split one GPU; eager kernels keep the two engine starts short (the path under test is the
        # job's, not the engine's compilation, which tests/test_vllm_host.py covers on the GPU)
        options = {"gpu_memory_utilization": GPU_SHARE, "compile": False}
    host = create_host(ENGINE, HostConfig(model=model, dtype=DTYPE, device=DEVICE, options=options))
    co = CoServer(host, job, latency_model=_model(), backward_threads=1, dp_rank=rank)
    try:
        (out / f"host-{rank}").touch()
        # the job starts on both replicas together (a replica that starts after the job ended trains nothing)
        _wait_for(out / "go", [], RANK_TIMEOUT_S)
        if rank:
            _wait_for(out / "started-0", [], 60)
        co.start()
        (out / f"started-{rank}").touch()
        # and steps once both are up: a rank still starting is not waited for (it would join a job already ended)
        _wait_for(out / f"started-{1 - rank}", [], 60)
        outputs = host.generate(_requests(3, rank))  # client traffic on this replica while it co-serves
        assert [len(o.token_ids) for o in outputs] == [6, 6, 6], outputs
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while not co.finished:
            assert time.monotonic() < deadline, co.pool.progress_line()
            if not host.run_idle_step():
                co.poll()
            time.sleep(0.002)
        co.poll()
        result = {
            "final": {k: v.detach().to("cpu").clone() for k, v in co.backward.adapter_snapshot().tensors.items()},
            "steps": [s for s, _ in co._step_log],
            "batches": [list(b) for b in co.stats.trained_batches],
            "status": co.job_status()["deltaserve"]["data_parallel"],
            "init": {k: v.detach().to("cpu", torch.float32) for k, v in co.initial_adapter.tensors.items()},
            "samples": {s.sample_id: s for s in co.dataset.samples},
        }
        torch.save(result, out / f"rank-{rank}.tmp")
        os.replace(out / f"rank-{rank}.tmp", out / f"rank-{rank}.pt")
        other = out / f"rank-{1 - rank}.pt"
        deadline = time.monotonic() + 120
        while rank == 0 and not other.exists() and time.monotonic() < deadline:
            co.poll()  # keep the store's host answering until rank 1 is through
            time.sleep(0.05)
    finally:
        co.close()
        host.shutdown()


@pytest.mark.exactness
@pytest.mark.slow
def test_two_engine_processes_train_one_job_exactly(cache_dir: Path, tmp_path: Path) -> None:
    from test_coserve import _peft_replay, _update_error, assert_within_precision

    model = _model_dir(cache_dir)
    job = _two_rank_job(tmp_path, _free_port(), step_timeout_s=120.0)
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    try:
        for rank in (0, 1):  # the engines start one after the other, so that one profiles the device at a time
            proc = ctx.Process(target=_rank_main, args=(rank, str(model), job, str(tmp_path)), name=f"dp-rank-{rank}")
            proc.start()
            procs.append(proc)
            _wait_for(tmp_path / f"host-{rank}", procs, RANK_TIMEOUT_S)
        (tmp_path / "go").touch()
        for rank in (0, 1):
            _wait_for(tmp_path / f"rank-{rank}.pt", procs, RANK_TIMEOUT_S)
        for proc in procs:
            proc.join(180)
            assert proc.exitcode == 0, f"{proc.name} exited with {proc.exitcode}"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
    results = [torch.load(tmp_path / f"rank-{r}.pt", weights_only=False) for r in (0, 1)]
    steps = [r["steps"] for r in results]
    batches = [r["batches"] for r in results]
    assert steps[0] == steps[1] and len(steps[0]) >= 4, f"the ranks saw different global steps: {steps}, {batches}"
    union = [tuple(a) + tuple(b) for a, b in zip(*batches)]
    assert all(union), "a global step without samples was reported"
    samples = results[0]["samples"]
    counts = Counter(i for step in union for i in step)
    assert counts == Counter({i: 2 for i in samples}), f"a sample was trained twice or skipped in an epoch: {counts}"
    assert sum(map(len, batches[0])) and sum(map(len, batches[1])), "one rank trained nothing"
    finals = [r["final"] for r in results]
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0]), "the ranks' adapters differ"
    status = results[0]["status"]
    assert set(status["trained_tokens_by_rank"]) == {"0", "1"} and status["world_size"] == 2

    init = results[0]["init"]
    final = {k: v.float() for k, v in finals[0].items()}
    replay = dict(cfg=job.lora, init=init, batches=union, samples=samples, lr=job.lr, weight_decay=job.weight_decay)
    ref = _peft_replay(model, dtype=torch.float32, device=DEVICE, **replay)
    worst = max((final[k] - ref[k]).abs().max().item() / max(ref[k].abs().max().item(), 1e-12) for k in ref)
    line = (f"two engine processes ({ENGINE}, {DEVICE}, {DTYPE}, {SHAPE}): {len(union)} global steps, rank 0 "
            f"trained {sum(map(len, batches[0]))} and rank 1 {sum(map(len, batches[1]))} sample-epochs; max relative "
            f"difference from fp32 PEFT on the union {worst:.3g}")
    if DTYPE == "float32":
        print(line)
        assert worst <= 1e-4, line
        return
    low = _peft_replay(model, dtype=getattr(torch, DTYPE), device=DEVICE, **replay)
    details = {"update_error": _update_error(final, ref, init), "peft_update_error": _update_error(low, ref, init),
               "dtype": DTYPE}
    print(f"{line}; update error {details['update_error']:.4g} vs plain {DTYPE} PEFT {details['peft_update_error']:.4g}")
    assert_within_precision(details)
