"""The client side of a host: how tests, the conformance suite, the demo and benchmarks send it requests.

:class:`HostHooks` is what DeltaServe needs from an engine; :class:`HostDriver` is what *a user of the
engine* does with it (submit greedy requests, collect outputs). Adapters implement both on one object so the
conformance suite can check hook behaviour against client-visible results. Product code paths (the
operator's ``vllm serve``) never go through the driver: clients talk to the engine's own API there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .types import RequestSLO

__all__ = ["ClientRequest", "ClientOutput", "HostDriver", "HostConfig", "InFlightRequests", "check_client_adapter",
           "run_to_completion", "take_kept"]


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``.

    With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included as its last token; with
    ``ignore_eos=True`` (the default) it runs on to ``max_tokens``. Every id of the checkpoint's ``eos_token_id`` is an
    EOS, which is a list in many checkpoints (Llama-3 Instruct, Qwen2.5): a request must stop at any of them, never
    only at the first.

    A ``request_id`` names one request while it is in flight; once its output was returned the id may be submitted
    again, and every hook must then see a new request (its own arrival, no token or token time of the earlier one)."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    adapter: str | None = None
    slo: RequestSLO | None = None
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id!r}: prompt_ids is empty")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True, slots=True)
class ClientOutput:
    """What a client received for one request. Times are ``time.monotonic()`` of the driving process.

    ``arrival_time`` is when ``submit`` (or ``generate``) accepted the request, never when the engine first
    scheduled it (the TTFT a client sees includes its time in the queue). ``token_times``, when given, holds exactly
    one time per token of ``token_ids``, in order and non-decreasing, the first equal to ``first_token_time`` and the
    last to ``finish_time``."""

    request_id: str
    token_ids: tuple[int, ...]
    arrival_time: float
    first_token_time: float
    finish_time: float
    token_times: tuple[float, ...] = ()

    @property
    def ttft_s(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def tpots_s(self) -> tuple[float, ...]:
        times = self.token_times
        return tuple(b - a for a, b in zip(times, times[1:]))


@dataclass(frozen=True)
class HostConfig:
    """How to start a host for tests, the demo and benchmarks (the operator path uses the engine's own CLI).

    ``client_adapters`` maps adapter names clients may use to PEFT folders. ``mixed_batches`` is honoured by
    hosts that can choose (the reference host); others ignore it and report what they do in their
    capabilities. ``options`` carries engine-specific settings (documented by each adapter).
    """

    model: str
    dtype: str = "float32"
    device: str = "cpu"
    max_lora_rank: int = 16
    client_adapters: Mapping[str, str] = field(default_factory=dict)
    mixed_batches: bool | None = None
    max_batch_tokens: int = 2048
    max_running_requests: int = 32
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_lora_rank <= 0:
            raise ValueError("HostConfig.max_lora_rank must be positive")
        if self.max_batch_tokens <= 0:
            raise ValueError("HostConfig.max_batch_tokens must be positive")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"HostConfig.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


@runtime_checkable
class HostDriver(Protocol):
    """Client operations on a running host, in the process that created it."""

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        """Submit ``requests`` (all arrive now) and run the engine until every one has finished.

        Returns exactly one output per request, in request order, never in the order they finished (callers pair
        outputs with requests by position). Steps run meanwhile go through the hooks exactly as
        in serving (so fine-tuning rows may join them). Requests submitted earlier with ``submit`` that finish while it
        runs are not its own: their outputs are never lost and never in its result, the next ``step()`` returns them
        (a server's traffic and a test's ``generate`` share one engine)."""
        ...

    def submit(self, request: ClientRequest) -> None:
        """Enqueue one request without running the engine (for traces and timed arrivals).

        May be called from another thread while ``step()`` runs (a server's request thread): the request then
        joins a later step, never lost (see ``ScheduleInterceptor.on_arrival``). Called so, it returns while the step
        still runs, with on_arrival called: it never waits for the step to end (a lock the step holds, say), since the
        core aborts a fine-tuning-only step for the request only if it hears of it during that step."""
        ...

    def step(self) -> list[ClientOutput]:
        """Run at most one engine step (or, for engines with their own loop, wait for the next one);
        return the requests that finished in it. It never runs several steps in one call (to have something to
        return, say): the core paces fine-tuning admission step by step. It also returns, exactly once, the outputs of
        other requests that finished during an earlier ``generate()`` call (see there) and no call returned yet."""
        ...

    def run_idle_step(self) -> bool:
        """Offer the interceptor a step with no client work (the fine-tuning-only step). Returns whether a
        step executed: True exactly when one ran (its StepRecord reaches the step sink), False when the interceptor
        added nothing. Client requests pending when it is called are never lost: each is served and returned by a
        later ``step()``."""
        ...

    def has_unfinished(self) -> bool:
        """Whether any submitted client request has not finished. Fine-tuning and calibration rows never count: it is
        False once every client request has been returned, whatever ran since. It must answer so from any thread,
        also while a step runs: a request is unfinished from ``submit`` until its output is returned, including while
        the step that admits it executes (a server's idle loop asks it to decide whether to offer a fine-tuning step)."""
        ...

    def shutdown(self) -> None:
        """Stop the engine and free its memory; idempotent: a second call returns without raising, never fails on what
        the first one freed. It returns also with client requests pending (they are dropped, never waited for). It
        never leaves a process or a non-daemon thread the host started running: the process that owns the host must be
        able to exit once it returned. The memory the host took for client requests (their KV cache, their queues) is
        released once it returned, for the dropped requests too: it never keeps them referenced."""
        ...


def check_client_adapter(request: ClientRequest, loaded: Collection[str]) -> None:
    """What every host's ``submit`` must refuse: the reserved fine-tuning adapter, and adapters it never loaded."""
    from .hooks import RESERVED_ADAPTER_NAME, ReservedAdapterError

    if request.adapter == RESERVED_ADAPTER_NAME:
        raise ReservedAdapterError(request.adapter)
    if request.adapter is not None and request.adapter not in loaded:
        raise ValueError(f"request {request.request_id!r}: unknown adapter {request.adapter!r}; loaded: "
                         f"{sorted(a for a in loaded if a != RESERVED_ADAPTER_NAME)}")


def run_to_completion(driver: HostDriver, requests: Sequence[ClientRequest],
                      kept: list[ClientOutput]) -> list[ClientOutput]:
    """``HostDriver.generate`` in terms of ``submit`` and ``step``, for hosts whose ``step`` returns what finished.

    Outputs of other requests that ``step`` returns meanwhile (submitted earlier, or kept by an earlier call) are
    appended to ``kept``, in the order they came. The host's ``step`` returns ``kept`` first (:func:`take_kept`) and
    its ``has_unfinished`` counts it: that is how they reach their client by the next ``step()``
    (HostDriver.generate). ``kept`` holds only outputs no call returned yet, so it does not grow past the requests in
    flight."""
    for r in requests:
        driver.submit(r)
    wanted = {r.request_id for r in requests}
    got: dict[str, ClientOutput] = {}
    while len(got) < len(wanted):
        if not driver.has_unfinished():
            missing = sorted(wanted - set(got))
            raise RuntimeError(f"the engine has no work left but requests {missing} never finished")
        for o in driver.step():
            if o.request_id in wanted:
                got[o.request_id] = o
            else:
                kept.append(o)
    return [got[r.request_id] for r in requests]


def take_kept(kept: list[ClientOutput]) -> list[ClientOutput]:
    """What ``kept`` holds, emptying that very list: ``run_to_completion`` appends to the list object it was handed,
    so a host's ``step`` that rebound its attribute to a fresh list would leave later outputs in the old one."""
    taken = kept[:]
    kept.clear()
    return taken


@dataclass
class _InFlight:
    request: ClientRequest
    arrival_time: float
    token_times: list[float] = field(default_factory=list)


class InFlightRequests:
    """The client requests a driver has submitted and not yet returned, for hosts whose engine reports each
    request's tokens so far: :meth:`update` stamps every new token with the time the driver saw it and builds the
    :class:`ClientOutput` when the request finishes (the entry is then dropped, so nothing grows)."""

    def __init__(self) -> None:
        self._live: dict[str, _InFlight] = {}

    def add(self, request: ClientRequest, now: float) -> None:
        self._live[request.request_id] = _InFlight(request, now)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._live

    def __bool__(self) -> bool:
        return bool(self._live)

    def update(self, request_id: str, tokens: Sequence[int], now: float, finished: bool) -> ClientOutput | None:
        """Record ``tokens`` (all of the request's output so far); its output when ``finished``, else None. An id
        this driver did not submit (a calibration row, a request of the engine's own server) is ignored."""
        live = self._live.get(request_id)
        if live is None:
            return None
        times = live.token_times
        times.extend([now] * (len(tokens) - len(times)))
        if not finished:
            return None
        del self._live[request_id]
        first, last = (times[0], times[-1]) if times else (now, now)
        return ClientOutput(request_id, tuple(int(t) for t in tokens), live.arrival_time, first, last, tuple(times))
