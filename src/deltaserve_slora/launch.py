"""The operator path: S-LoRA's own API server, started with DeltaServe in its router process.

::

    deltaserve calibrate --host slora --model /models/llama-mha --device cuda --dtype float16     # once
    python -m deltaserve_slora.launch --job job.yaml [--slora-path /path/to/S-LoRA] -- \\
        --model_dir /models/llama-mha --lora-dirs /adapters/a --pool-size-lora 4096 --port 8000 ...

Everything after ``--`` is S-LoRA's own ``slora.server.api_server`` command line, unchanged except that ``--swap``
is added when missing (adapters paged into S-LoRA's unified pool, the configuration DeltaServe is tested in).
Before anything starts this process refuses, with the fix: a bad job file, S-LoRA options DeltaServe cannot run
with (``--tp`` > 1, another scheduler, ``--enable-abort``, ``--bmm`` and the other debug switches), a grouped-query
``--model_dir`` (S-LoRA has no LoRA path for narrow k/v; serve the MHA copy ``layout.write_mha_checkpoint``
writes), a missing or untested S-LoRA checkout, and a missing calibration profile.

How DeltaServe gets into the router process: S-LoRA's ``api_server.main`` spawns its router with the module-level
name ``start_router_process`` as the target. The launcher points that name at :func:`router_process` (a
:mod:`functools` partial carrying :class:`LaunchSettings`, picklable under spawn). In the router process it wraps
``RouterManager.wait_to_model_ready`` so that, once S-LoRA built its router and (TP=1, in-process)
``ModelRpcServer``, :class:`RouterRuntime` attaches -- the same :class:`~deltaserve_slora.host.SloraHooks` and
patches the in-process host uses, the stored latency profile, a :class:`~deltaserve_core.coserve.CoServer` on the
job -- and then runs S-LoRA's own ``start_router_process``. S-LoRA reports 'init ok' only after that, so a failure
stops the server with the traceback. Every wrap is in :data:`deltaserve_slora.patches.PATCHES`.

Idle time: the router's ``loop_for_fwd`` is replaced by one that steps again at once after a fine-tuning-only
step and otherwise waits S-LoRA's 10 ms. Shutdown: SIGINT/SIGTERM stop the router loop at a step boundary, the
job's final checkpoint is written, and the launcher waits for it before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltaserve_core.runtime import EngineRuntime, route_logs
from deltaserve_core.job_config import JobConfigError, load_job_config

from .locate import SloraCheckout, SloraNotFoundError, activate, locate_slora

__all__ = ["LaunchSettings", "RouterRuntime", "build_parser", "check_slora_args", "detokenization_process", "main",
           "operator_command",
           "parse_args", "profile_key", "router_process"]

log = logging.getLogger("deltaserve.slora.launch")

#: S-LoRA options that select code paths the patches do not cover (flag -> why).
_REFUSED_FLAGS: dict[str, str] = {
    "--enable-abort": "its AbortReqQueue forms batches differently from the ReqQueue the patches wrap",
    "--bmm": "LoraBmmInfer bypasses the LoraUnorderedBatchInfer path the capture wraps",
    "--no-lora": "fine-tuning rows need S-LoRA's LoRA path",
    "--no-kernel": "fine-tuning rows need S-LoRA's LoRA path",
    "--no-lora-compute": "fine-tuning rows need the LoRA computed",
    "--no-mem-pool": "the fine-tuning adapter's rows are written into S-LoRA's memory pool",
    "--no-lora-swap": "a debug switch of S-LoRA's adapter swapping",
    "--dummy": "dummy weights cannot be fine-tuned against",
    "--prefetch": "prefetched adapters are loaded asynchronously, past the rows DeltaServe writes",
    "--profile": "it profiles for the 'pets' scheduler only",
}
_CHECKED = ("--model_dir", "--tp", "--scheduler", "--batch-num-adapters", "--swap", "--lora-dirs", *_REFUSED_FLAGS)
_CALIBRATE = "deltaserve calibrate --host slora --model {model} --device cuda --dtype float16"


@dataclass(frozen=True)
class LaunchSettings:
    """What the router process needs from the launcher (pickled into it)."""

    job: str  # absolute path of the validated job file
    slora_root: str
    model_path: str  # S-LoRA's --model_dir, resolved: the calibration profile's model
    log_every_s: float = 10.0
    checkpoint_timeout_s: float = 60.0


def operator_command(config: Any, job_path: str, *, listen: tuple[str, int] | None = None,
                     api_key: str | None = None, jobs_api: bool = False, extra: Sequence[str] = ()) -> Any:
    """This launcher's command for ``config`` (a :class:`~deltaserve_core.driver.HostConfig`) and the job file
    ``job_path``; the keywords as :class:`~deltaserve_core.registry.HostSpec` describes them. S-LoRA's own
    arguments follow ``--``: the model folder, the step budget the profile was taken under, and ``extra``, which
    must name the ``--lora-dirs`` S-LoRA's server needs (:func:`check_slora_args` refuses none).

    S-LoRA's server has no API key and no jobs routes: a key is refused (``ValueError``) rather than ignored, since
    an operator giving one expects the server to require it."""
    from deltaserve_core.registry import ServerCommand

    del jobs_api
    if api_key is not None:
        raise ValueError("--api-key: S-LoRA's server has no API key; serve it on 127.0.0.1 behind a proxy that "
                         "checks one, or leave the option (and DELTASERVE_API_KEY) out")
    words = ["python", "-m", "deltaserve_slora.launch", "--job", job_path]
    if config.options.get("slora_path"):
        words += ["--slora-path", str(config.options["slora_path"])]
    words += ["--", "--model_dir", str(config.model), "--batch_max_tokens", str(config.max_batch_tokens)]
    if listen is not None:
        words += ["--host", listen[0], "--port", str(listen[1])]
    return ServerCommand(tuple(words + list(extra)))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m deltaserve_slora.launch",
        description="Start S-LoRA's own API server with DeltaServe co-serving a fine-tuning job in its router "
                    "process. Arguments after -- are S-LoRA's (python -m slora.server.api_server --help).",
        allow_abbrev=False)
    p.add_argument("--job", required=True, help="the fine-tuning job file (YAML, same as every host)")
    p.add_argument("--slora-path", default=None,
                   help="S-LoRA checkout with its extension built (else $DELTASERVE_SLORA_PATH, else an importable "
                        "slora)")
    p.add_argument("--log-every-s", type=float, default=10.0, help="interval of the fine-tuning progress line")
    p.add_argument("--checkpoint-timeout-s", type=float, default=60.0,
                   help="how long shutdown waits for a running training batch before the final checkpoint")
    return p


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``argv`` at the first ``--``: the launcher's options before it, S-LoRA's arguments after it."""
    argv = list(argv)
    if "--" not in argv:
        build_parser().error("separate S-LoRA's arguments with --, e.g. --job job.yaml -- --model_dir PATH")
    i = argv.index("--")
    return build_parser().parse_args(argv[:i]), argv[i + 1:]


