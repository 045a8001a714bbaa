"""The trainer baselines: the bare host with a :class:`~.split_pool.DedicatedTrainer` beside it
(``static_mps``, ``split_pool``), and the packed PEFT trainer alone (the denominator of harvest)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import family
from .config import BenchConfig, _job
from .metrics import SystemRun
from .replay import _Progress, _StepRecorder, _results, _window, replay

__all__ = ["step_rate"]


def _trainer_spec(host: Any, cfg: BenchConfig, tokenizer: Any, work: Path, *, device: str,
                  cores: set[int] | None = None, mps_percentage: int | None = None,
                  threads: int | None = None) -> Any:
    """The packed PEFT trainer every trainer baseline runs: the co-served job's data, order, LoRA and batch."""
    from ..finetune_data import DataConfig, FinetuneDataset
    from .split_pool import TrainerSpec, samples_for_trainer

    job = _job(cfg, 1.0, 1.0, str(work / f"ckpt-trainer-{time.monotonic_ns()}"))
    ds = FinetuneDataset(DataConfig(path=job.dataset, format=job.dataset_format, max_length=job.max_length,
                                    overflow=job.overflow, epochs=1, seed=job.seed), tokenizer)
    order = list(ds.samples)
    random.Random(cfg.seed).shuffle(order)
    return TrainerSpec(model_path=str(host.model_spec().path), samples=samples_for_trainer(order), lora=job.lora,
                       lr=job.lr, batch_tokens=job.backward_batch_tokens, pack_tokens=job.pack_tokens,
                       device=device, dtype=cfg.dtype, cores=frozenset(cores) if cores else None,
                       mps_percentage=mps_percentage, seed=cfg.seed, threads=threads)


def step_rate(steps: Sequence[tuple[float, int]], window_s: float) -> tuple[float | None, str | None]:
    """Tokens/s of optimizer steps ``(time, tokens)``, from the first step's completion to the last (start-up and
    the first step's warm-up are not charged); with fewer than 2 steps, whatever trained over ``window_s``."""
    if len(steps) < 2:
        total = sum(n for _, n in steps)
        return (total / window_s if total and window_s > 0 else None,
                "fewer than 2 optimizer steps: rate over the whole window")
    t0, t1 = steps[0][0], steps[-1][0]
    if t1 <= t0:
        return None, "optimizer steps without time between them"
    return sum(n for _, n in steps[1:]) / (t1 - t0), None


def _trainer_alone(host: Any, cfg: BenchConfig, tokenizer: Any, work: Path) -> dict[str, Any]:
    """The packed PEFT trainer with the whole device and no inference (the host stands idle): the rate honest
    harvest divides by. No core pinning on CPU (every usable core, one thread each), no MPS cap on GPU."""
    from .split_pool import DedicatedTrainer

    cpu = cfg.device == "cpu"
    threads = len(os.sched_getaffinity(0)) if cpu else None
    spec = _trainer_spec(host, cfg, tokenizer, work, device=cfg.device, threads=threads)
    trainer = DedicatedTrainer(spec).start()
    trainer.begin()
    t0 = time.monotonic()
    time.sleep(cfg.dedicated_s)
    steps = trainer.stop()
    rate, note = step_rate(steps, time.monotonic() - t0)
    out: dict[str, Any] = {"finetune_tokens_per_s": rate, "optimizer_steps": len(steps), "window_s": cfg.dedicated_s,
                           "where": f"{threads} threads, no pinning" if cpu else f"{cfg.device}, no MPS cap",
                           "threads": threads}
    if note:
        out["note"] = note
    return out


def _run_trainer_baseline(system: str, host: Any, arr: list[tuple[float, Any]], duration: float, bar: _Progress,
                          cfg: BenchConfig, tokenizer: Any, work: Path) -> SystemRun:
    """The bare host replaying the trace with a packed PEFT trainer beside it (see :func:`expand_systems`)."""
    from .split_pool import DedicatedTrainer, pin_process, restore_pins, split_cores

    fam = family(system)
    share = int(system.split("@", 1)[1]) if "@" in system else None
    cpu = cfg.device == "cpu"
    inf_cores = ft_cores = None
    mps = None
    threads = None
    device = cfg.device
    if fam == "split_pool" and cpu:
        inf_cores, ft_cores = split_cores(1 - (share if share is not None else 50) / 100)
    elif fam == "split_pool":
        device = cfg.split_ft_device or cfg.device  # expand_systems let it through only for another device
    elif cpu:
        threads = len(os.sched_getaffinity(0))  # static on CPU: the trainer takes every core, as the engine does
    else:
        mps = share
    spec = _trainer_spec(host, cfg, tokenizer, work, device=device, cores=ft_cores, mps_percentage=mps,
                         threads=threads)
    trainer = DedicatedTrainer(spec).start()
    pins = pin_process(inf_cores) if inf_cores else {}
    try:
        rec = _StepRecorder(0.0)
        start = time.monotonic()
        rec.start = start
        host.report_step_time(rec)
        trainer.begin()
        try:
            outputs, start, _ = replay(host, arr, duration_s=duration, on_tick=bar.tick, start=start,
                                       drain_timeout_s=cfg.drain_timeout_s)
        finally:
            host.report_step_time(None)
            steps = trainer.stop()
    finally:
        restore_pins(pins)
    reqs = _results(outputs, arr, start)
    ft_steps = [(t - start, n) for t, n in steps]
    extra = {"inference_cores": sorted(inf_cores) if inf_cores else None,
             "finetune_cores": sorted(ft_cores) if ft_cores else None, "finetune_threads": threads,
             "finetune_device": spec.device, "mps_percentage": mps, "share_pct": share,
             "engine_capped": bool(inf_cores) or (fam == "split_pool" and device != cfg.device),
             "optimizer_steps": len(steps), "shared_cores": bool(inf_cores and inf_cores == ft_cores)}
    return SystemRun(system, _window(reqs, duration), reqs, ft_steps, rec.steps, extra)
