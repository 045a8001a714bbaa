"""``deltaserve calibrate``: profile a host, fit its latency model, save the profile for reuse.

Who calls it: :mod:`deltaserve_core.cli` wires :func:`add_calibrate_arguments` into its ``calibrate``
sub-command and calls :func:`run_calibrate`. ``--model`` goes through :func:`deltaserve_core.assets.resolve_model`,
as ``deltaserve serve``'s does, so ``tiny`` / ``smollm2`` name the same checkpoint (and profile key) in both.

Errors that are the user's to fix (unknown host, a model path that is not a checkpoint, a CUDA device on a
machine without one, non-positive sweep limits) are raised as ``ValueError`` / ``FileNotFoundError`` /
the registry's ``UnknownHostError`` *before* anything heavy starts; ``cli.main`` prints them as one line
and exits with status 2.

Limits that fit the model: ``--max-prefill``, ``--max-kv`` and ``--dtype`` default to what the checkpoint's
``config.json`` allows (:func:`~deltaserve_core.model_limits.model_limits`): its context length bounds the longest
profiled prompt and decode context, and its dtype is the engine's. An explicit limit the context cannot hold is
refused before any engine starts, naming the flag, the value and the largest one that works. The last lines
printed are the commands that serve with this profile (``deltaserve serve`` and the engine's own server line it
runs; the reference host has no server), carrying the settings the profile was taken under: a server started with others looks up
another profile key (dtype, device) or runs steps the profile never measured.

Reuse: a stored profile is keyed by (host, engine version, model, device, dtype) only, not by the sweep
limits it was measured with. A profile calibrated on short prompts would extrapolate Equation I's quadratic
term to long ones, so before reusing a stored profile this command checks that its records reach the
requested limits and recalibrates (saying why) when they do not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the registry imports torch; this module is imported for `deltaserve --help`
    from .model_limits import ModelLimits
    from .driver import HostConfig
    from .registry import HostSpec

__all__ = [
    "add_calibrate_arguments",
    "run_calibrate",
    "check_device",
    "fit_to_model",
    "profile_covers",
    "serve_commands",
]

_DTYPES = ("float32", "bfloat16", "float16")
#: the sweep's limits when the model's config names no context length (and their caps when it does)
_DEFAULT_MAX_PREFILL = 2048
_DEFAULT_MAX_KV = 65536


def check_device(device: str) -> None:
    """Refuse a device this machine does not have, before the host loads weights onto it."""
    if device == "cpu":
        return
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available here; use --device cpu")
        if ":" in device:
            index = device.split(":", 1)[1]
            if not index.isdigit() or int(index) >= torch.cuda.device_count():
                raise ValueError(f"device {device!r} does not exist; this machine has "
                                 f"{torch.cuda.device_count()} CUDA device(s)")
        return
    raise ValueError(f"unknown device {device!r}; use cpu, cuda or cuda:N")


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``calibrate`` options to ``parser`` (called by :func:`deltaserve_core.cli.build_parser`)."""
    parser.add_argument("--host", default="reference", help="registered host name (see `deltaserve hosts`)")
    parser.add_argument("--model", default="tiny",
                        help="checkpoint folder, or a shortcut: 'tiny' (random-weight test Llama, built locally) "
                             "or 'smollm2' (SmolLM2-135M-Instruct, fetched on first use)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default=None, choices=_DTYPES,
                        help="engine dtype (default: the model's, from its config.json; float32 if it names none)")
    parser.add_argument("--force", action="store_true",
                        help="recalibrate even when a stored profile matches this host, model, device and dtype")
    parser.add_argument("--store", type=Path, default=None, metavar="DIR",
                        help="profile directory (default: $DELTASERVE_PROFILE_DIR or ~/.cache/deltaserve/profiles)")
    parser.add_argument("--max-prefill", type=int, default=None, metavar="TOKENS",
                        help="largest prompt tokens per step in the sweep (the host's per-step token budget; "
                             f"default: {_DEFAULT_MAX_PREFILL}, at most the model's context length - 1)")
    parser.add_argument("--max-decode", type=int, default=64, metavar="N", help="largest decode batch in the sweep")
    parser.add_argument("--max-kv", type=int, default=None, metavar="TOKENS",
                        help="largest total KV tokens of a decode batch in the sweep (one decode row gets all of it, "
                             f"so default: {_DEFAULT_MAX_KV}, at most the model's context length - 2)")
    parser.add_argument("--max-ft", type=int, default=None, metavar="TOKENS",
                        help="largest fine-tuning tokens per step (default: the host's limit)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the fit quality and coefficients as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (logs, CI)")


