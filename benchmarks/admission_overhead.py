"""Time one admission decision (Algorithm 1, latency estimator included) on the host's critical path.

Usage: ``python benchmarks/admission_overhead.py [--json PATH] [--repeats N] [--quick] [--pool reference|finetune]``

For inference batches of 1..256 scheduled requests (one prefill chunk, the rest decodes, plus a queue of
waiting requests) and fine-tuning pools of 10..100k samples, it times :meth:`Admission.decide` end to end
-- the SLO budget pass over the batch, pricing the inference batch, the lazy walk of the pool with the
estimator per candidate, and the claim -- and reports the median and p95 in microseconds. Between timed
calls the claimed samples are released again (untimed), so every call sees the same pool.

The coefficients are fixed, GPU-like values (eager slower than graph replay; Equation I's per-row δ small
in graph replay and larger in eager, launch-bound execution), so the walk prices every term of Equation I,
δ·R included, and the number of samples a decision walks is realistic: a handful when the budget is tight,
up to ~190 when a large budget meets the short end of a big pool (the per-step token cap then binds). The
numbers measure Python overhead, not a device. ``--pool reference`` (default) uses :class:`InMemoryPool`;
``--pool finetune`` the fine-tuning data manager's ``FinetunePool``, i.e. the pool a job really runs with.
Goal (issue 3): median ≤ 50 µs. Writes JSON (default ``benchmarks/results/admission_overhead.json``) and
prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from deltaserve_core.admission import Admission  # noqa: E402
from deltaserve_core.finetune_data import FinetunePool, InMemoryPool  # noqa: E402
from deltaserve_core.latency_model import DecodeCoefficients, LatencyModel, PrefillCoefficients  # noqa: E402
from deltaserve_core.slo import SLOConfig  # noqa: E402
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, ScheduledRequest  # noqa: E402

BATCH_SIZES = (1, 4, 16, 64, 128, 256)
POOL_SIZES = (10, 100, 1_000, 10_000, 100_000)
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "admission_overhead.json"


def build_model() -> LatencyModel:
    model = LatencyModel()
    model.set_coefficients(
        ExecutionMode.GRAPH,
        prefill=PrefillCoefficients(alpha=1.0e-9, beta=6.0e-5, gamma=0.0, eps=2.0e-8, c=0.004, delta=2.0e-6),
        decode=DecodeCoefficients(beta=5.0e-5, eps=2.0e-8, c=0.006),
    )
    model.set_coefficients(
        ExecutionMode.EAGER,
        prefill=PrefillCoefficients(alpha=1.1e-9, beta=7.0e-5, gamma=5.0e-6, eps=2.2e-8, c=0.025, delta=1.0e-5),
        decode=DecodeCoefficients(beta=6.0e-5, eps=2.2e-8, c=0.025),
    )
    return model


def build_pool(size: int, rng: random.Random, kind: str = "reference"):
    samples = []
    shared: dict[int, tuple[tuple[int, ...], tuple[bool, ...]]] = {}  # token content is irrelevant here
    for i in range(size):
        n = int(min(2048, max(16, rng.lognormvariate(5.3, 0.7))))  # median ≈ 200 tokens, Alpaca-like
        ids, mask = shared.setdefault(n, ((1,) * n, (True,) * n))
        samples.append(FineTuneSample(sample_id=i, input_ids=ids, loss_mask=mask))
    if kind == "finetune":
        return FinetunePool(samples, epochs=1, seed=0)
    return InMemoryPool(samples)


def build_batch(size: int, rng: random.Random) -> ProposedBatch:
    now = 1000.0
    scheduled = [ScheduledRequest("p0", arrival_time=now - 0.05, prefill_tokens=256)]
    for i in range(size - 1):
        ctx = rng.randint(200, 2000)
        scheduled.append(ScheduledRequest(
            f"d{i}", arrival_time=now - 5.0, context_tokens=ctx, output_tokens=ctx // 4,
            first_token_time=now - 4.0, last_token_time=now - rng.uniform(0.0, 0.03)))
    waiting = tuple(ScheduledRequest(f"w{i}", arrival_time=now - 0.01 * i, prefill_tokens=rng.randint(32, 1024))
                    for i in range(size // 4))
    return ProposedBatch(step_id=1, now=now, scheduled=tuple(scheduled), waiting=waiting, mode=ExecutionMode.GRAPH)


def time_case(admission: Admission, batch: ProposedBatch, pool, repeats: int) -> dict:
    samples_ns: list[int] = []
    admitted: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(max(50, repeats // 20)):  # warm caches and the interpreter's specialisations
        d = admission.decide(batch, pool=pool, buffer_free_tokens=65536)
        pool.release([s.sample_id for s in d.samples])
    for _ in range(repeats):
        t0 = clock()
        d = admission.decide(batch, pool=pool, buffer_free_tokens=65536)
        t1 = clock()
        samples_ns.append(t1 - t0)
        admitted.append(len(d.samples))
        pool.release([s.sample_id for s in d.samples])
    samples_ns.sort()
    return {
        "median_us": statistics.median(samples_ns) / 1e3,
        "p95_us": samples_ns[int(0.95 * (len(samples_ns) - 1))] / 1e3,
        "admitted_samples": statistics.median(admitted),
        "reason": d.reason.value,
        "delta_ms": d.delta * 1e3,
        "predicted_inference_ms": d.predicted_inference * 1e3,
        "predicted_mixed_ms": None if d.predicted_mixed is None else d.predicted_mixed * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    parser.add_argument("--repeats", type=int, default=2000, help="timed decisions per case")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--pool", choices=("reference", "finetune"), default="reference",
                        help="pool implementation: InMemoryPool or the data manager's FinetunePool")
    args = parser.parse_args(argv)
    repeats = 200 if args.quick else args.repeats

    rng = random.Random(0)
    model = build_model()
    slo = SLOConfig(ttft_s=1.0, tpot_s=0.15)
    admission = Admission(model, slo, mixed_batches=True, max_ft_tokens_per_step=4096)
    pools = {size: build_pool(size, rng, args.pool) for size in POOL_SIZES}
    results = []
    print(f"{'batch':>6} {'pool':>8} {'median µs':>10} {'p95 µs':>8} {'admitted':>9}  reason")
    for bsize in BATCH_SIZES:
        batch = build_batch(bsize, rng)
        for psize in POOL_SIZES:
            row = {"batch_requests": bsize, "pool_samples": psize, **time_case(admission, batch, pools[psize], repeats)}
            results.append(row)
            print(f"{bsize:>6} {psize:>8} {row['median_us']:>10.1f} {row['p95_us']:>8.1f} "
                  f"{row['admitted_samples']:>9}  {row['reason']}")
    worst = max(r["median_us"] for r in results)
    out = {
        "benchmark": "admission_overhead",
        "goal_median_us": 50.0,
        "worst_median_us": worst,
        "meets_goal": worst <= 50.0,
        "repeats_per_case": repeats,
        "environment": {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "machine": platform.machine(),
            "processor": platform.processor() or None,
            "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
        "setup": {
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
            "max_ft_tokens_per_step": 4096,
            "buffer_free_tokens": 65536,
            "batch": "1 prefill chunk of 256 tokens + (N-1) decodes (context 200-2000) + N/4 waiting prefills; "
                     "graph mode",
            "pool": f"{args.pool} pool; lognormal lengths, median ~200 tokens, clipped to 16..2048",
        },
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"worst median {worst:.1f} µs (goal ≤ 50 µs) -> {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