def _slora_view(slora_argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--model_dir", default=None)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--scheduler", default="slora")
    p.add_argument("--batch-num-adapters", type=int, default=None)
    p.add_argument("--swap", action="store_true")
    p.add_argument("--lora-dirs", action="append", default=[])
    for flag in _REFUSED_FLAGS:
        p.add_argument(flag, action="store_true")
    for token in slora_argv:
        name = token.split("=", 1)[0]
        if not name.startswith("--") or len(name) <= 2 or name in _CHECKED:
            continue
        # S-LoRA's parser accepts abbreviations; this check must see the same options it does
        abbreviates = [f for f in _CHECKED if f.startswith(name)]
        if abbreviates:
            raise ValueError(f"write S-LoRA's option {name} in full ({' or '.join(abbreviates)}): DeltaServe checks "
                             "these options before S-LoRA starts")
    ns, _ = p.parse_known_args(slora_argv)
    return ns


def check_slora_args(slora_argv: Sequence[str]) -> tuple[list[str], Path]:
    """Refuse S-LoRA options DeltaServe cannot run with (``ValueError`` naming the fix); returns the arguments to
    start S-LoRA with and its resolved ``--model_dir``."""
    argv = list(slora_argv)
    ns = _slora_view(argv)
    if not ns.model_dir:
        raise ValueError("S-LoRA needs --model_dir (after --): the checkpoint folder it serves")
    if ns.tp != 1:
        raise ValueError(f"DeltaServe on S-LoRA runs one GPU per server (--tp 1; got --tp {ns.tp}): its ModelRpcServer "
                         "must live in the router process; run one server per GPU instead")
    if ns.scheduler != "slora" or ns.batch_num_adapters is not None:
        raise ValueError(f"DeltaServe wraps S-LoRA's default scheduler (--scheduler slora, no --batch-num-adapters); "
                         f"got --scheduler {ns.scheduler}"
                         + (f" --batch-num-adapters {ns.batch_num_adapters}" if ns.batch_num_adapters else ""))
    for flag, why in _REFUSED_FLAGS.items():
        if getattr(ns, flag.lstrip("-").replace("-", "_")):
            raise ValueError(f"drop {flag}: DeltaServe cannot co-serve with it ({why})")
    if not ns.lora_dirs:
        # api_server.main's print_mem_stats divides by len(args.lora_dirs): the server would die after loading
        raise ValueError("S-LoRA's API server needs at least one --lora-dirs ADAPTER_DIR (it divides by their "
                         "count at start-up); pass a client adapter folder")
    model = Path(ns.model_dir).expanduser().resolve()
    if "llama" not in ns.model_dir.split("/")[-1].lower():
        # api_server.main sizes the model by its folder name (print_mem_stats -> mprophet ModelConfig) and raises
        # NotImplementedError unless it names a Llama: the server would die right after loading the model.
        raise ValueError(f"--model_dir {ns.model_dir}: S-LoRA's API server only starts for a folder whose name "
                         "contains 'llama' (it sizes the model by that name); rename or symlink it, e.g. "
                         f"{model.parent / (model.name + '-llama')}, and pass that (without a trailing /)")
    cfg_path = model / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"--model_dir {ns.model_dir}: no config.json there (a Hugging Face checkpoint folder)")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(f"S-LoRA serves Llama checkpoints only; {model} is model_type={cfg.get('model_type')!r}")
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if kv is not None and kv != heads:
        raise ValueError(
            f"{model} is grouped-query ({kv} K/V heads for {heads} heads); S-LoRA has no LoRA path for narrow k/v. "
            "Serve its exact MHA expansion: python -c \"from pathlib import Path; from deltaserve_slora.layout import "
            f"write_mha_checkpoint; write_mha_checkpoint(Path('{model}'), Path('{model}-mha'))\" and pass "
            f"--model_dir {model}-mha (and calibrate that folder)")
    if not ns.swap:
        argv.append("--swap")
        log.info("DeltaServe: --swap added (adapters are paged into S-LoRA's unified memory pool)")
    return argv, model


