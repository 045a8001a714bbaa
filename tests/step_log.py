"""The per-step graph/eager log of the CUDA tests of every engine adapter (vLLM's, SGLang's): one run of plain client
requests, one with a fine-tuning sample injected into every other decode step, each step's record beside what
graph_mode() predicted and the proposed batch said. Written to $DELTASERVE_STEP_LOG when set (the GPU scripts keep it
with their results) and printed."""

from __future__ import annotations

import json
import os
from typing import Any

from deltaserve_conformance import ConformanceEnv, Recorder
from deltaserve_conformance.harness import make_prompts, make_samples


def _rows(rec: Recorder, host: Any, label: str) -> list[dict]:
    rows = []
    for r in rec.real_records():
        batch = rec.batch_for(r.step_id)
        rows.append({"run": label, "step": r.step_id, "mode": r.mode.value,
                     "predicted": host.graph_mode(batch).value if batch is not None else None,
                     "proposed": batch.mode.value if batch is not None else None,
                     "prefill_lengths": list(r.prefill_lengths), "num_decode": r.num_decode,
                     "finetune_lengths": list(r.finetune_lengths), "aborted": list(r.aborted_sample_ids),
                     "duration_ms": round(r.duration_s * 1e3, 3)})
    return rows


def graph_step_log(env: ConformanceEnv) -> tuple[list[dict], Recorder]:
    """Run both workloads on ``env``'s host; return the log's rows (also written and printed) and the recorder of
    the run with fine-tuning rows (its captures)."""
    plain = Recorder()
    env.install(plain)
    env.run(make_prompts(env, 4, seed=31, max_tokens=8))
    counter = iter(range(9000, 90_000))
    mixed = Recorder(inject=lambda b: make_samples(env, 1, seed=next(counter), first_id=next(counter) * 10)
                     if b.num_decode and b.step_id % 2 == 0 else ())
    env.install(mixed)
    env.run(make_prompts(env, 4, seed=32, max_tokens=8))
    env.install(None)
    rows = _rows(plain, env.host, "plain") + _rows(mixed, env.host, "finetune_every_other_decode_step")
    if os.environ.get("DELTASERVE_STEP_LOG"):
        with open(os.environ["DELTASERVE_STEP_LOG"], "w") as f:
            json.dump(rows, f, indent=1)
    for row in rows:
        print(row)
    return rows, mixed
