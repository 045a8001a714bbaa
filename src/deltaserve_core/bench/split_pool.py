"""A dedicated LoRA trainer in its own process: the fine-tuning side of the ``static_mps`` and ``split_pool``
baselines, and, alone on the whole device, the rate honest harvest divides by.

The paper's "vLLM + torchtune" baseline gives one of four GPUs to a trainer and the rest to inference. Here the
share is:

* CPU: disjoint core sets, pinned with ``os.sched_setaffinity`` (the serving process keeps the others; see
  :func:`pin_process`), one torch thread per core of the share;
* CUDA: another device (``device="cuda:1"``), or the same one under MPS with
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` set for the trainer (``mps_percentage``); the MPS daemon must already run.

The trainer is what a user writes with transformers + PEFT (:func:`~deltaserve_core.lora_backward.packed_peft_step`:
the batch's samples packed padding-free into sequences of up to ``pack_tokens``, forward with loss, backward, AdamW
per batch of ``batch_tokens``; ``pack_tokens=0`` is the per-sample loop), over the same tokenised samples the
co-served job trains on, cycling through them. It packs exactly as the co-served backward does, so neither side
wins on batching alone. Throughput counts every token of every trained sample, as the co-served
systems do. The model loads before :meth:`DedicatedTrainer.begin`, so load time is not counted.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..adapter_state import LoraConfigSpec

__all__ = ["DedicatedTrainer", "TrainerSpec", "pin_process", "restore_pins", "samples_for_trainer", "split_cores"]


def split_cores(inference_share: float = 0.5) -> tuple[set[int], set[int]]:
    """Split this process's usable cores into (inference, fine-tuning); on one core both get it (and a run
    then measures time-sharing, which the caller should report)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return set(cores), set(cores)
    k = min(len(cores) - 1, max(1, round(len(cores) * inference_share)))
    return set(cores[:k]), set(cores[k:])


def pin_process(cores: set[int]) -> dict[int, set[int]]:
    """Pin every thread of this process to ``cores``; returns the previous masks for :func:`restore_pins`.

    Per thread, because ``sched_setaffinity(0, …)`` moves only the calling thread on Linux, and torch's pool
    threads already exist."""
    before: dict[int, set[int]] = {}
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread ended meanwhile
            continue
    return before


def restore_pins(before: dict[int, set[int]]) -> None:
    for tid, mask in before.items():
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            continue


@dataclass(frozen=True)
class TrainerSpec:
    model_path: str
    samples: tuple[tuple[tuple[int, ...], tuple[bool, ...]], ...]
    lora: LoraConfigSpec
    lr: float = 1e-3
    batch_tokens: int = 256
    pack_tokens: int = 2048
    device: str = "cpu"
    dtype: str = "float32"
    cores: frozenset[int] | None = None
    mps_percentage: int | None = None
    seed: int = 0
    #: torch threads; None: one per core of ``cores`` (or 1). The trainer alone on a CPU host takes every core.
    threads: int | None = None


def _child(spec: TrainerSpec, ctl: Any, out: Any) -> None:
    if spec.cores:
        os.sched_setaffinity(0, spec.cores)
    if spec.mps_percentage is not None:
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(spec.mps_percentage)
    else:  # uncapped means uncapped, whatever the launching shell exported
        os.environ.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
    threads = spec.threads or (len(spec.cores) if spec.cores else 1)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ..peft_steps import packed_peft_step
    from ..types import FineTuneSample

    torch.set_num_threads(threads)
    torch.manual_seed(spec.seed)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[spec.dtype]
    base = AutoModelForCausalLM.from_pretrained(spec.model_path, dtype=dtype).to(spec.device)
    model = get_peft_model(base, LoraConfig(r=spec.lora.r, lora_alpha=spec.lora.lora_alpha,
                                            target_modules=list(spec.lora.target_modules),
                                            lora_dropout=spec.lora.lora_dropout, task_type="CAUSAL_LM"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr)
    samples = [FineTuneSample(i, ids, mask) for i, (ids, mask) in enumerate(spec.samples)]
    # One warm-up step: first steps pay for allocator growth, and the co-served backward has been warm for a while.
    packed_peft_step(model, opt, samples[:1], spec.pack_tokens)
    out.put(("ready", time.monotonic(), 0))
    if ctl.get() != "go":
        return
    i = 0
    while True:
        batch, tokens = [], 0
        while tokens < spec.batch_tokens:
            s = samples[i % len(samples)]
            batch.append(s)
            tokens += s.num_tokens
            i += 1
        packed_peft_step(model, opt, batch, spec.pack_tokens)
        if spec.device.startswith("cuda"):
            torch.cuda.synchronize()
        out.put(("step", time.monotonic(), tokens))
        try:
            if ctl.get_nowait() == "stop":
                return
        except queue.Empty:
            pass


class DedicatedTrainer:
    """A trainer process: :meth:`start` loads (not timed), :meth:`begin` starts training, :meth:`stop` ends it and
    returns ``(monotonic time, tokens)`` of every optimizer step. A step in flight at stop is not counted."""

    def __init__(self, spec: TrainerSpec) -> None:
        if not spec.samples:
            raise ValueError("the dedicated trainer needs at least one sample")
        self.spec = spec
        ctx = mp.get_context("spawn")
        self._ctl = ctx.Queue()
        self._out = ctx.Queue()
        self._proc = ctx.Process(target=_child, args=(spec, self._ctl, self._out), daemon=True,
                                 name="deltaserve-split-pool-trainer")
        self.steps: list[tuple[float, int]] = []
        self.began_at: float | None = None

    def start(self, timeout: float = 300.0) -> DedicatedTrainer:
        self._proc.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                kind, _, _ = self._out.get(timeout=1.0)
                if kind == "ready":
                    return self
            except queue.Empty:
                if not self._proc.is_alive():
                    raise RuntimeError(f"the split-pool trainer exited with code {self._proc.exitcode} before it was "
                                       "ready") from None
                if time.monotonic() > deadline:
                    raise TimeoutError("the split-pool trainer did not load its model in time") from None

    def begin(self) -> None:
        self.began_at = time.monotonic()
        self._ctl.put("go")

    def stop(self, timeout: float = 120.0) -> list[tuple[float, int]]:
        stopped_at = time.monotonic()
        self._ctl.put("stop")
        deadline = time.monotonic() + timeout
        while self._proc.is_alive() and time.monotonic() < deadline:
            self._drain(0.2)
        self._drain(0.0)
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5)
        return [(t, n) for t, n in self.steps if t <= stopped_at]

    def _drain(self, timeout: float) -> None:
        try:
            while True:
                kind, t, n = self._out.get(timeout=timeout)
                if kind == "step":
                    self.steps.append((t, n))
        except queue.Empty:
            pass


def samples_for_trainer(samples: Sequence[Any]) -> tuple[tuple[tuple[int, ...], tuple[bool, ...]], ...]:
    """Plain tuples of (input ids, loss mask): what crosses into the spawned trainer."""
    return tuple((tuple(s.input_ids), tuple(s.loss_mask)) for s in samples)