def profile_key(checkout: SloraCheckout, model_path: str) -> Any:
    """The calibration profile key of the server this starts: what ``deltaserve calibrate --host slora --model
    MODEL --device cuda --dtype float16`` stores (the in-process host keys its profile the same way)."""
    from deltaserve_core.calibration import ProfileKey

    from .host import engine_version

    return ProfileKey(host="slora", engine_version=engine_version(checkout), model=model_path, device="cuda",
                      dtype="float16")


def _load_profile(key: Any) -> Any:
    from deltaserve_core.runtime import stored_profile

    return stored_profile(key, _CALIBRATE.format(model=key.model) + " (with the same S-LoRA: DELTASERVE_SLORA_PATH)")


# ------------------------------------------------------------------------------------------ router process

def _route_logs() -> None:
    """S-LoRA configures no logging: DeltaServe's lines (progress, publishing, faults) go to stderr, marked."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[deltaserve router] %(asctime)s %(levelname)s %(message)s"))
    route_logs([handler], ("deltaserve", "deltaserve_core", "deltaserve_slora"))


class RouterRuntime(EngineRuntime):
    """DeltaServe inside S-LoRA's router process: attaches to the router, co-serves, checkpoints on stop."""

    def __init__(self, settings: LaunchSettings, checkout: SloraCheckout, applied: Sequence[str] = ()) -> None:
        """``applied``: the operator-path wraps already in place (the launcher's and the router-start wrap)."""
        super().__init__(settings.job, engine="slora", grace_s=2 * settings.checkpoint_timeout_s, where="S-LoRA's router process",
                         log_every_s=settings.log_every_s)
        self.settings = settings
        self.checkout = checkout
        self.router: Any = None
        self.hooks: Any = None
        self.applied: list[str] = list(applied)
        from .patches import uninstall, uninstall_operator

        # after the final checkpoint, in this order (whether or not attach got as far as patching)
        self.on_stop(self._close_sockets)
        self.on_stop(lambda: shutil.rmtree(self.work_dir, ignore_errors=True))
        self.on_stop(uninstall_operator)
        self.on_stop(uninstall)

    def attach(self, router: Any) -> None:
        """``RouterManager.wait_to_model_ready`` calls this once S-LoRA's model server exists."""
        from deltaserve_core.calibration import ProfileKey

        from .host import SloraHooks
        from .patches import PATCHES, install_arrivals, install_idle_loop

        if router.world_size != 1:
            raise RuntimeError("DeltaServe needs S-LoRA's ModelRpcServer in the router process (--tp 1)")
        self.router = router
        hooks = SloraHooks()
        hooks._init_hooks(checkout=self.checkout, model_path=self.settings.model_path,
                          served_dir=Path(router.model_weightdir), work_dir=self.work_dir, device="cuda",
                          max_lora_rank=self.job.lora.r, max_batch_tokens=router.input_params.batch_max_tokens,
                          publish_dir=self.publish_root)
        profile = _load_profile(ProfileKey.for_host(hooks))  # the launcher checked the same key; before any patch
        hooks._attach(router)
        self.hooks = hooks
        # S-LoRA's API server has no metrics endpoint
        self.start(hooks, latency_model=profile.model, metrics=False)
        self.applied += hooks.installed + install_arrivals(router, hooks.channel, hooks.client_adapter_dir) + install_idle_loop(
            router, hooks.channel, self.wants_idle_step, lambda: self.stopping, self.request_stop)
        missing = [p.target for p in PATCHES if p.target not in self.applied]
        if missing:
            raise RuntimeError(f"deltaserve_slora: recorded patches not applied: {missing}")
        log.info("patches applied in S-LoRA's router process (%d/%d): %s", len(self.applied), len(PATCHES),
                 ", ".join(self.applied))

    def wants_idle_step(self) -> bool:
        """Step again at once after a fine-tuning-only step? While the job has work and no stop was asked."""
        return not self.stopping and self.coserver is not None and not self.coserver.finished

    def request_stop(self) -> None:
        if not self.stopping:
            log.info("stop requested: the router stops after this step, then the final checkpoint is written")
        self.begin_stop()

    def stop_timeout_s(self) -> float:
        return self.settings.checkpoint_timeout_s

    def _close_sockets(self) -> None:
        # Unsent messages to a detokenizer that is gone would hold the process at exit (ZMQ's default linger).
        for name in ("send_to_detokenization", "recv_from_httpserver"):
            sock = getattr(self.router, name, None) if self.router is not None else None
            if sock is not None and hasattr(sock, "close"):
                sock.close(linger=0)


