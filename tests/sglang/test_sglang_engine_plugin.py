"""The operator path, multi-process: SGLang's own ``sgl.Engine`` (scheduler in its subprocess) with DeltaServe
enabled only through the ``sglang.srt.plugins`` entry point and ``DELTASERVE_JOB=job.yaml``.

Greedy outputs must equal plain SGLang's (same engine arguments, no job), and the job must make progress inside
the scheduler subprocess: a checkpoint appears while the engine idles. The latency profile is calibrated in the
scheduler process on first start (stored under DELTASERVE_PROFILE_DIR, here a temporary folder).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
pytestmark = pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed (bash scripts/setup_sglang.sh)")

PROMPTS = [[5, 17, 99, 23, 8, 41], [12, 7, 300, 64], [250, 251, 252, 9, 10, 11, 12, 13]]


def _engine(model: Path):
    import sglang as sgl

    return sgl.Engine(model_path=str(model), device="cpu", dtype="float32", attention_backend="torch_native",
                      sampling_backend="pytorch", enable_lora=True, lora_backend="torch_native", max_lora_rank=16,
                      lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], max_loras_per_batch=4,
                      disable_overlap_schedule=True, skip_tokenizer_init=True, max_total_tokens=8192,
                      chunked_prefill_size=1024, max_prefill_tokens=1024, random_seed=0, log_level="warning")


def _generate(engine) -> list[list[int]]:
    out = engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0.0, "max_new_tokens": 6,
                                                              "ignore_eos": True})
    return [list(o["output_ids"]) for o in out]


def test_sgl_engine_with_deltaserve_job(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"instruction": f"Write one sentence about topic {i}.", "input": "",
                "output": f"Here is a short sentence about topic {i}, written plainly."} for i in range(40)]
    data = tmp_path / "train.json"
    data.write_text(json.dumps(records))
    ckpt = tmp_path / "ckpt"
    job = tmp_path / "job.yaml"
    job.write_text(f"""dataset: {data}
adapter_name: smoke-adapter
lora: {{r: 8, alpha: 16, target_modules: [q_proj, k_proj, v_proj, o_proj], dropout: 0.0}}
optimizer: {{lr: 1.0e-3, weight_decay: 0.0}}
epochs: 1
backward_batch_tokens: 96
max_length: 64
buffer_tokens: 512
slo: {{ttft_s: 5.0, tpot_s: 5.0}}
checkpoint: {{dir: {ckpt}, every_steps: 2, keep: 2}}
publish: {{policy: on_checkpoint}}
seed: 0
""")
    monkeypatch.setenv("DELTASERVE_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.delenv("DELTASERVE_JOB", raising=False)
    plain = _engine(tiny_model)
    try:
        want = _generate(plain)
    finally:
        plain.shutdown()

    monkeypatch.setenv("DELTASERVE_JOB", str(job))
    t0 = time.monotonic()
    engine = _engine(tiny_model)
    started = time.monotonic() - t0
    try:
        got = _generate(engine)
        deadline = time.monotonic() + 300
        while not any(ckpt.glob("checkpoint-*")) and time.monotonic() < deadline:
            time.sleep(1.0)
        checkpoints = sorted(p.name for p in ckpt.glob("checkpoint-*"))
        published = sorted(p.name for p in (ckpt / "published").glob("*"))
        again = _generate(engine)  # still serving, unchanged, with the job running beside it
    finally:
        engine.shutdown()
    assert got == want, f"greedy outputs changed with DeltaServe enabled: {got} vs plain {want}"
    assert again == want
    assert checkpoints, f"no checkpoint in {ckpt} within 300 s of serving (engine start took {started:.0f} s)"
    assert published and all(n.startswith("smoke-adapter@v") for n in published), published
    assert any((tmp_path / "profiles").rglob("*")), "the calibration profile was not stored"