def profile_covers(profile: Any, max_prefill: int, max_decode: int, max_kv: int, max_ft: int | None) -> list[str]:
    """What the requested sweep limits reach that ``profile``'s records do not (empty: it covers them).

    Called before reusing a stored profile. The comparison allows the sweep's own rounding (a limit is
    covered when some record reaches at least 90 % of it): :func:`~deltaserve_core.calibration.build_sweep`
    splits and caps values, so records rarely hit a limit exactly.
    """
    records = profile.records
    reach = {
        "prefill tokens per step": max((sum(r.prefill_lengths) for r in records), default=0),
        "decode batch": max((r.num_decode for r in records), default=0),
        "KV tokens": max((r.kv_tokens for r in records), default=0),
        "fine-tuning tokens per step": max((sum(r.finetune_lengths) for r in records), default=0),
    }
    wanted = {"prefill tokens per step": max_prefill, "decode batch": max_decode, "KV tokens": max_kv,
              "fine-tuning tokens per step": max_ft or 0}
    return [f"{name} {wanted[name]} (profile reaches {reach[name]})" for name in wanted
            if wanted[name] and reach[name] < 0.9 * wanted[name]]


def _check_limits(args: argparse.Namespace) -> None:
    for flag in ("max_prefill", "max_decode", "max_kv"):
        value = getattr(args, flag)
        unset_means_model_default = flag != "max_decode"
        if (value is None and not unset_means_model_default) or (value is not None and value <= 0):
            raise ValueError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")
    if args.max_ft is not None and args.max_ft < 0:
        raise ValueError(f"--max-ft must be >= 0, got {args.max_ft}")
    if args.max_prefill is not None and args.max_prefill < 2:
        raise ValueError("--max-prefill must be at least 2 tokens")


def fit_to_model(args: argparse.Namespace, model_path: Path) -> ModelLimits:
    """Fill ``args``' unset ``--dtype``, ``--max-prefill`` and ``--max-kv`` from the model's config and refuse set
    ones its context cannot hold; returns the model's :class:`~deltaserve_core.model_limits.ModelLimits`.

    Called after the model is resolved and before the host starts. A refused value raises ``ValueError`` naming
    the flag, the value, the model's context length (and the config key it came from) and the largest value that
    works."""
    from .model_limits import model_limits

    limits = model_limits(model_path)
    if args.dtype is None:
        args.dtype = limits.dtype or "float32"
    context = limits.context_length
    for flag, default, largest, why in (
            ("max_prefill", _DEFAULT_MAX_PREFILL, limits.max_prompt,
             "a prompt of {v} tokens plus the token its prefill samples"),
            ("max_kv", _DEFAULT_MAX_KV, limits.max_decode_context,
             "one decode row with {v} tokens of context plus the 2 tokens it generates")):
        value = getattr(args, flag)
        if value is None:
            setattr(args, flag, default if largest is None else min(default, largest))
        elif largest is not None and value > largest:
            name = f"--{flag.replace('_', '-')}"
            raise ValueError(f"{name} {value} does not fit the model: {why.format(v=value)} exceed its context length "
                             f"{context} ({limits.context_key} in {limits.config_path}); use {name} {largest} or "
                             f"less (or leave {name} out: it defaults to what the model holds)")
    return limits


def _quality_dict(q: Any) -> dict[str, Any] | None:
    return None if q is None else q.to_dict()


