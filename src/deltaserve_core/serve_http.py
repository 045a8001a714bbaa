"""The HTTP side of ``deltaserve serve``: OpenAI-shaped JSON in and out, API-key checks, the threaded server.

The stdlib ``ThreadingHTTPServer`` is enough for three JSON endpoints, and the reference host must serve without
vLLM's dependencies. Handler threads parse and tokenize requests, hand them to the engine thread
(:class:`~deltaserve_core.serve_engine.EngineLoop`) and wait for their outputs; they never call the host.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from .serve_engine import EngineLoop, ShuttingDown

__all__ = ["API_KEY_ENV", "authorized", "resolve_api_key"]

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
    # The stdlib default backlog (5) drops connections when many clients connect at once; engines' own servers
    # queue thousands (uvicorn: 2048).
    request_queue_size = 2048
