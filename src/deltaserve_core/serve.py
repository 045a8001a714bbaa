"""``deltaserve serve``: one host, one fine-tuning job, an OpenAI-compatible HTTP endpoint. The operator path.

    deltaserve serve --host vllm MODEL --job job.yaml [--port 8000] [--host-addr 127.0.0.1] [--api-key KEY]

Threads:

- the *engine thread* owns the host and the :class:`~deltaserve_core.coserve.CoServer` and makes every call
  into them (hosts are not thread-safe: vLLM's ``submit`` may not run while ``step`` does). Its loop: take new
  requests from a thread-safe inbox and ``host.submit`` them; ``host.step()`` while clients have work; otherwise
  ``host.run_idle_step()``, so the job fine-tunes in idle time; ``co.poll()`` for housekeeping.
- the *HTTP threads* (stdlib ``ThreadingHTTPServer``: no web framework is needed for three JSON endpoints, and the
  reference host must serve without vLLM's dependencies) parse requests, tokenize, put them in the inbox and
  wait for their outputs.
- the main thread handles SIGINT/SIGTERM: stop accepting, let in-flight requests finish, write the final
  checkpoint, stop the backward process, exit 0. A second Ctrl-C abandons in-flight requests (answered 503).

Endpoints: ``POST /v1/completions`` (greedy only), ``GET /v1/models``, ``GET /deltaserve/status``, ``GET /metrics``
(Prometheus, :mod:`.metrics`), ``GET /health``.
With an API key (``--api-key`` or ``DELTASERVE_API_KEY``) every endpoint but ``/health`` needs
``Authorization: Bearer <key>`` (:func:`authorized`), as vLLM's own server does under ``--api-key``. All policy
(admission, training, checkpoints, publishing) is in the core; this module only wires.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.server
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["API_KEY_ENV", "EngineLoop", "InferenceStats", "add_serve_arguments", "authorized", "resolve_api_key",
           "run_serve"]

log = logging.getLogger("deltaserve.serve")

#: Request fields that would change the output and that this endpoint does not implement: refused with a 400
#: rather than silently ignored. Value: the default the field may carry.
_UNSUPPORTED = {"stream": False, "n": 1, "best_of": 1, "logprobs": None, "echo": False, "suffix": None,
                "stop": None, "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None}
#: Accepted and without effect under greedy decoding.
_IGNORED = {"top_p", "top_k", "seed", "user", "stream_options"}
#: environment variable holding the server's API key (``--api-key`` wins): a key on the command line is visible
#: to every user of the machine in ``ps``, one in the environment only to the server's user.
API_KEY_ENV = "DELTASERVE_API_KEY"
#: paths answered without the API key: a load balancer's liveness probe carries no credentials.
_OPEN_PATHS = frozenset({"/health"})


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


def authorized(header: str | None, api_key: str | None) -> bool:
    """Whether an ``Authorization`` header value grants access to a server with ``api_key`` (None: no key).

    The digests are compared, in constant time: neither the key's length nor a matching prefix shows in the
    time the answer takes."""
    if not api_key:
        return True
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return hmac.compare_digest(hashlib.sha256(token.strip().encode()).digest(),
                               hashlib.sha256(api_key.encode()).digest())


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


# ------------------------------------------------------------------------------------------------ engine side


@dataclass
class _Pending:
    """One client request on its way through the engine thread; the HTTP thread waits on ``done``."""

    request: Any  # ClientRequest
    done: threading.Event = field(default_factory=threading.Event)
    output: Any = None  # ClientOutput
    error: BaseException | None = None
    status: int = 400  # HTTP status when ``error`` is set


@dataclass
class _Call:
    """A function the engine thread runs between steps (reads of controller state)."""

    fn: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class ShuttingDown(RuntimeError):
    """The server no longer accepts requests."""


@dataclass
class InferenceStats:
    """Running SLO attainment of answered requests (same definitions as ``deltaserve demo``)."""

    ttft_s: float
    tpot_s: float
    requests: int = 0
    ttft_ok: int = 0
    tpot_ok: int = 0
    both_ok: int = 0
    sum_ttft_s: float = 0.0
    max_tpot_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    refused: int = 0

    def add(self, output: Any, prompt_tokens: int) -> None:
        worst = max(output.tpots_s, default=0.0)
        a, b = output.ttft_s <= self.ttft_s, worst <= self.tpot_s
        self.requests += 1
        self.ttft_ok += a
        self.tpot_ok += b
        self.both_ok += a and b
        self.sum_ttft_s += output.ttft_s
        self.max_tpot_s = max(self.max_tpot_s, worst)
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += len(output.token_ids)

    def as_dict(self) -> dict[str, Any]:
        n = self.requests
        frac = (lambda k: k / n) if n else (lambda k: None)
        return {"requests": n, "slo_attainment": frac(self.both_ok), "ttft_attainment": frac(self.ttft_ok),
                "tpot_attainment": frac(self.tpot_ok), "mean_ttft_s": self.sum_ttft_s / n if n else None,
                "max_tpot_s": self.max_tpot_s, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "refused": self.refused,
                "slo": {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}}


class EngineLoop:
    """The serve loop. Every host and controller call happens in :meth:`run`, on one thread.

    Other threads only use :meth:`submit`, :meth:`call`, :meth:`begin_stop` and :meth:`stop_now`.
    """

    def __init__(self, host: Any, coserver: Any, *, log_every_s: float = 10.0) -> None:
        self.host = host
        self.co = coserver
        self.stats = InferenceStats(coserver.job.slo.ttft_s, coserver.job.slo.tpot_s)
        self.log_every_s = log_every_s
        #: snapshot for /v1/models (a resumed job has published already), replaced (never mutated) by the loop
        self.published: tuple[str, ...] = tuple(coserver.stats.published)
        self.error: BaseException | None = None
        self._inbox: queue.Queue[_Pending | _Call] = queue.Queue()
        self._live: dict[str, _Pending] = {}
        self._lock = threading.Lock()  # accepting flag + inbox puts vs. the loop's decision to exit
        self._accepting = True
        self._abandon = False
        self._exited = False
        self._last_log = time.monotonic()
        self._logged_requests = 0
        from .metrics import JobMetrics

        self.metrics = JobMetrics(coserver)

    # -- other threads ------------------------------------------------------------------------------------

    def submit(self, request: Any) -> _Pending:
        pending = _Pending(request)
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            self._inbox.put(pending)
        return pending

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        c = _Call(fn)
        with self._lock:
            if self._exited:
                raise ShuttingDown("the engine loop has stopped")
            self._inbox.put(c)
        if not c.done.wait(timeout):
            raise TimeoutError("the engine thread did not answer in time")
        if c.error is not None:
            raise c.error
        return c.result

    def begin_stop(self) -> None:
        """Refuse new requests; the loop exits once every accepted one is answered."""
        with self._lock:
            self._accepting = False
        self._inbox.put(_Call(lambda: None))  # wake the loop

    def stop_now(self) -> None:
        """Abandon in-flight requests too (a second signal)."""
        self._abandon = True
        self.begin_stop()

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def exited(self) -> bool:
        return self._exited

    # -- engine thread --------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported to every waiter and to main
            log.exception("engine loop failed")
            self.error = exc
            self._fail_all(RuntimeError(f"the engine failed: {exc}"), 500)
        finally:
            with self._lock:
                self._accepting = False
                self._exited = True
            self._fail_all(ShuttingDown("the server is shutting down"), 503)

    def _loop(self) -> None:
        host, co = self.host, self.co
        while True:
            self._drain()
            if self._abandon:
                self._fail_all(ShuttingDown("the server shut down before this request finished"), 503)
                return
            if not self._accepting:
                with self._lock:
                    if self._inbox.empty() and not self._live:
                        return
            if host.has_unfinished():
                for out in host.step():
                    self._deliver(out)
            elif self._accepting and not co.finished and host.run_idle_step():
                pass  # a fine-tuning-only step ran in idle time
            else:
                co.poll()
                self._wait(0.003 if self._accepting and not co.finished else 0.05)
            if co.stats.published[-1:] != list(self.published[-1:]):  # pruning keeps the count constant
                self.published = tuple(co.stats.published)
            self._maybe_log()

    def _wait(self, timeout: float) -> None:
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return
        self._handle(item)

    def _drain(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(item)

    def _handle(self, item: _Pending | _Call) -> None:
        if isinstance(item, _Call):
            try:
                item.result = item.fn()
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                item.error = exc
            item.done.set()
            return
        rid = item.request.request_id
        try:
            self.host.submit(item.request)
        except ValueError as exc:  # unknown adapter, prompt too long for the engine, ...
            self.stats.refused += 1
            item.error, item.status = exc, 400
            item.done.set()
            return
        except Exception as exc:  # this request fails, the others keep being served
            log.exception("host.submit failed for %s", rid)
            item.error, item.status = exc, 500
            item.done.set()
            return
        self._live[rid] = item

    def _deliver(self, output: Any) -> None:
        item = self._live.pop(output.request_id, None)
        if item is None:
            return
        self.stats.add(output, len(item.request.prompt_ids))
        item.output = output
        item.done.set()

    def _fail_all(self, exc: BaseException, status: int) -> None:
        items = list(self._live.values())
        self._live.clear()
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if isinstance(item, _Call):
                item.error = exc
            else:
                item.error, item.status = exc, status
            item.done.set()

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < self.log_every_s or self.stats.requests == self._logged_requests:
            return
        self._last_log, self._logged_requests = now, self.stats.requests
        s = self.stats.as_dict()
        log.info("inference: %d requests answered, SLO attainment %.1f%% (TTFT %.1f%%, TPOT %.1f%%), "
                 "mean TTFT %.3f s, max TPOT %.3f s, %d in flight", s["requests"], s["slo_attainment"] * 100,
                 s["ttft_attainment"] * 100, s["tpot_attainment"] * 100, s["mean_ttft_s"], s["max_tpot_s"],
                 len(self._live))

    def metrics_text(self) -> tuple[bytes, str]:
        """``GET /metrics``: the job's Prometheus metrics (:mod:`.metrics`) and their content type. Any thread."""
        from .metrics import SnapshotCollector, render_text

        return render_text(SnapshotCollector(lambda: (self.metrics.job, self.metrics.sample())))

    def status(self) -> dict[str, Any]:
        """Job and inference progress (runs on the engine thread, through :meth:`call`)."""
        co = self.co
        ft = co.stats.as_dict()
        losses = ft.pop("losses")
        ft["recent_losses"] = losses[-20:]
        return {"adapter_name": co.job.adapter_name, "finished": co.finished, "finetune": ft,
                "pool": co.pool.progress(), "inference": self.stats.as_dict(), "in_flight": len(self._live),
                "estimator_mape": ft["estimator_mape"], "published": list(co.stats.published),
                "accepting": self._accepting}