def run_calibrate(args: argparse.Namespace) -> int:
    """Create the host, load or run its calibration, print the fit quality; returns the exit status.

    Called by ``deltaserve calibrate``. Raises ``ValueError`` / ``FileNotFoundError`` / ``UnknownHostError``
    for input the user must fix (``cli.main`` turns them into one line and status 2); a failing profiling
    step surfaces as :class:`~deltaserve_core.calibration.CalibrationError`, which is reported here with
    status 1 because it is the host's failure, not the command line's.
    """
    from .assets import resolve_model
    from .calibration import (CalibrationError, ProfileKey, ProfileStore, format_quality, install_calibration_adapter,
                              load_or_calibrate)
    from .driver import HostConfig
    from .registry import create_host, get_host_spec
    from .types import ExecutionMode

    _check_limits(args)
    spec = get_host_spec(args.host)  # unknown host: fail before building or loading a model
    problem = spec.version_problem()
    if problem:
        raise ValueError(f"host {args.host!r}: {problem}")
    check_device(args.device)
    model_path = resolve_model(args.model)
    fit_to_model(args, model_path)

    # The host's per-step token budget must admit the sweep's largest prompt; never shrink its default. Its request
    # limit must admit the sweep's widest steps (a decode batch with a prompt, fine-tuning rows beside them): a
    # step cut to the limit would be recorded as a smaller one, and the next run would find the profile short of
    # --max-decode and recalibrate.
    config = HostConfig(model=str(model_path), device=args.device, dtype=args.dtype,
                        max_batch_tokens=max(_DEFAULT_MAX_PREFILL, args.max_prefill),
                        max_running_requests=max(32, args.max_decode + 1 + -(-args.max_prefill // 64)))
    host = create_host(args.host, config)
    try:
        host_modes = host.capabilities().graph_modes
        store = ProfileStore(args.store)
        key = ProfileKey.for_host(host)
        force = bool(args.force)
        reused = False
        if not force:
            stored = store.load(key)
            if stored is not None:
                gaps = profile_covers(stored, args.max_prefill, args.max_decode, args.max_kv, args.max_ft)
                if gaps:
                    print(f"stored profile {store.path_for(key)} does not cover the requested "
                          f"{'; '.join(gaps)}: recalibrating", file=sys.stderr)
                    force = True
                else:
                    reused = True
        started = time.perf_counter()
        try:
            if not reused:
                install_calibration_adapter(host)
            profile = load_or_calibrate(host, store, force=force, progress=not args.no_progress,
                                        max_prefill_tokens=args.max_prefill, max_decode_batch=args.max_decode,
                                        max_kv=args.max_kv, max_ft_tokens=args.max_ft)
        except CalibrationError as exc:
            print(f"deltaserve calibrate: {exc}", file=sys.stderr)
            return 1
        elapsed = time.perf_counter() - started
    finally:
        host.shutdown()

    path = store.path_for(key)
    print(format_quality(profile))
    print()
    for mode in ExecutionMode:
        q = profile.quality.get(mode)
        if q is None:
            continue
        print(f"{mode.value}: in-sample MAPE {_pct(q.mape)}, p95 {_pct(q.p95_ape)}, n={q.n}"
              + (f" ({q.dropped} outliers excluded)" if q.dropped else ""))
    if reused:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(profile.created_at))
        print(f"reused the stored profile from {when}: {path} (--force recalibrates)")
    else:
        print(f"profile saved to {path} ({len(profile.records)} steps, {elapsed:.1f}s)")

    if args.json is not None:
        _write_json(args.json, _summary(profile, path, reused, args, model_path, host_modes))
        print(f"summary written to {args.json}")
    print()
    lines = serve_commands(spec, config, args.store)
    if not lines:
        print(f"the {spec.name} host has no server of its own (`deltaserve demo --host {spec.name}` co-serves a "
              "replayed request stream on it)")
        return 0
    print("serve with this profile (the settings it was taken under; job.yaml is your job):")
    for line in lines:
        print(f"  {line}")
    return 0


def serve_commands(spec: HostSpec, config: HostConfig, store: Path | None) -> list[str]:
    """The commands that start a server on the profile calibrated for ``config`` (a :class:`HostConfig`).

    Where the host's engine has a server (:attr:`HostSpec.operator_command
    <deltaserve_core.registry.HostSpec.operator_command>`): ``deltaserve serve``, which checks the job and then runs
    the engine's own server line, and that line itself. Each carries the settings that select the profile (model
    path, dtype, device) and that shape the steps it measured (the per-step token budget, the LoRA rank); a
    ``--store`` other than the default is passed on as ``DELTASERVE_PROFILE_DIR``, where the servers look. None
    for a host without a server (the reference host)."""
    import shlex

    if not spec.operator_command:
        return []
    env = f"DELTASERVE_PROFILE_DIR={shlex.quote(str(Path(store).resolve()))} " if store is not None else ""
    words = ["deltaserve", "serve", "--host", spec.name, str(config.model), "--job", "job.yaml",
             "--dtype", config.dtype, "--device", config.device, "--max-batch-tokens", str(config.max_batch_tokens),
             "--max-lora-rank", str(config.max_lora_rank)]
    return [env + shlex.join(words), env + spec.load_operator_command()(config, "job.yaml").shell()]


def _summary(profile: Any, path: Path, reused: bool, args: argparse.Namespace, model_path: Path,
             host_modes: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from .latency_model import Equation
    from .types import ExecutionMode

    modes: dict[str, Any] = {}
    for mode in ExecutionMode:
        if mode not in host_modes:
            continue  # the other mode's fallback coefficients are never used on this host
        q = profile.quality.get(mode)
        equations = {}
        for equation in Equation:
            coef = profile.model.coefficients(mode, equation)
            equations[equation.value] = {
                "source": profile.model.source(mode, equation),
                "coefficients": None if coef is None else asdict(coef),
                "quality": _quality_dict(profile.model.equation_quality(mode, equation)),
            }
        modes[mode.value] = {"quality": _quality_dict(q), "equations": equations}
    return {
        "command": "deltaserve calibrate",
        "argv": sys.argv,
        "key": asdict(profile.key),
        "model_path": str(model_path),
        "profile_path": str(path),
        "reused": reused,
        "created_at": profile.created_at,
        "steps": len(profile.records),
        "unusable_steps": profile.skipped,
        "sweep_elapsed_s": profile.elapsed_s,
        "limits": {"max_prefill": args.max_prefill, "max_decode": args.max_decode, "max_kv": args.max_kv,
                   "max_ft": args.max_ft},
        "modes": modes,
    }


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.2f}%"
