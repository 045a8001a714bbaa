"""What one ``deltaserve bench`` run is: its :class:`BenchConfig`, the system instances it runs, and the SLO
regimes it judges them under."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import CHILD_ENGINES, SYSTEMS, family
from .metrics import StepSample, tight_slo

__all__ = ["DEFAULT_OUT_DIR", "SLO_REGIMES", "BenchConfig", "auto_slo", "default_stem", "expand_systems", "regime_slo"]


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
    systems: tuple[str, ...] = tuple(x for x in SYSTEMS if x not in CHILD_ENGINES)
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
    order = {"bare": 0, **{s: 1 for s in CHILD_ENGINES}, "static_mps": 2, "split_pool": 2}
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


def _job(cfg: BenchConfig, ttft: float, tpot: float, ckpt: str) -> Any:
    from ..assets import demo_dataset_path
    from ..job_config import CheckpointSpec, JobConfig, PublishSpec, SLOSpec

    return JobConfig(dataset=str(cfg.dataset or demo_dataset_path()), adapter_name="bench-adapter",
                     max_length=cfg.ft_max_length, buffer_tokens=cfg.buffer_tokens,
                     backward_batch_tokens=cfg.backward_batch_tokens, pack_tokens=cfg.pack_tokens,
                     slo=SLOSpec(ttft_s=ttft, tpot_s=tpot),
                     checkpoint=CheckpointSpec(dir=ckpt, every_steps=0, keep=1), publish=PublishSpec(policy="never"),
                     seed=cfg.seed, epochs=100)


def default_stem(cfg: BenchConfig) -> str:
    """The file stem of ``cfg``'s results: ``--name``, else ``bench_<host>_<model>_<trace>`` (a trace file by its
    own stem, as the trace is named in the results)."""
    from .traces import TRACE_NAMES

    trace = cfg.trace if cfg.trace in TRACE_NAMES else Path(cfg.trace).stem
    return cfg.stem or f"bench_{cfg.host}_{Path(cfg.model).name}_{trace}"
