"""``deltaserve serve``: one host, one fine-tuning job, an OpenAI-compatible HTTP endpoint. The operator path.

    deltaserve serve --host vllm MODEL --job job.yaml [--port 8000] [--host-addr 127.0.0.1] [--api-key KEY]

Threads:

- the *engine thread* (:mod:`.serve_engine`) owns the host and the :class:`~deltaserve_core.coserve.CoServer` and makes every call
  into them (hosts are not thread-safe: vLLM's ``submit`` may not run while ``step`` does). Its loop: take new
  requests from a thread-safe inbox and ``host.submit`` them; ``host.step()`` while clients have work; otherwise
  ``host.run_idle_step()``, so the job fine-tunes in idle time; ``co.poll()`` for housekeeping.
- the *HTTP threads* (:mod:`.serve_http`; stdlib ``ThreadingHTTPServer``: no web framework is needed for three JSON endpoints, and the
  reference host must serve without vLLM's dependencies) parse requests, tokenize, put them in the inbox and
  wait for their outputs.
- the main thread handles SIGINT/SIGTERM: stop accepting, let in-flight requests finish, write the final
  checkpoint, stop the backward process, exit 0. A second Ctrl-C abandons in-flight requests (answered 503).

Endpoints: ``POST /v1/completions`` (greedy only), ``GET /v1/models``, ``GET /deltaserve/status``, ``GET /metrics``
(Prometheus, :mod:`.metrics`), ``GET /health``.
With an API key (``--api-key`` or ``DELTASERVE_API_KEY``) every endpoint but ``/health`` needs
``Authorization: Bearer <key>`` (:func:`authorized`), as vLLM's own server does under ``--api-key``. All policy
(admission, training, checkpoints, publishing) is in the core; this module checks the command line and the job,
then starts and stops the threads.
"""

from __future__ import annotations

import argparse
import http.server
import logging
import signal
import sys
import threading
import time
from typing import Any

from .serve_engine import EngineLoop, InferenceStats, ShuttingDown  # noqa: F401  (ShuttingDown: re-exported)
from .serve_http import (  # noqa: F401  (_HttpError, authorized: re-exported; tests import them from here)
    API_KEY_ENV,
    _Frontend,
    _handler_class,
    _HttpError,
    _Server,
    authorized,
    resolve_api_key,
)