def router_process(settings: LaunchSettings, args: Any, router_port: int, detokenization_port: int,
                   model_rpc_ports: list[int], mode: Any, pipe_writer: Any) -> None:
    """S-LoRA's router process with DeltaServe: what ``api_server.main`` spawns in place of its
    ``start_router_process`` (same arguments after ``settings``), which this then runs.

    It first restores S-LoRA's module-level ``setting`` from ``args``: ``api_server.main`` writes ``nccl_port`` and
    ``max_req_total_len`` there in the launcher process only, and a spawned process re-imports the defaults (nccl
    port 28765, 5120 tokens), so S-LoRA's own server ignores ``--nccl_port`` (two servers on one machine collide:
    EADDRINUSE) and ``--max_req_total_len`` in its router."""
    _route_logs()
    checkout = locate_slora(settings.slora_root)
    activate(checkout)
    from slora.common.configs.config import setting
    from slora.server.router import manager

    setting["nccl_port"] = args.nccl_port
    setting["max_req_total_len"] = args.max_req_total_len

    from .patches import PATCHES, install_router_start

    # the launcher process's wraps (api_server.main's spawn targets)
    runtime = RouterRuntime(settings, checkout, applied=[PATCHES[7].target, PATCHES[13].target])
    runtime.applied += install_router_start(manager.RouterManager, runtime.attach)
    try:
        manager.start_router_process(args, router_port, detokenization_port, model_rpc_ports, mode, pipe_writer)
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass  # a stop: the loop ended at a step boundary (or start-up was interrupted)
    finally:
        # The final checkpoint is not cut short by a second signal; the launcher bounds the wait.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        runtime.stop()


