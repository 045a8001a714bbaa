"""``deltaserve serve``: a thin launcher over an engine's own server with DeltaServe switched on.

    deltaserve serve [--host vllm|sglang|slora] MODEL --job job.yaml [--port 8000] [--host-addr 127.0.0.1]
                     [--api-key KEY] [--print-command] [-- ENGINE_ARGS...]

The engines ship HTTP servers operators already run, monitor and trust (vLLM's OpenAI server, SGLang's, S-LoRA's):
DeltaServe attaches to them as a plugin (the job in the engine's own process, its metrics on the engine's
``/metrics``, the jobs routes on its app). This command only saves the operator the spelling: it checks everything an
operator can get wrong before anything loads (the job file, its dataset and checkpoint folder, the model's modules
against the job's targets, the rank, the engine's version, the port), then *replaces itself* (``exec``) with the
engine's server command (:attr:`HostSpec.operator_command <deltaserve_core.registry.HostSpec.operator_command>`,
the line ``deltaserve calibrate`` prints): signals, exit status and stop behaviour (final checkpoint on SIGTERM)
are the engine server's, and no DeltaServe process sits between clients and the engine.

The reference host has no server of its own (it is the contract's executable specification, not a serving
engine): ``deltaserve demo --host reference`` co-serves a replayed request stream on it.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .registry import ServerCommand

__all__ = ["API_KEY_ENV", "add_serve_arguments", "build_command", "resolve_api_key", "run_serve"]

#: environment variable holding the server's API key (``--api-key`` wins): a key on the command line is visible
#: to every user of the machine in ``ps``, one in the environment only to the server's user.
API_KEY_ENV = "DELTASERVE_API_KEY"


def resolve_api_key(option: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The server's API key: ``--api-key`` if given, else :data:`API_KEY_ENV`; None (or empty in the
    environment): no authentication. An empty or blank ``--api-key`` is refused (``ValueError``): it would
    silently turn authentication off."""
    if option is not None:
        if not option.strip():
            raise ValueError("--api-key: the key is empty; give a key, or leave the option out to serve without one")
        return option
    value = (os.environ if environ is None else environ).get(API_KEY_ENV, "")
    return value if value.strip() else None


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="transformers checkpoint folder (also: smollm2, tiny; see `deltaserve demo`)")
    p.add_argument("--job", required=True, help="job YAML: dataset, adapter, LoRA, optimizer, SLOs, checkpoints")
    p.add_argument("--host", default="vllm", help="engine whose server runs: vllm (default), sglang or slora")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host-addr", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-batch-tokens", type=int, default=2048,
                   help="tokens per engine step (vLLM's max_num_batched_tokens, SGLang's chunked-prefill size)")
    p.add_argument("--max-lora-rank", type=int, default=16,
                   help="largest LoRA rank the engine holds (the job's lora.r must not exceed it)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="host option the calibration ran with (e.g. kv_cache_space_gib=4 for vLLM-CPU)")
    p.add_argument("--api-key", default=None,
                   help=f"the engine server requires `Authorization: Bearer KEY` (default: ${API_KEY_ENV}; none: no "
                        "authentication)")
    p.add_argument("--print-command", action="store_true",
                   help="print the engine's server command (the key as a variable reference) and exit")
    # arguments after `--` go to the engine's server as given (cli.main splits them off)
    p.set_defaults(engine_args=[])


def _host_options(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--option {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _check_port(addr: str, port: int) -> None:
    """A busy port fails now, in a second, not after the engine spent minutes loading the model."""
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"--host-addr {addr!r}: {exc.strerror or exc}; give an address of this machine, e.g. "
                         "127.0.0.1") from exc
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the engines' servers bind
        try:
            s.bind(where)
        except OSError as exc:
            raise ValueError(f"--port {port}: cannot listen on {addr}:{port} ({exc.strerror or exc}); stop what "
                             "holds it or choose another --port") from exc


def build_command(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServerCommand:
    """Check the command line and the job, and return the engine's
    :class:`~deltaserve_core.registry.ServerCommand`. Raises (``ValueError``, ``JobConfigError``,
    ``HostUnavailableError``, ``FileNotFoundError``) with the key, the value and the fix; starts nothing."""
    from .job_config import load_job_config
    from .preflight import check_job, check_local_files

    # the checks that need no torch first (the job, then the model's modules from its safetensors headers): a
    # mistyped job is refused before seconds of imports; the host's entry point and the writable checkpoint folder
    # (which imports torch) after them
    job = load_job_config(args.job)
    api_key = resolve_api_key(args.api_key, environ)
    check_job(job, None, max_lora_rank=args.max_lora_rank,
              how_to_raise_rank=f"or start with --max-lora-rank {job.lora.r}")
    from .assets import resolve_model

    model_dir = resolve_model(args.model)
    if not Path(model_dir, "config.json").is_file():
        raise FileNotFoundError(f"model {args.model!r}: {model_dir} has no config.json; give a transformers "
                                "checkpoint folder (or tiny / smollm2)")
    check_job(job, model_dir)  # the target modules against the model's safetensors headers, before it loads
    from .registry import HostUnavailableError, get_host_spec

    spec = get_host_spec(args.host)
    if not spec.operator_command:
        raise ValueError(f"--host {args.host}: the {args.host} host has no server of its own; serve with --host "
                         "vllm or --host sglang, or co-serve a replayed request stream with `deltaserve demo --host "
                         f"{args.host}`")
    problem = spec.version_problem()
    if problem:
        raise HostUnavailableError(f"host {args.host!r}: {problem}")
    check_local_files(job)
    _check_port(args.host_addr, args.port)
    from .driver import HostConfig

    config = HostConfig(model=str(model_dir), device=args.device, dtype=args.dtype,
                        max_lora_rank=args.max_lora_rank, max_batch_tokens=args.max_batch_tokens,
                        options=_host_options(args.option))
    # absolute: the job's own relative paths (dataset, checkpoint folder) stay relative to the job file's folder
    return spec.load_operator_command()(config, str(Path(args.job).resolve()), listen=(args.host_addr, args.port),
                                        api_key=api_key, jobs_api=True, extra=list(args.engine_args))


def run_serve(args: argparse.Namespace) -> int:
    """Check, print the engine's command, then exec it (returns only with ``--print-command``)."""
    command = build_command(args)
    line = command.shell()
    if args.print_command:
        print(line)
        return 0
    print(f"[serve] {line}", flush=True)
    argv = command.resolved_argv()
    env = dict(os.environ, **command.env)
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)
    return 1  # not reached: exec replaced this process
