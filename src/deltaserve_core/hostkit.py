"""The bookkeeping every engine adapter shares, so an adapter holds only what translates its engine.

An adapter meets its engine at three places (the scheduler, the forward, the output path) and keeps the core's
hook objects where those places can read them. What it does there is the same on every engine and lives here:

- :class:`HookSlots`: the three objects the core installs (interceptor, activation sink, step sink) and the
  calibration switch, as one record an adapter's per-engine state extends; :class:`InstallsHooks`: the three
  installation hooks of :class:`~deltaserve_core.hooks.HostHooks` for a host that keeps them in one.
- :class:`StepPlan` and :meth:`StepPlan.to_record`: what was decided for one step, and the
  :class:`~deltaserve_core.types.StepRecord` it becomes once the engine ran it.
- :class:`TokenClock`: first/last token times of client requests, for the TTFT/TPOT budgets of the next
  :class:`~deltaserve_core.types.ProposedBatch`.
- :class:`ProfileDraw`: the random inputs of a calibration step, seeded by its shape.
- :func:`published_name`, :func:`parse_published_name`, :func:`publish_dir`: how published versions are named and
  where they are kept, for every engine alike; :class:`WithdrawnVersions`: retracted versions still held for the
  requests that run on them.
- :class:`PatchRecord`: the record every run-time patch of an engine carries (why, how, upstream status, when it
  can go); ``deltaserve hosts --patches`` lists them.

Nothing here imports an engine or torch.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from .types import ExecutionMode, FineTuneSample, ProfileShape, StepRecord

if TYPE_CHECKING:
    from .driver import ClientRequest
    from .hooks import ActivationSink, ScheduleInterceptor, StepSink
    from .job_config import JobConfig

__all__ = [
    "HookSlots",
    "InstallsHooks",
    "check_patch_records",
    "profile_seed",
    "published_pattern",
    "PatchRecord",
    "ProfileDraw",
    "StepPlan",
    "TokenClock",
    "WithdrawnVersions",
    "parse_published_name",
    "publish_dir",
    "published_name",
]

_VERSION_SEPARATOR = "@v"


def published_name(adapter_name: str, version: int) -> str:
    """The name clients request a published version by: ``<adapter>@v<step>``. A new name per version, because
    the engines' prefix caches key KV by adapter name, so KV computed with older weights is never served again."""
    return f"{adapter_name}{_VERSION_SEPARATOR}{int(version)}"


def parse_published_name(name: str, adapter_name: str | None = None) -> tuple[str, int] | None:
    """``(adapter, version)`` of a published name, or None when ``name`` is not one (of ``adapter_name``)."""
    head, sep, tail = name.rpartition(_VERSION_SEPARATOR)
    if not sep or not head or not tail.isdigit() or not tail.isascii():
        return None
    if adapter_name is not None and head != adapter_name:
        return None
    return head, int(tail)


def published_pattern(adapter_name: str) -> re.Pattern[str]:
    """A regular expression matching exactly the published names of ``adapter_name`` (the version in group 1)."""
    return re.compile(re.escape(adapter_name) + re.escape(_VERSION_SEPARATOR) + r"(\d+)")


_Handle = TypeVar("_Handle")


class WithdrawnVersions(Generic[_Handle]):
    """Published versions ``retract_adapter`` withdrew while requests submitted on them may still run: the host
    moves a version's engine handle (its weights, its adapter slot) here when it drops the name, looks it up for
    those requests' rows, and frees what :meth:`release` hands back once none of them is left."""

    def __init__(self) -> None:
        self._held: dict[str, _Handle] = {}

    def hold(self, name: str, handle: _Handle) -> None:
        self._held[name] = handle

    def __getitem__(self, name: str) -> _Handle:
        return self._held[name]

    def __bool__(self) -> bool:
        return bool(self._held)

    def __contains__(self, name: object) -> bool:
        return name in self._held

    def release(self, unfinished: Iterable[ClientRequest]) -> list[_Handle]:
        """Forget the versions none of ``unfinished`` (every request the host has not finished) names; returns
        their handles, for the host to free."""
        if not self._held:
            return []
        used = {r.adapter for r in unfinished}
        return [self._held.pop(name) for name in [n for n in self._held if n not in used]]


def publish_dir(job: JobConfig) -> Path:
    """Where a job's published versions are kept (``<adapter>@v<step>`` folders), on every engine: durable across
    restarts and pruned to ``checkpoint.keep``. Servers serve them from here by name."""
    return Path(job.checkpoint.dir) / "published"


@dataclass
class HookSlots:
    """The core's objects as an adapter keeps them for its engine's hooks (extended by each adapter's state)."""

    interceptor: ScheduleInterceptor | None = None
    activation_sink: ActivationSink | None = None
    step_sink: StepSink | None = None
    #: calibration: while set, the interceptor is not consulted; ``profile_samples`` are the next step's rows
    profiling: bool = False
    profile_samples: tuple[FineTuneSample, ...] | None = None


class InstallsHooks:
    """``intercept_schedule``, ``capture_activation`` and ``report_step_time`` for a host whose engine reads the
    core's objects from ``self.hooks`` (a :class:`HookSlots`): each install replaces the previous object and
    ``None`` removes it, as the protocol requires. Hosts that must ship the objects elsewhere (another process)
    write their own."""

    hooks: HookSlots

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        self.hooks.interceptor = interceptor

    def capture_activation(self, sink: ActivationSink | None) -> None:
        self.hooks.activation_sink = sink

    def report_step_time(self, sink: StepSink | None) -> None:
        self.hooks.step_sink = sink