def detokenization_process(*args: Any) -> None:
    """S-LoRA's detokenizer process: what ``api_server.main`` spawns in place of its
    ``start_detokenization_process`` (same arguments). S-LoRA's calls ``asyncio.get_event_loop()`` with no loop set,
    which uvloop >= 0.22 refuses (Python >= 3.12 no longer makes one implicitly); this sets a fresh loop of the
    policy S-LoRA installed (uvloop), then runs S-LoRA's function unchanged."""
    # import first: S-LoRA's module installs uvloop's policy at import, and a loop set before that is the old
    # policy's, which uvloop's get_event_loop does not see
    from slora.server.detokenization.manager import start_detokenization_process

    asyncio.set_event_loop(asyncio.new_event_loop())
    start_detokenization_process(*args)


# ------------------------------------------------------------------------------------------ launcher process

def _stop_children(timeout_s: float) -> None:
    """Stop S-LoRA's router and detokenizer processes (they are not daemons): SIGTERM makes the router write the
    final checkpoint; anything still alive after ``timeout_s`` is killed."""
    children = [p for p in multiprocessing.active_children() if p.is_alive()]
    for p in children:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    for p in children:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            print(f"deltaserve_slora.launch: {p.name} (pid {p.pid}) did not stop within {timeout_s:.0f} s; killing it",
                  file=sys.stderr)
            p.kill()
            p.join(5)


def _sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m deltaserve_slora.launch``; returns the exit status (2: refused before anything started)."""
    logging.basicConfig(level=logging.INFO, format="[deltaserve] %(levelname)s %(message)s")
    opts, slora_argv = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        job_path = str(Path(opts.job).expanduser().resolve())
        job = load_job_config(job_path)  # refuses a bad job file, naming the field and the fix
        slora_argv, model = check_slora_args(slora_argv)
        from deltaserve_core.preflight import check_job

        check_job(job, model)  # target modules against the model folder, resume against the checkpoint
        checkout = locate_slora(opts.slora_path)
        activate(checkout)
        _load_profile(profile_key(checkout, str(model)))
    except (JobConfigError, SloraNotFoundError, ValueError, RuntimeError, FileNotFoundError) as exc:
        print(f"deltaserve_slora.launch: {exc}", file=sys.stderr)
        return 2
    settings = LaunchSettings(job=job_path, slora_root=str(checkout.root), model_path=str(model),
                              log_every_s=opts.log_every_s, checkpoint_timeout_s=opts.checkpoint_timeout_s)
    import torch.multiprocessing

    torch.multiprocessing.set_start_method("spawn", force=True)  # as S-LoRA's own __main__ does (CUDA children)
    from slora.server import api_server

    from .patches import install_server_entry

    install_server_entry(api_server, functools.partial(router_process, settings), detokenization_process)
    sys.argv = [str(api_server.__file__), *slora_argv]
    signal.signal(signal.SIGTERM, _sigterm)
    log.info("starting S-LoRA's API server (%s) with DeltaServe: job %s", checkout.describe(), job_path)
    try:
        api_server.main()
    except KeyboardInterrupt:
        pass
    finally:
        _stop_children(settings.checkpoint_timeout_s + 60.0)
    return 0


if __name__ == "__main__":
    # Run through the package module, so the router process (spawned) unpickles deltaserve_slora.launch names.
    from deltaserve_slora.launch import main as _main

    sys.exit(_main())