# ------------------------------------------------------------------------------------------------ HTTP side


class _HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class _Frontend:
    """Turns JSON requests into :class:`ClientRequest` objects and outputs back into OpenAI-shaped JSON."""

    def __init__(self, loop: EngineLoop, tokenizer: Any, model_name: str, adapter_name: str, vocab_size: int,
                 max_model_len: int, eos_ids: set[int]) -> None:
        self.loop = loop
        self.tokenizer = tokenizer
        self._tok_lock = threading.Lock()  # fast tokenizers are not safe to call from several threads at once
        self.model_name = model_name
        self.base_names = {model_name}
        self.adapter_name = adapter_name
        from .job_config import LATEST_SUFFIX

        self.latest_alias = adapter_name + LATEST_SUFFIX
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_ids = eos_ids
        self.started = int(time.time())

    def models(self) -> dict[str, Any]:
        published = list(self.loop.published)
        names = [self.model_name] + published + ([self.latest_alias] if published else [])
        data = [{"id": n, "object": "model", "created": self.started, "owned_by": "deltaserve",
                 "root": self.model_name, "parent": None if i == 0 else self.model_name}
                for i, n in enumerate(names)]
        return {"object": "list", "data": data}

    def _adapter_for(self, model: Any) -> str | None:
        if model is None:
            return None
        if not isinstance(model, str):  # before any set lookup: a list is unhashable and answered 500
            raise _HttpError(400, f"'model' must be a string, got {type(model).__name__}")
        if model in self.base_names:
            return None
        published = self.loop.published
        if model in published:
            return model
        if model in (self.adapter_name, self.latest_alias):  # the job's newest published version
            latest = [p for p in published if p.split("@", 1)[0] == self.adapter_name]
            if latest:
                return latest[-1]
            raise _HttpError(404, f"adapter {model!r} has not been published yet; see GET /deltaserve/status",
                             "model_not_found")
        raise _HttpError(404, f"model {model!r} not found; available: {[self.model_name, *published]}",
                         "model_not_found")

    def completion(self, body: Any) -> dict[str, Any]:
        from .driver import ClientRequest

        if not isinstance(body, dict):
            raise _HttpError(400, "the request body must be a JSON object")
        temperature = body.get("temperature")
        if temperature is not None and (not isinstance(temperature, (int, float)) or temperature != 0):
            raise _HttpError(400, f"only greedy decoding is supported: temperature must be 0 or omitted, got "
                                  f"{temperature!r}")
        for key, default in _UNSUPPORTED.items():
            value = body.get(key)
            if value is not None and value != default and not (isinstance(value, (list, dict, str)) and not value):
                raise _HttpError(400, f"{key!r} is not supported by deltaserve serve (greedy, non-streaming "
                                      f"completions only); omit it")
        unknown = set(body) - set(_UNSUPPORTED) - _IGNORED - {"model", "prompt", "max_tokens", "temperature",
                                                              "ignore_eos"}
        if unknown:
            raise _HttpError(400, f"unknown field(s) {sorted(unknown)}")
        adapter = self._adapter_for(body.get("model"))
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _HttpError(400, f"'max_tokens' must be an integer >= 1, got {max_tokens!r}")
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise _HttpError(400, "'ignore_eos' must be true or false")
        prompt_ids = self._prompt_ids(body.get("prompt"))
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise _HttpError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the "
                                  f"model's context length ({self.max_model_len})")
        rid = f"cmpl-{uuid.uuid4().hex}"
        try:
            request = ClientRequest(rid, tuple(prompt_ids), max_tokens, adapter=adapter, ignore_eos=ignore_eos)
        except ValueError as exc:
            raise _HttpError(400, str(exc)) from exc
        try:
            pending = self.loop.submit(request)
        except ShuttingDown as exc:
            raise _HttpError(503, str(exc), "unavailable") from exc
        while not pending.done.wait(1.0):
            if self.loop.exited and not pending.done.is_set():
                raise _HttpError(503, "the engine stopped", "unavailable")
        if pending.error is not None:
            raise _HttpError(pending.status, str(pending.error),
                             "invalid_request_error" if pending.status == 400 else "server_error")
        tokens = list(pending.output.token_ids)
        with self._tok_lock:
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        finish = "stop" if (tokens and tokens[-1] in self.eos_ids and not ignore_eos) or len(tokens) < max_tokens \
            else "length"
        return {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": adapter or self.model_name,
                "choices": [{"index": 0, "text": text, "token_ids": tokens, "logprobs": None,
                             "finish_reason": finish}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(tokens),
                          "total_tokens": len(prompt_ids) + len(tokens)}}

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if not prompt:
                raise _HttpError(400, "'prompt' is empty")
            with self._tok_lock:
                return list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise _HttpError(400, f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
            return list(prompt)
        if isinstance(prompt, list) and len(prompt) > 1:
            raise _HttpError(400, "batched prompts are not supported: send one request per prompt")
        raise _HttpError(400, "'prompt' must be a non-empty string or a non-empty list of token ids")


def _handler_class(frontend: _Frontend, loop: EngineLoop,
                   api_key: str | None = None) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "deltaserve"
        # Keep-alive, as OpenAI clients expect (a new TCP connection per request costs them a handshake). The
        # socket timeout is also the idle keep-alive timeout (uvicorn's default, 5 s): a client that stops
        # sending holds a thread that long, and a stop waits at most that long for idle connections.
        protocol_version = "HTTP/1.1"
        timeout = 5

        def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, payload: Any) -> None:
            self._send_bytes(status, json.dumps(payload).encode(), "application/json")

        def _send_bytes(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            if self.close_connection or not loop.accepting:
                self.send_header("Connection", "close")  # also sets close_connection
            self.end_headers()
            self.wfile.write(data)

        def _error(self, err: _HttpError) -> None:
            # the request's body may be unread: the connection cannot carry another request
            self.close_connection = True
            self._send(err.status, {"error": {"message": str(err), "type": err.kind, "code": err.status}})

        def _authorize(self, path: str) -> None:
            # before anything else reads the request: an unauthenticated client learns nothing, not even whether
            # the path exists
            if path not in _OPEN_PATHS and not authorized(self.headers.get("Authorization"), api_key):
                raise _HttpError(401, "a valid API key is required: send `Authorization: Bearer <key>`",
                                 "authentication_error")

        def do_GET(self) -> None:  # stdlib name
            path = self.path.split("?", 1)[0].rstrip("/")
            try:
                self._authorize(path)
                if path == "/v1/models":
                    self._send(200, frontend.models())
                elif path == "/deltaserve/status":
                    try:
                        self._send(200, loop.call(loop.status))
                    except (ShuttingDown, TimeoutError) as exc:
                        raise _HttpError(503, str(exc), "unavailable") from exc
                elif path == "/health":
                    self._send(200 if loop.accepting else 503, {"accepting": loop.accepting})
                elif path == "/metrics":
                    # sampled on this thread, not the engine's: a scrape never waits for a step (or a stop)
                    self._send_bytes(200, *loop.metrics_text())
                else:
                    raise _HttpError(404, f"no such endpoint: GET {path}", "not_found")
            except _HttpError as err:
                self._error(err)

        def do_POST(self) -> None:  # stdlib name
            path = self.path.split("?", 1)[0].rstrip("/")
            try:
                self._authorize(path)
                if path != "/v1/completions":
                    raise _HttpError(404, f"no such endpoint: POST {path} (chat completions are not supported)",
                                     "not_found")
                length = int(self.headers.get("Content-Length") or 0)
                if length <= 0 or length > 16 * 1024 * 1024:
                    raise _HttpError(400, "a JSON body (with Content-Length, at most 16 MiB) is required")
                try:
                    body = json.loads(self.rfile.read(length))
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise _HttpError(400, f"the body is not valid JSON: {exc}") from exc
                self._send(200, frontend.completion(body))
            except _HttpError as err:
                self._error(err)
            except Exception as exc:  # a bug must answer 500, not drop the connection
                log.exception("error answering %s", path)
                self._error(_HttpError(500, f"internal error: {exc}", "server_error"))

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins handler threads: in-flight answers are written before exit
    block_on_close = True
    # The stdlib default backlog (5) dropped a fifth of 64 concurrent connections; engines' own servers queue
    # thousands (uvicorn: 2048).
    request_queue_size = 2048


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