@dataclass
class StepPlan:
    """What the adapter decided for one step, kept until the engine has run it."""

    step_id: int
    samples: dict[str, FineTuneSample] = field(default_factory=dict)  # engine row/request id -> its sample
    prefill_lengths: tuple[int, ...] = ()
    num_decode: int = 0
    kv_tokens: int = 0
    refused: tuple[int, ...] = ()  # samples the interceptor returned that the engine could not place
    synthetic: bool = False
    start: float = 0.0
    duration: float = 0.0
    ran: bool = False

    @property
    def sample_ids(self) -> tuple[int, ...]:
        return tuple(s.sample_id for s in self.samples.values())

    def to_record(self, *, start: float | None = None, duration: float | None = None,
                  mode: ExecutionMode = ExecutionMode.EAGER, aborted: bool = False) -> StepRecord:
        """The step's record. ``aborted``: the forward stopped early, so every row's capture is void and its
        sample goes back to the pool, beside the refused ones."""
        ids = self.sample_ids
        return StepRecord(
            step_id=self.step_id,
            start_time=start if start is not None else (self.start or time.monotonic()),
            duration_s=duration if duration is not None else self.duration,
            mode=mode, prefill_lengths=self.prefill_lengths, num_decode=self.num_decode, kv_tokens=self.kv_tokens,
            finetune_sample_ids=() if aborted else ids,
            finetune_lengths=() if aborted else tuple(s.num_tokens for s in self.samples.values()),
            aborted_sample_ids=(ids if aborted else ()) + self.refused, synthetic=self.synthetic)


class TokenClock:
    """When each client request got its first and its latest token, from the output counts the engine keeps.

    The engines count outputs per request but do not time them; the core's TTFT/TPOT budgets need both times."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float | None, float | None, int]] = {}

    def observe(self, request_id: str, num_outputs: int, now: float | None = None) -> None:
        """Record that ``request_id`` has ``num_outputs`` output tokens now (times move only when it grew)."""
        first, _, seen = self._seen.get(request_id, (None, None, 0))
        if num_outputs > seen:
            t = time.monotonic() if now is None else now
            self._seen[request_id] = (first if first is not None else t, t, num_outputs)

    def times(self, request_id: str) -> tuple[float | None, float | None]:
        """``(first token time, last token time)``, None for a request with no token yet."""
        first, last, _ = self._seen.get(request_id, (None, None, 0))
        return first, last

    def forget(self, request_id: str) -> None:
        self._seen.pop(request_id, None)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._seen

    def __len__(self) -> int:
        return len(self._seen)


def profile_seed(shape: ProfileShape) -> int:
    """The seed of a profile step's random inputs: a shape profiled twice gets the same tokens."""
    return len(shape.prefill_lengths) * 7919 + shape.num_decode


class ProfileDraw:
    """Random token ids for one calibration step (ids from 3 up: below are the usual special tokens)."""

    def __init__(self, shape: ProfileShape, vocab_size: int) -> None:
        self.shape = shape
        self._rng = random.Random(profile_seed(shape))
        self._vocab = int(vocab_size)

    def tokens(self, n: int) -> list[int]:
        return [self._rng.randrange(3, self._vocab) for _ in range(n)]

    def finetune_samples(self) -> tuple[FineTuneSample, ...]:
        """The shape's fine-tuning rows (ids -1, -2, ...: never a dataset sample), every token but the first
        trained on, as a dataset sample would be."""
        return tuple(FineTuneSample(-1 - i, tuple(self.tokens(n)), (False,) + (True,) * (n - 1))
                     for i, n in enumerate(self.shape.finetune_lengths))


@dataclass(frozen=True)
class PatchRecord:
    """One run-time change DeltaServe makes to an engine, and the record it must carry.

    ``target``: what is changed, as the engine spells it; ``how``: the kind of change and its scope (a wrap of
    an instance's or a class's method, a rebound module global, a hook through the engine's own registry);
    ``why``: what DeltaServe needs it for; ``upstream``: what the engine offers instead today, or what was
    proposed; ``remove_when``: the condition under which it can go; ``breaks_if``: the engine changes that break
    it; ``applies``: where it is applied (e.g. ``"engine"``, ``"server"``, ``"launcher"``, ``"cpu"``)."""

    target: str
    how: str
    why: str
    upstream: str
    remove_when: str
    breaks_if: str = ""
    applies: str = "engine"

    def as_row(self) -> dict[str, str]:
        return {"target": self.target, "how": self.how, "why": self.why, "upstream": self.upstream,
                "remove_when": self.remove_when, "breaks_if": self.breaks_if, "applies": self.applies}


def check_patch_records(records: Iterable[PatchRecord]) -> None:
    """Refuse a record with an empty field or a target recorded twice (an adapter's import-time self-check)."""
    seen: set[tuple[str, str]] = set()
    for r in records:
        for name in ("target", "how", "why", "upstream", "remove_when"):
            if not getattr(r, name).strip():
                raise ValueError(f"patch record for {r.target!r}: {name} is empty; every patch says why, how, its "
                                 "upstream status and when it can go")
        if (r.target, r.applies) in seen:
            raise ValueError(f"patch record for {r.target!r} ({r.applies}) appears twice")
        seen.add((r.target, r.applies))
