"""Where a host's dedicated fine-tuning time goes: DeltaServe alone on the host (no inference), broken down.

    python -m deltaserve_core.bench.profile_ft --host vllm --backward-threads 1 --seconds 25

Prints the rate, the fine-tuning-only forward steps (count, tokens, duration), the backward steps (tokens,
duration, each as it lands) and the driver's idle polling. Uses the bench's calibrated profile and its co-server
set-up (:func:`.runner._make_coserver`), so the numbers are those the harness's dedicated phase sees.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deltaserve_core.bench.profile_ft")
    p.add_argument("--host", default="vllm")
    p.add_argument("--model", default="tiny")
    p.add_argument("--seconds", type=float, default=25.0)
    p.add_argument("--tpot", type=float, default=0.275, help="TPOT SLO = fine-tuning-only step budget (s)")
    p.add_argument("--backward-threads", type=int, default=None, help="default: the bench's cpu_backward_threads()")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("deltaserve.finetune_data").setLevel(logging.ERROR)

    from transformers import AutoTokenizer

    from ..assets import cache_dir
    from ..calibration import (
        ProfileStore,
        install_calibration_adapter,
        load_or_calibrate,
    )
    from ..assets import resolve_model
    from ..driver import HostConfig
    from ..registry import create_host
    from .config import BenchConfig
    from .replay import _StepRecorder
    from .runner import _make_coserver

    cfg = BenchConfig(host=args.host, model=args.model)
    model_dir = resolve_model(cfg.model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    host = create_host(cfg.host, HostConfig(model=str(model_dir), device="cpu", dtype="float32",
                                            max_batch_tokens=cfg.max_batch_tokens,
                                            max_running_requests=cfg.max_running_requests, seed=cfg.seed))
    try:
        install_calibration_adapter(host, seed=cfg.seed)
        # the bench's calibration arguments, so the stored profile is reused
        prof = load_or_calibrate(host, ProfileStore(cache_dir() / "profiles-bench"), progress=False,
                                 max_prefill_tokens=min(cfg.max_batch_tokens, 1024, 1024),
                                 max_decode_batch=cfg.max_running_requests,
                                 max_kv=min(cfg.max_running_requests * (cfg.max_prompt + cfg.max_output), 2048 - 64),
                                 max_ft_tokens=min(cfg.ft_max_length * 4, cfg.max_batch_tokens))
        co, _, _ = _make_coserver("deltaserve", host, cfg, prof.model, prof.records, tok, 4 * args.tpot, args.tpot,
                                  Path(tempfile.mkdtemp(prefix="deltaserve-profile-ft-")))
        if args.backward_threads is not None:
            co.backward_threads = args.backward_threads
        backward: list[tuple[int, float]] = []
        with co:
            start = time.monotonic()
            handle = co._handle

            def on_report(rep):
                if rep.kind == "step":
                    backward.append((rep.tokens, rep.duration_s))
                    print(f"  backward step: {rep.tokens} tokens in {rep.duration_s:.2f} s "
                          f"(at {time.monotonic() - start:.1f} s)", flush=True)
                handle(rep)

            co._handle = on_report
            rec = _StepRecorder(start, co)
            host.report_step_time(rec)
            polls, poll_s = 0, 0.0
            while time.monotonic() - start < args.seconds:
                t0 = time.monotonic()
                if not host.run_idle_step():
                    polls += 1
                    poll_s += time.monotonic() - t0
                    co.poll()
                    time.sleep(0.002)
            wall = time.monotonic() - start
            trained = co.stats.trained_tokens
    finally:
        host.shutdown()
    ft = [s for s in rec.steps if s.ft_tokens]
    print(f"{args.host}: {co.backward_threads} backward thread(s), {wall:.1f} s: {trained} tokens trained = "
          f"{trained / wall:.1f} tok/s in {len(backward)} optimizer steps")
    if ft:
        print(f"fine-tuning-only forward steps: {len(ft)}, mean {statistics.mean(s.ft_tokens for s in ft):.0f} tokens, "
              f"mean {statistics.mean(s.duration_s for s in ft) * 1000:.1f} ms, {sum(s.duration_s for s in ft):.2f} s "
              "in all")
    if backward:
        d = [x[1] for x in backward]
        print(f"backward steps: mean {statistics.mean(x[0] for x in backward):.0f} tokens, {min(d):.2f}-{max(d):.2f} s "
              f"each, {sum(d):.2f} s in all")
    print(f"idle polls with nothing to run (backward busy): {polls}, {poll_s:.2f} s in run_idle_step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