__all__ = ["API_KEY_ENV", "EngineLoop", "InferenceStats", "add_serve_arguments", "authorized", "resolve_api_key",
           "run_serve"]


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="transformers checkpoint folder (also: smollm2, tiny; see `deltaserve demo`)")
    p.add_argument("--job", required=True, help="job YAML: dataset, adapter, LoRA, optimizer, SLOs, checkpoints")
    p.add_argument("--host", default="vllm", help="registered host: vllm (default) or reference")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host-addr", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-batch-tokens", type=int, default=2048, help="tokens per engine step (prompt limit too)")
    p.add_argument("--max-lora-rank", type=int, default=16,
                   help="largest LoRA rank the engine holds (the job's lora.r must not exceed it)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="engine-specific host option")
    p.add_argument("--log-every", type=float, default=10.0, help="seconds between progress log lines")
    p.add_argument("--shutdown-timeout", type=float, default=120.0,
                   help="seconds the final checkpoint may wait for a running backward batch")
    p.add_argument("--api-key", default=None,
                   help=f"require `Authorization: Bearer KEY` on every endpoint but /health (default: "
                        f"${API_KEY_ENV}; none: no authentication)")


# ------------------------------------------------------------------------------------------------ wiring


def _host_options(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--option {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    from .job_config import load_job_config
    from .preflight import check_job, check_local_files

    # Everything an operator can get wrong is checked before an engine or a process starts, the checks that need
    # no torch first: a mistyped job is refused before seconds of imports.
    job = load_job_config(args.job)
    api_key = resolve_api_key(args.api_key)
    rank_fix = f"or start with --max-lora-rank {job.lora.r}"
    check_job(job, None, max_lora_rank=args.max_lora_rank, how_to_raise_rank=rank_fix)
    from .assets import resolve_model

    model_dir = resolve_model(args.model)
    # the model's module names, from its safetensors headers (or its config.json on the meta device): refused
    # in seconds rather than after the engine and the backward have started
    check_job(job, model_dir)
    check_local_files(job)  # last: proving checkpoint.dir writable imports torch
    from .driver import HostConfig
    from .registry import HostUnavailableError, get_host_spec

    spec = get_host_spec(args.host)
    problem = spec.version_problem()
    if problem:
        raise HostUnavailableError(f"host {args.host!r}: {problem}")
    config = HostConfig(model=str(model_dir), device=args.device, dtype=args.dtype,
                        max_lora_rank=args.max_lora_rank, max_batch_tokens=args.max_batch_tokens,
                        options=_host_options(args.option))
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        hf_config = AutoConfig.from_pretrained(model_dir)
    except OSError as exc:
        raise FileNotFoundError(f"model {args.model!r}: {exc}") from exc
    max_pos = int(getattr(hf_config, "max_position_embeddings", 2048))
    eos = getattr(hf_config, "eos_token_id", None)
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    httpd = _Server((args.host_addr, args.port), http.server.BaseHTTPRequestHandler, bind_and_activate=False)
    try:
        httpd.server_bind()  # a busy port fails now, not after calibration; clients are refused until ready
    except OSError as exc:
        httpd.server_close()
        raise ValueError(f"cannot listen on {args.host_addr}:{args.port}: {exc.strerror or exc}") from exc

    holder: dict[str, Any] = {}
    ready = threading.Event()
    received: list[int] = []  # signals, appended by the handler; the main thread acts on them

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)  # no locks here: the handler may interrupt the main thread anywhere

    def force_requested() -> bool:  # a second Ctrl-C; repeated SIGTERMs (timeout, systemd) stay graceful
        return received.count(signal.SIGINT) >= 2

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def engine_thread() -> None:
        """Create the host and the controller, serve, then checkpoint and close, all on this thread."""
        from .calibration import ProfileStore
        from .coserve import CoServer
        from .registry import create_host

        host = None
        try:
            host = create_host(args.host, config)
            # Calibration limits as in `deltaserve demo`: the shapes this job and its requests can produce.
            calibration = {"store": ProfileStore(), "max_prefill_tokens": min(job.max_length, max_pos // 2),
                           "max_decode_batch": 16, "max_kv": min(1024, max_pos - 64), "max_ft_tokens": job.max_length}
            co = CoServer(host, job, tokenizer=tokenizer, log_every_s=args.log_every, calibration=calibration)
            with co:
                loop = EngineLoop(host, co, log_every_s=args.log_every)
                holder["loop"] = loop
                ready.set()
                loop.run()
                ckpt = co.final_checkpoint(timeout_s=args.shutdown_timeout)
                holder["final_checkpoint"] = ckpt
                holder["stats"] = co.stats.as_dict()
        except BaseException as exc:  # noqa: BLE001 - main reports it
            holder["error"] = exc
        finally:
            ready.set()
            if host is not None:
                host.shutdown()

    engine = threading.Thread(target=engine_thread, name="deltaserve-engine", daemon=True)
    http_thread: threading.Thread | None = None
    try:
        print(f"[serve] model {model_dir}, host {args.host}, job {args.job} (adapter {job.adapter_name!r}, "
              f"dataset {job.dataset}); starting the engine", flush=True)
        engine.start()
        while not ready.wait(0.2):
            pass
        if "error" in holder:
            raise holder["error"]
        loop: EngineLoop = holder["loop"]
        frontend = _Frontend(loop, tokenizer, args.model, job.adapter_name, int(hf_config.vocab_size), max_pos,
                             eos_ids)
        frontend.base_names.add(str(model_dir))
        httpd.RequestHandlerClass = _handler_class(frontend, loop, api_key)
        if not received:
            try:
                httpd.server_activate()
            except OSError as exc:  # another process took the port during start-up
                raise ValueError(f"cannot listen on {args.host_addr}:{args.port}: {exc.strerror or exc}") from exc
            http_thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                           name="deltaserve-http", daemon=True)
            http_thread.start()
            print(f"[serve] ready: http://{args.host_addr}:{args.port}/v1 (models: {args.model!r}, published "
                  f"versions of {job.adapter_name!r}); status at /deltaserve/status", flush=True)
        while not received and not loop.exited:
            time.sleep(0.1)
        print("[serve] shutting down: no new requests; finishing those in flight (Ctrl-C again to abandon them)",
              flush=True)
        loop.begin_stop()
        if http_thread is not None:
            httpd.shutdown()
        forced = False
        while engine.is_alive():
            engine.join(0.1)
            if force_requested() and not forced:
                forced = True
                print("[serve] abandoning in-flight requests", flush=True)
                loop.stop_now()
        httpd.server_close()  # joins the handler threads: every in-flight answer has been written
        if "error" in holder:
            raise holder["error"]
        if loop.error is not None:
            print(f"[serve] the engine failed: {loop.error}", file=sys.stderr)
            return 1
        if holder.get("final_checkpoint") is None:
            # training since the last checkpoint is lost: an operator's scripts must see that, not exit 0
            print("[serve] stopped without a final checkpoint (see the errors above): the next start resumes from "
                  "the last checkpoint written", file=sys.stderr, flush=True)
            return 1
        ft, inf = holder.get("stats", {}), loop.stats.as_dict()
        attained = "n/a" if inf["slo_attainment"] is None else f"{inf['slo_attainment'] * 100:.1f}%"
        print(f"[serve] stopped: {inf['requests']} requests answered (SLO attainment {attained}); "
              f"fine-tuning {ft.get('optimizer_steps', 0)} optimizer steps, {ft.get('trained_tokens', 0)} tokens; "
              f"final checkpoint {holder.get('final_checkpoint')}", flush=True)
        return 0
    finally:
        if engine.is_alive():  # startup failed in main: let the engine thread finish closing what it opened
            if "loop" in holder:
                holder["loop"].stop_now()
            engine.join(30)
        httpd.server_close()
        for s, h in previous.items():
            signal.signal(s, h)
