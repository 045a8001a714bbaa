"""One fine-tuning job over N data-parallel engine replicas: ranks, the shared sample order, and global steps.

Each replica (rank) co-serves exactly as a single one does: its own admission over its own SLOs, its own activation
buffer and its own backward process. What they share lives in one ``torch.distributed.TCPStore`` (hosted by rank
0's controller, reached by every rank's controller and backward process at ``data_parallel.rendezvous``):

* **the sample order** (:class:`RankPool`): every rank computes the same order of each epoch (the single replica's
  :class:`~deltaserve_core.finetune_data.FinetunePool` order, a pure function of data and seed) and takes runs of
  ``claim_samples`` positions from it with one atomic ``TCPStore.add`` on a per-epoch cursor, no collective. The runs
  are disjoint and cover the epoch, so no sample is trained twice or skipped per epoch, whichever rank admits it.
  Admission then walks only the rank's own claimed samples, shortest first, as Algorithm 1 wants.
* **global optimizer steps** (:class:`GradientExchange`, used only inside the backward processes, never on the
  inference path): a backward process accumulates its parts as in the single-replica path (summed token losses,
  normalizer 1) and adds their tokens to the open step's counter. The part that pushes the counter across
  ``backward_batch_tokens`` (the *global* step size: the optimizer hyperparameters mean what they mean on one
  replica) closes the step. Every live rank then posts what it holds (possibly nothing), one rank's proposal of who
  is in becomes the step's decision through an atomic ``compare_set``, and every rank sums the included
  contributions in rank order in fp32, divides by their total target tokens and applies the same AdamW step. A
  rank that has nothing posts an empty contribution at once, so a starved rank never holds the others back, and
  no rank's inference ever waits for another rank.

Exactness: the update of a global step equals :func:`~deltaserve_core.peft_steps.plain_peft_step` on the union of
the included ranks' samples (the loss is a sum over target tokens divided by their total, so summing per-rank
gradient sums and dividing once is the same gradient), and every rank's forward of those samples ran on the
adapter of the previous global step: a part forwarded on an older adapter is refused by its backward process
(``stale``) and goes back to the rank's pool to be forwarded again.

Faults (details in docs/scaling.md): a closed step waits for a live rank's contribution at most
``step_timeout_s``; a rank whose backward process died stops heart-beating and is not waited for once its heartbeat
is older than ``heartbeat_timeout_s``. A late contribution is left out of the decision; its rank still applies the
decided step (it reads the others' contributions from the store) and re-admits its own samples, so every rank's
adapter stays identical. Every step's contributions stay in the store for ``keep_steps`` steps: a restarted backward
loads its newest checkpoint and replays the decided steps after it, bit for bit, before it joins again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from .finetune_data.pool import FinetunePool, _sample_ids
from .job_config import DataParallelSpec, JobConfig, JobConfigError
from .types import FineTuneSample

__all__ = ["ENV_RANK", "Contribution", "DataParallelRank", "ExchangeResult", "GradientExchange", "RankPool",
           "connect_store", "for_engine", "parse_rendezvous", "resolve_rank"]

log = logging.getLogger("deltaserve.data_parallel")

#: bytes per store value of a contribution (the store's server refuses values over 8 MiB)
_CHUNK = 4 << 20

#: the environment variable that tells a replica its rank (every replica reads the same job file)
ENV_RANK = "DELTASERVE_DP_RANK"


def parse_rendezvous(value: str) -> tuple[str, int]:
    """``host:port`` of ``data_parallel.rendezvous`` as ``(host, port)``; :class:`JobConfigError` names the key."""
    host, sep, port = (value or "").rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise JobConfigError(f"job config: data_parallel.rendezvous: must be host:port with a port in 1..65535, "
                             f"got {value!r}; e.g. 10.0.0.1:29555 (rank 0's host)")
    return host, int(port)


def resolve_rank(spec: DataParallelSpec, env: Mapping[str, str] | None = None, engine_rank: int | None = None) -> int:
    """This replica's rank: ``engine_rank`` (the engine's own data-parallel rank, where an adapter passes it), else
    ``$DELTASERVE_DP_RANK``. Refused with the key, the value and the fix when missing or out of range."""
    if not spec.enabled:
        return 0
    env = os.environ if env is None else env
    raw: object = engine_rank if engine_rank is not None else env.get(ENV_RANK)
    if raw is None:
        raise JobConfigError(f"job config: data_parallel.world_size is {spec.world_size} but this replica has no "
                             f"rank: set {ENV_RANK} to 0..{spec.world_size - 1} in each replica's environment")
    try:
        rank = int(str(raw))
    except ValueError:
        raise JobConfigError(f"{ENV_RANK}={raw!r} is not an integer; set it to 0..{spec.world_size - 1}") from None
    if not 0 <= rank < spec.world_size:
        raise JobConfigError(f"{ENV_RANK}={rank} is outside 0..{spec.world_size - 1} "
                             f"(data_parallel.world_size: {spec.world_size}); give each replica its own rank")
    if not spec.rendezvous:
        raise JobConfigError(f"job config: data_parallel.rendezvous: required with world_size {spec.world_size} when "
                             "the replicas are separate servers: set it to host:port of rank 0's host, e.g. "
                             "10.0.0.1:29555 (an engine that runs the replicas itself, `vllm serve "
                             "--data-parallel-size N` on one node, derives it)")
    return rank


def for_engine(job: JobConfig, engine_size: int, *, rendezvous: str | None, flag: str) -> JobConfig:
    """``job`` for an engine that runs ``engine_size`` data-parallel replicas itself (one CoServer in each), which
    then pass their engine ranks as ``engine_rank``: one job spans them, never ``engine_size`` independent copies.

    ``data_parallel.world_size`` left at 1 is taken from the engine, a different value is refused; a missing
    ``data_parallel.rendezvous`` becomes ``rendezvous`` (the engine's own choice; None where the engine cannot
    make one, e.g. replicas on several nodes, and the file must name it). ``flag``: how the operator sets the
    engine's size, for the messages. Refused with the key, the value and the fix, before anything starts."""
    spec = job.data_parallel
    if engine_size <= 1:
        return job  # separate servers, or none: the file and DELTASERVE_DP_RANK say
    if spec.world_size not in (1, engine_size):
        raise JobConfigError(f"job config: data_parallel.world_size is {spec.world_size}, but the engine runs "
                             f"{engine_size} data-parallel replicas ({flag} {engine_size}) and the job spans them: "
                             f"set data_parallel.world_size to {engine_size} or leave it out (it is then taken "
                             f"from {flag}), or start the engine with {flag} {spec.world_size}")
    address = spec.rendezvous or rendezvous
    if not address:
        raise JobConfigError(f"job config: data_parallel.rendezvous: required with {flag} {engine_size} here: the "
                             "engine's replicas do not all run under this server, so it cannot choose one; set it "
                             "to host:port reachable from every replica on the first replica's host, e.g. "
                             "10.0.0.1:29555")
    try:
        return replace(job, data_parallel=replace(spec, world_size=engine_size, rendezvous=address))
    except JobConfigError as exc:  # e.g. periodic checkpoints off, which data parallelism needs
        raise JobConfigError(f"{exc} (data parallelism from {flag} {engine_size})") from None


@dataclass(frozen=True)
class DataParallelRank:
    """What a rank's controller and backward process need to reach the job's store (picklable: it is sent to the
    spawned backward process)."""

    spec: DataParallelSpec
    rank: int
    #: key prefix in the store: two jobs over one store never mix (the adapter name)
    namespace: str
    #: a rank whose backward has not beaten for this long is not waited for
    heartbeat_timeout_s: float = 10.0
    #: connecting to the store and every store call give up after this long (a fault, not a hang)
    store_timeout_s: float = 30.0

    @property
    def world_size(self) -> int:
        return self.spec.world_size


def connect_store(dp: DataParallelRank, *, host: bool = False) -> Any:
    """The job's store, under the job's key prefix. ``host=True`` (rank 0's controller) starts the server; the other
    controllers and every backward process connect to it as clients."""
    from torch.distributed import PrefixStore, TCPStore

    addr, port = parse_rendezvous(dp.spec.rendezvous)
    from datetime import timedelta

    store = TCPStore(addr, port, is_master=host, wait_for_workers=False,
                     timeout=timedelta(seconds=dp.store_timeout_s))
    # the prefix view holds the store it wraps, so a hosted server lives as long as the view
    return PrefixStore(f"deltaserve/{dp.namespace}/", store)


# ---------------------------------------------------------------------------------------------- the sample order


class RankPool:
    """This rank's share of the job's samples: an :class:`~deltaserve_core.admission.AdmissionPool` over the samples
    it claimed from the global order, with the methods the co-serving loop calls on a
    :class:`~deltaserve_core.finetune_data.FinetunePool` (``complete``, ``finished``, ``progress``...).

    Claims are runs of ``claim_samples`` consecutive positions of the epoch's global order, taken with one
    ``store.add`` on the epoch's cursor when fewer than half a run is admissible here; the run is the rank's until it
    is trained. A rank moves to the next epoch once the global cursor is past the end of the epoch and its own
    samples of it are done (so one sample id is never in flight twice on one rank); other ranks may still be
    training the end of the earlier epoch meanwhile. Not thread-safe, like the pool it stands in for.

    A whole-job restart (every rank resumes from its checkpoint onto a new store) goes on where the job was, not from
    epoch 0: :meth:`resume` posts what this rank's checkpoint says was trained, and once every rank's post is in the
    new store, each rank computes the same remainder of every epoch (the epoch's order less what any rank trained)
    and claims from it. Until then this rank admits nothing (its engine serves on).
    """

    #: how long a resuming rank waits for the other ranks' posts before it goes on with the ones it has
    resume_wait_s: float = 120.0

    def __init__(self, samples: Sequence[FineTuneSample], store: Any, *, rank: int, claim_samples: int,
                 epochs: int = 1, seed: int = 0, shuffle: bool = True, fingerprint: str | None = None,
                 world_size: int = 1) -> None:
        # The single replica's pool gives the global order (and the fingerprint); its own admission state is unused.
        self._order_src = FinetunePool(samples, epochs=epochs, seed=seed, shuffle=shuffle, fingerprint=fingerprint)
        self._by_id = {s.sample_id: s for s in samples}
        self._store = store
        self.rank = rank
        self.world_size = world_size
        self.claim_samples = claim_samples
        self.epochs = epochs
        self._n = len(samples)
        # the store's name: a checkpoint taken under another store comes from before a whole-job restart (the first
        # rank to connect names it, the others read that name)
        self.store_id = _text(self._store.compare_set("store_id", "", os.urandom(8).hex()))
        self._epoch = 0
        #: epoch -> ids known trained in it: this rank's, and after a whole-job restart every rank's before it
        self._trained: dict[int, set[int]] = {}
        #: epoch -> what is left of its order after a whole-job restart (absent: the whole order)
        self._remaining: dict[int, list[int]] = {}
        self._resume_post: dict[str, Any] | None = None  # posted; waiting for the other ranks' posts
        self._resume_deadline = 0.0
        self._resume_checked = 0.0
        self._order: list[int] = self._order_src.epoch_order(0)
        self._exhausted = False  # the global cursor of this epoch is past its end
        self._finished = False
        self._admissible: list[tuple[int, int, FineTuneSample]] = []  # (tokens, global position, sample), sorted
        self._in_flight: dict[int, tuple[int, int, FineTuneSample]] = {}
        self._done_in_epoch: set[int] = set()
        self._completed_total = 0
        self._tokens_completed = 0
        self.claims: list[tuple[int, int, int]] = []  # (epoch, start, end) of every run this rank took

    # -- claiming --------------------------------------------------------------------------------------------

    def _claim_run(self) -> bool:
        """Take the next run of the epoch's global order; False when the epoch has none left."""
        end = int(self._store.add(f"claim/e{self._epoch}", self.claim_samples))
        start = end - self.claim_samples
        if start >= len(self._order):
            self._exhausted = True
            return False
        end = min(end, len(self._order))
        self.claims.append((self._epoch, start, end))
        for pos in range(start, end):
            base = self._by_id[self._order[pos]]
            s = base if base.epoch == self._epoch else FineTuneSample(base.sample_id, base.input_ids, base.loss_mask,
                                                                      self._epoch)
            self._admissible.append((s.num_tokens, pos, s))
        self._admissible.sort(key=lambda e: (e[0], e[1]))
        return True

    def _refill(self) -> None:
        if self._resume_post is not None and not self._resume_merged():
            return
        while len(self._admissible) * 2 < self.claim_samples and not self._finished:
            if not self._exhausted:
                if self._claim_run():
                    continue
            if self._in_flight or self._admissible:
                return  # the epoch's own samples must be done before this rank moves on
            if self._epoch + 1 >= self.epochs:
                self._finished = True
                return
            self._epoch += 1
            self._order = self._epoch_order(self._epoch)
            self._exhausted = False
            self._done_in_epoch.clear()

    def _epoch_order(self, epoch: int) -> list[int]:
        return self._remaining[epoch] if epoch in self._remaining else self._order_src.epoch_order(epoch)

    # -- AdmissionPool -----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        self._refill()
        return len(self._admissible)

    def iter_by_length(self) -> Iterator[FineTuneSample]:
        self._refill()
        return iter([s for _, _, s in self._admissible])

    def claim(self, samples: Iterable[FineTuneSample | int]) -> None:
        """Admitted into a step: the samples are in flight (``ValueError`` if one is not admissible here)."""
        want = [s if isinstance(s, int) else s.sample_id for s in samples]
        index = {e[2].sample_id: e for e in self._admissible}
        missing = [sid for sid in want if sid not in index]
        if missing or len(set(want)) != len(want):
            raise ValueError(f"cannot claim samples {missing or want}: not admissible on rank {self.rank}")
        taken = set(want)
        self._admissible = [e for e in self._admissible if e[2].sample_id not in taken]
        for sid in want:
            self._in_flight[sid] = index[sid]

    def release(self, sample_ids: Iterable[int]) -> None:
        """Aborted, refused, stale or dropped: admissible here again (they stay this rank's)."""
        ids = _sample_ids(sample_ids, "release")
        bad = [sid for sid in ids if sid not in self._in_flight]
        if bad:
            raise ValueError(f"cannot release samples {bad}: not in flight on rank {self.rank}")
        for sid in ids:
            self._admissible.append(self._in_flight.pop(sid))
        self._admissible.sort(key=lambda e: (e[0], e[1]))

    def complete(self, sample_ids: Iterable[int | FineTuneSample]) -> None:
        """Trained into a global step."""
        ids = [s if isinstance(s, int) else s.sample_id for s in sample_ids]
        bad = [sid for sid in ids if sid not in self._in_flight]
        if bad:
            raise ValueError(f"cannot complete samples {bad}: not in flight on rank {self.rank}")
        for sid in ids:
            tokens, _, sample = self._in_flight.pop(sid)
            self._done_in_epoch.add(sid)
            self._trained.setdefault(sample.epoch, set()).add(sid)
            self._completed_total += 1
            self._tokens_completed += tokens
        self._refill()

    def in_flight_ids(self) -> frozenset[int]:
        return frozenset(self._in_flight)

    def in_flight_tokens(self, sample_ids: Iterable[int]) -> int:
        """Tokens of these in-flight samples (ids not in flight count 0)."""
        return sum(self._in_flight[i][0] for i in sample_ids if i in self._in_flight)

    # -- progress ----------------------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """This rank has nothing left to train: every epoch's global order is claimed and its own share done (never
        while a resume waits for the other ranks' posts)."""
        self._refill()
        return self._finished

    @property
    def epoch(self) -> int:
        return self._epoch

    def progress(self) -> dict[str, Any]:
        """This rank's share, plus the job's claim cursor of the current epoch (how much of it all ranks took)."""
        claimed = self._n - len(self._order) + min(len(self._order), int(self._store.add(f"claim/e{self._epoch}", 0)))
        total = self.epochs * self._n
        return {"epoch": self._epoch, "epochs": self.epochs, "finished": self._finished,
                "samples_per_epoch": self._n, "in_pool": len(self._admissible), "in_flight": len(self._in_flight),
                "done_in_epoch": len(self._done_in_epoch), "samples_completed": self._completed_total,
                "samples_total": total, "fraction": self._completed_total / total,
                "tokens_completed": self._tokens_completed, "rank": self.rank,
                "claimed_in_epoch_all_ranks": claimed}

    def progress_line(self) -> str:
        p = self.progress()
        return (f"rank {self.rank}: epoch {p['epoch'] + 1}/{p['epochs']}, {p['samples_completed']} samples trained "
                f"here, {p['claimed_in_epoch_all_ranks']}/{p['samples_per_epoch']} of the epoch claimed by all "
                f"ranks, {p['in_flight']} in flight")

    def state_dict(self) -> dict[str, Any]:
        """What this rank had trained and held (saved with its checkpoints, for the operator and for a resume)."""
        return {"version": 2, "kind": "rank_pool", "rank": self.rank, "fingerprint": self._order_src.fingerprint(),
                "store_id": self.store_id, "epoch": self._epoch, "done_in_epoch": sorted(self._done_in_epoch),
                "held": sorted([e[2].sample_id for e in self._admissible] + list(self._in_flight)),
                "trained": {str(e): sorted(ids) for e, ids in sorted(self._trained.items())},
                "samples_completed": self._completed_total, "tokens_completed": self._tokens_completed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Refused: a rank resumes through :meth:`resume` (the other ranks' posts decide what is left)."""
        raise ValueError("a data-parallel rank's sample order resumes through RankPool.resume, not load_state_dict")

    def resume(self, state: Mapping[str, Any], trained_after: Iterable[int] = ()) -> bool:
        """Resume from the ``state_dict`` this rank's checkpoint holds, ``trained_after``: ids of this rank trained
        into global steps the checkpoint's adapter holds but ``state`` was taken before (the backward process was
        ahead of the controller when it saved). Returns False (nothing done) when ``state`` was taken under this
        same store: a rank rejoining a running job, whose claims the store still counts. Otherwise posts what the
        checkpoint says was trained; :meth:`_refill` merges the ranks' posts once all are in (or ``resume_wait_s``
        passed). ``ValueError`` when the checkpoint is of another dataset or order."""
        if state.get("kind") != "rank_pool" or int(state.get("version", 0)) < 2:
            raise ValueError("this checkpoint's sample state is not a data-parallel rank's of this version: the "
                             "adapter resumes, the sample order cannot")
        if state.get("fingerprint") != self._order_src.fingerprint():
            raise ValueError("this checkpoint was trained on another dataset, seed or number of epochs: it cannot "
                             "resume this job's sample order")
        if state.get("store_id") == self.store_id:
            return False
        trained = {int(e): set(map(int, ids)) for e, ids in (state.get("trained") or {}).items()}
        trained.setdefault(int(state["epoch"]), set()).update(int(i) for i in trained_after)
        self._completed_total = int(state.get("samples_completed", 0))
        self._tokens_completed = int(state.get("tokens_completed", 0))
        self._resume_post = {"epoch": int(state["epoch"]), "trained": {str(e): sorted(v) for e, v in trained.items()}}
        self._store.set(f"resume/{self.rank}", json.dumps(self._resume_post))
        self._resume_deadline = time.monotonic() + self.resume_wait_s
        return True

    def _resume_merged(self) -> bool:
        """Whether the resume's merge is done: once every rank's post is in (checked every 0.2 s), or the wait ran
        out, every rank's remainder of each epoch is computed from the same posts, so the ranks' claims cover it."""
        now = time.monotonic()
        if now - self._resume_checked < 0.2:
            return False
        self._resume_checked = now
        keys = [f"resume/{r}" for r in range(self.world_size)]
        present = [k for k in keys if self._store.check([k])]
        if len(present) < len(keys) and now < self._resume_deadline:
            return False
        if len(present) < len(keys):
            log.warning("rank %d: no resume post from %s after %.0f s; going on with the others' (samples only those "
                        "ranks trained since the start of their epoch may be trained again)", self.rank,
                        sorted(set(keys) - set(present)), self.resume_wait_s)
        posts = [json.loads(_text(self._store.get(k))) for k in present]
        first = min(int(p["epoch"]) for p in posts)
        trained: dict[int, set[int]] = {}
        for p in posts:
            for e, ids in p["trained"].items():
                trained.setdefault(int(e), set()).update(ids)
        self._trained = {e: ids for e, ids in trained.items() if e >= first}
        self._remaining = {e: [i for i in self._order_src.epoch_order(e) if i not in trained.get(e, ())]
                           for e in range(first, self.epochs)}
        self._epoch, self._order = first, self._remaining[first]
        self._exhausted = False
        self._done_in_epoch.clear()
        self._resume_post = None
        log.info("rank %d resumed the sample order from the ranks' checkpoints: epoch %d/%d, %d of its samples left "
                 "to train by all ranks", self.rank, first + 1, self.epochs, len(self._order))
        return True


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# ---------------------------------------------------------------------------------------------- global steps


@dataclass(frozen=True)
class Contribution:
    """One rank's part of a global step: the sum over its samples of the per-token loss gradients (flattened in
    the trainer's parameter order, fp32; ``None`` when it has nothing), its target and input token counts, its summed
    token losses and the samples'  ids."""

    grad_sum: torch.Tensor | None
    targets: int
    tokens: int
    loss_sum: float
    sample_ids: tuple[int, ...]

    def encode(self) -> bytes:
        meta = json.dumps({"targets": self.targets, "tokens": self.tokens, "loss_sum": self.loss_sum,
                           "ids": list(self.sample_ids), "numel": 0 if self.grad_sum is None
                           else int(self.grad_sum.numel())}).encode()
        body = b"" if self.grad_sum is None else self.grad_sum.detach().to("cpu", torch.float32).numpy().tobytes()
        return len(meta).to_bytes(8, "little") + meta + body

    @classmethod
    def decode(cls, raw: bytes) -> "Contribution":
        n = int.from_bytes(raw[:8], "little")
        meta = json.loads(raw[8:8 + n])
        grad = (torch.frombuffer(bytearray(raw[8 + n:]), dtype=torch.float32) if meta["numel"] else None)
        return cls(grad, int(meta["targets"]), int(meta["tokens"]), float(meta["loss_sum"]), tuple(meta["ids"]))


@dataclass(frozen=True)
class ExchangeResult:
    """A decided global step as every rank sees it."""

    seq: int
    ranks: tuple[int, ...]  # whose contributions are in, ascending
    grad: torch.Tensor | None  # combined gradient: sum of the included grad sums / targets (None: nothing to train)
    targets: int
    tokens: int
    loss: float | None
    per_rank: dict[int, dict[str, Any]]  # rank -> {"tokens", "targets", "samples", "ids"}
    own_included: bool

    @property
    def empty(self) -> bool:
        return self.grad is None


class GradientExchange:
    """A backward process's side of the job's global steps (see the module docstring); every call may raise the
    store's errors after ``store_timeout_s``, which the backward loop treats as a pause of its rank's contribution.

    Store keys (under the job's prefix): ``hb/<rank>`` heartbeat counter, ``t/<seq>`` tokens accumulated towards step
    ``seq``, ``x/<seq>`` closed, ``c/<seq>/<rank>`` a contribution, ``d/<seq>`` the decision (JSON list of ranks).
    """

    def __init__(self, store: Any, dp: DataParallelRank, *, step_tokens: int, seq: int = 0,
                 poll_s: float = 0.01) -> None:
        self.store = store
        self.dp = dp
        self.rank = dp.rank
        self.world_size = dp.world_size
        self.step_tokens = step_tokens
        #: the global step this rank's next contribution belongs to
        self.seq = seq
        self.poll_s = poll_s
        self._beats = 0
        self._last_beat = 0.0
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (heartbeat counter, monotonic time it last changed)
        #: (global step, this rank's sample ids in it) of the steps this process applied with a part of its own
        self.recent_own: deque[tuple[int, tuple[int, ...]]] = deque(maxlen=4096)

    # -- liveness ----------------------------------------------------------------------------------------------

    def heartbeat(self, *, force: bool = False) -> None:
        """Tell the other ranks this backward process is alive (throttled to 4 per second unless forced)."""
        now = time.monotonic()
        if force or now - self._last_beat >= 0.25:
            self._last_beat = now
            self._beats = int(self.store.add(f"hb/{self.rank}", 1))

    def leave(self) -> None:
        """A clean exit: the others stop waiting for this rank at once."""
        self.store.delete_key(f"hb/{self.rank}")

    def alive(self, rank: int) -> bool:
        """Whether ``rank``'s backward beat within ``heartbeat_timeout_s`` (by this process's clock: the counter's
        changes are timed here, so the hosts' clocks need not agree)."""
        if rank == self.rank:
            return True
        if not self.store.check([f"hb/{rank}"]):
            self._seen.pop(rank, None)
            return False
        count = int(self.store.add(f"hb/{rank}", 0))
        now = time.monotonic()
        last = self._seen.get(rank)
        if last is None or last[0] != count:
            self._seen[rank] = (count, now)
            return True
        return now - last[1] < self.dp.heartbeat_timeout_s

    # -- closing a step ----------------------------------------------------------------------------------------

    def add_tokens(self, tokens: int) -> None:
        """Count a finished part's tokens towards the open step; the part that crosses the step size closes it."""
        total = int(self.store.add(f"t/{self.seq}", int(tokens)))
        if total >= self.step_tokens:
            self.close()

    def close(self) -> None:
        """Close the open step now (the step size was reached, or a rank's data ran out with a partial step)."""
        self.store.compare_set(f"x/{self.seq}", "", repr(time.time()))

    def closed(self) -> bool:
        return bool(self.store.check([f"x/{self.seq}"]))

    # -- the exchange ------------------------------------------------------------------------------------------

    def decided(self, seq: int) -> tuple[int, ...] | None:
        key = f"d/{seq}"
        if not self.store.check([key]):
            return None
        return tuple(json.loads(self.store.get(key)))

    def exchange(self, mine: Contribution) -> ExchangeResult:
        """Post this rank's contribution to the closed step, wait for the step's decision, and return the combined
        step (identical on every rank). Advances :attr:`seq`."""
        seq = self.seq
        decision = self.decided(seq)
        if decision is None:  # a rank posting after the decision would only waste the store's memory
            self._post(seq, mine.encode())
        started = time.monotonic()
        while decision is None:
            self.heartbeat()
            posted = [r for r in range(self.world_size) if self.store.check([f"c/{seq}/{r}"])]
            waiting = [r for r in range(self.world_size) if r not in posted and self.alive(r)]
            if not waiting or time.monotonic() - started > self.dp.spec.step_timeout_s:
                if waiting:
                    log.warning("global step %d: ranks %s did not contribute within %.0f s; deciding without them",
                                seq, waiting, self.dp.spec.step_timeout_s)
                won = self.store.compare_set(f"d/{seq}", "", json.dumps(posted))
                decision = tuple(json.loads(won))
                break
            time.sleep(self.poll_s)
            decision = self.decided(seq)
        result = self.combine(seq, decision)
        self.seq = seq + 1
        self._prune(seq)
        if result.own_included and mine.sample_ids:
            self.recent_own.append((seq, tuple(mine.sample_ids)))
        return result

    def own_ids_after(self, seq: int) -> list[int]:
        """This rank's sample ids trained into the global steps after ``seq`` (of the last ``maxlen`` such steps):
        a checkpoint holds them although the controller's sample state it carries was taken at ``seq``."""
        return [i for s, ids in self.recent_own if s > seq for i in ids]

    def combine(self, seq: int, ranks: Sequence[int]) -> ExchangeResult:
        """The decided step ``seq`` from the store: included contributions summed in rank order (fp32), divided by
        their total target tokens. The same bytes in the same order on every rank give the same tensor."""
        total: torch.Tensor | None = None
        targets = tokens = 0
        loss_sum = 0.0
        per_rank: dict[int, dict[str, Any]] = {}
        for r in sorted(ranks):
            c = Contribution.decode(self._fetch(seq, r))
            per_rank[r] = {"tokens": c.tokens, "targets": c.targets, "samples": len(c.sample_ids),
                           "ids": list(c.sample_ids)}
            targets += c.targets
            tokens += c.tokens
            loss_sum += c.loss_sum
            if c.grad_sum is not None:
                total = c.grad_sum.clone() if total is None else total.add_(c.grad_sum)
        grad = None
        if total is not None and targets > 0:
            grad = total.mul_(1.0 / targets)
        return ExchangeResult(seq, tuple(sorted(ranks)), grad, targets, tokens,
                              loss_sum / targets if targets else None, per_rank, self.rank in ranks)

    def _post(self, seq: int, payload: bytes) -> None:
        # The store refuses values over 8 MiB (torch's libuv server), and an 8B model's rank-16 adapter is 54 MB of
        # fp32 gradients: chunks first, then the key that says how many, so a present key means a whole contribution.
        chunks = [payload[i:i + _CHUNK] for i in range(0, len(payload), _CHUNK)] or [b""]
        for i, chunk in enumerate(chunks):
            self.store.set(f"c/{seq}/{self.rank}/{i}", chunk)
        self.store.set(f"c/{seq}/{self.rank}", str(len(chunks)))

    def _fetch(self, seq: int, rank: int) -> bytes:
        n = int(self.store.get(f"c/{seq}/{rank}"))
        return b"".join(self.store.get(f"c/{seq}/{rank}/{i}") for i in range(n))

    def _prune(self, seq: int) -> None:
        old = seq - self.dp.spec.keep_steps
        if old >= 0 and self.store.check([f"c/{old}/{self.rank}"]):
            # each rank deletes its own contribution and the counters; the decision goes with rank 0's
            n = int(self.store.get(f"c/{old}/{self.rank}"))
            self.store.delete_key(f"c/{old}/{self.rank}")
            for i in range(n):
                self.store.delete_key(f"c/{old}/{self.rank}/{i}")
        if old >= 0:
            if self.rank == 0:
                # raised before the keys go, so a catching-up rank never mistakes a pruned step for an open one
                floor = int(self.store.add("pruned_below", 0))
                if old + 1 > floor:
                    self.store.add("pruned_below", old + 1 - floor)
                for key in (f"d/{old}", f"t/{old}", f"x/{old}"):
                    self.store.delete_key(key)

    def check_resume(self, seq: int) -> None:
        """Refuse to join at global step ``seq`` when this rank's adapter cannot be the others': the store was
        started at another step than this rank's checkpoint (a whole-job restart where the ranks' newest
        checkpoints differ), so no replay can bring them together. ``LookupError`` says what to do."""
        base = int(self.store.compare_set("resume_seq", "", str(seq)))
        if seq < base or (seq > base and self.decided(seq - 1) is None):
            raise LookupError(
                f"rank {self.rank} resumes at global step {seq} but this job's store started at step {base}: the "
                f"ranks' newest checkpoints differ and the steps between them are not in the store. Copy the "
                f"newest checkpoint folder that every rank has (the same step in each rank-<r> folder: ranks hold "
                f"identical adapters) so all ranks resume at one step, then restart every rank")

    def replayable(self, seq: int) -> Iterator[ExchangeResult]:
        """The decided steps from ``seq`` on (a restarted backward catching up from its checkpoint), each as
        :meth:`combine` gives it; advances :attr:`seq` past them. ``LookupError`` when a step was pruned already."""
        floor = int(self.store.add("pruned_below", 0))
        if seq < floor:
            raise LookupError(f"global step {seq} was pruned from the store (steps below {floor} are gone: "
                              f"data_parallel.keep_steps={self.dp.spec.keep_steps}); this rank cannot catch up from "
                              "its checkpoint: checkpoint more often or keep more steps")
        self.seq = seq
        while (ranks := self.decided(self.seq)) is not None:
            result = self.combine(self.seq, ranks)
            self.seq += 1
            yield result


def flat_grad(params: Mapping[str, torch.nn.Parameter]) -> torch.Tensor | None:
    """The parameters' ``.grad`` flattened in their order as fp32 (None when none has one)."""
    if all(p.grad is None for p in params.values()):
        return None
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float().cpu()
                      for p in params.values()])


def set_flat_grad(params: Mapping[str, torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Inverse of :func:`flat_grad`: every parameter's ``.grad`` from one fp32 vector, in the parameters' dtype."""
    offset = 0
    for p in params.values():
        n = p.numel()
        p.grad = flat[offset:offset + n].view(p.shape).to(p.device, p.dtype).clone()
        offset += n
    if offset != flat.numel():
        raise ValueError(f"combined gradient has {flat.numel()} values, the adapter {offset}")



# ---------------------------------------------------------------------------------------------- the controller side


class DataParallelMixin:
    """The co-serving controller's part of a data-parallel job (a part of
    :class:`~deltaserve_core.coserve.CoServer`, whose state it uses; nothing here runs with ``world_size`` 1).

    Every captured step goes to the backward at once, as a part tagged with the adapter step its forward ran on: the
    global step is closed by the ranks' token counter in the backward processes, not here, so the scheduling thread
    never waits for another rank. Reports the controller did not ask for (global steps, stale parts) arrive through
    :meth:`~deltaserve_core.backward_process.BackwardProcess.poll` like any other."""

    dp: DataParallelRank | None

    def _dp_setup(self, engine_rank: int | None) -> None:
        job = self.job  # type: ignore[attr-defined]
        self.dp = None
        self._dp_store: Any = None
        self._admitted_version: dict[int, int] = {}
        self._dp_close_requested: int | None = None
        self._dp_last: dict[str, Any] | None = None
        self._dp_rank_tokens: dict[int, int] = {}
        self._dp_rank_samples: dict[int, int] = {}
        self._dp_steps_with_own = 0  # landed global steps that trained samples of this rank
        self._dp_done_mark: int | None = None  # the adapter step this rank's "share trained" mark says
        self._dp_done_checked = 0.0
        self._dp_all_done_seen = False
        self.dp_stale_parts = 0
        if job.data_parallel.enabled:
            rank = resolve_rank(job.data_parallel, engine_rank=engine_rank)
            self.dp = DataParallelRank(job.data_parallel, rank, namespace=job.adapter_name,
                                       heartbeat_timeout_s=max(2.0, min(30.0, job.data_parallel.step_timeout_s / 4)))

    def _dp_start(self) -> None:
        """Reach the store (rank 0 hosts it) and replace the pool by this rank's share of the global order."""
        assert self.dp is not None
        self._dp_store = connect_store(self.dp, host=self.dp.rank == 0)
        ds = self.dataset  # type: ignore[attr-defined]
        self.pool = RankPool(ds.samples, self._dp_store, rank=self.dp.rank,
                             claim_samples=self.dp.spec.claim_samples, epochs=ds.config.epochs, seed=ds.config.seed,
                             shuffle=ds.config.shuffle, fingerprint=ds.fingerprint, world_size=self.dp.world_size)

    def _dp_resume_pool(self, ready: Any) -> None:
        """The rank's backward resumed from a checkpoint: resume the sample order from it too (see
        :meth:`RankPool.resume`); a checkpoint it cannot resume from leaves the order where a fresh job starts."""
        assert self.dp is not None
        after = (ready.extra.get("dp") or {}).get("own_after_pool", ())
        try:
            posted = self.pool.resume(ready.extra["pool"], after)  # type: ignore[attr-defined]
        except ValueError as exc:
            log.warning("rank %d: %s; its samples are claimed as in a fresh job", self.dp.rank, exc)
            return
        if posted:
            log.info("rank %d resumes from its checkpoint at step %d: fine-tuning waits for every rank's checkpoint "
                     "(up to %.0f s) to learn what is left of the epoch", self.dp.rank, ready.step,
                     self.pool.resume_wait_s)  # type: ignore[attr-defined]
        else:
            log.warning("rank %d rejoins the running job (same store): its sample state is the store's; samples it "
                        "held when its process stopped are not claimed again", self.dp.rank)

    def _dp_dispatch(self, record: Any) -> None:
        """Send a step's captures to the backward as a part on the adapter they were forwarded with; captures whose
        forward ran on an adapter a global step has replaced since go back to the pool instead (they would be
        stale: exactness)."""
        version = self._admitted_version.pop(record.step_id, None)
        ids = list(record.finetune_sample_ids)
        if version is None or version != self.stats.adapter_step or self._recovering is not None:  # type: ignore
            self._dp_give_back(ids, free_slots=True)
            return
        self.backward.accumulate(ids, version=version)  # type: ignore[attr-defined]
        self.stats.backward_parts += 1  # type: ignore[attr-defined]
        self._step_ids.extend(ids)  # type: ignore[attr-defined]
        self._step_tokens += record.finetune_tokens  # type: ignore[attr-defined]

    def _dp_give_back(self, ids: Sequence[int], *, free_slots: bool) -> None:
        if not ids:
            return
        self.dp_stale_parts += 1
        if free_slots:
            for sid in ids:
                self.buffer.release(sid)  # type: ignore[attr-defined]
        gone = set(ids)
        self._step_ids = [i for i in self._step_ids if i not in gone]  # type: ignore[attr-defined]
        held = self.pool.in_flight_ids()  # type: ignore[attr-defined]
        self.pool.release([i for i in ids if i in held])  # type: ignore[attr-defined]
        self._step_tokens = self.pool.in_flight_tokens(self._step_ids)  # type: ignore[attr-defined]

    def _dp_step_landed(self, rep: Any) -> None:
        info = rep.extra.get("dp") or {}
        self._dp_last = info
        if rep.sample_ids:
            self._dp_steps_with_own += 1
        for r, m in (info.get("per_rank") or {}).items():
            self._dp_rank_tokens[int(r)] = self._dp_rank_tokens.get(int(r), 0) + int(m["tokens"])
            self._dp_rank_samples[int(r)] = self._dp_rank_samples.get(int(r), 0) + int(m["samples"])
        done = set(rep.sample_ids)
        self._step_ids = [i for i in self._step_ids if i not in done]  # type: ignore[attr-defined]
        # parts sent after the step closed stay open (they come back stale if a step replaced their adapter)
        self._step_tokens = self.pool.in_flight_tokens(self._step_ids)  # type: ignore[attr-defined]

    def _dp_step_full(self) -> bool:
        """This rank sent a whole global step's worth of tokens to the open step: it admits no more until the step
        lands, which bounds a global step to ``world_size`` such shares (the counter closes it at the first
        ``backward_batch_tokens`` accumulated across ranks; ranks still forwarding at that moment add theirs)."""
        return self._step_tokens >= self.job.backward_batch_tokens  # type: ignore[attr-defined]

    def _dp_maybe_close(self) -> None:
        """This rank can admit nothing more until a global step lands (its share of the data is out, or all of it is
        in flight): ask for the open step now rather than wait for tokens that may never come."""
        bw = self.backward  # type: ignore[attr-defined]
        step = self.stats.adapter_step  # type: ignore[attr-defined]
        if self._dp_close_requested != step and self._step_ids:  # type: ignore[attr-defined]
            self._dp_close_requested = step
            bw.apply()

    def _dp_mark_done(self) -> None:
        """This rank's share is trained and applied: say so in the store (``done/<rank>``), with the adapter step it
        is at, again whenever a later global step (of the others' shares) lands here."""
        assert self.dp is not None and self._dp_store is not None
        step = self.stats.adapter_step  # type: ignore[attr-defined]
        if self._dp_done_mark != step:
            self._dp_store.set(f"done/{self.dp.rank}", str(step))
            self._dp_done_mark = step

    def _dp_all_done(self) -> bool:
        """Called once this rank's own share is trained and applied: whether every rank's is, and this rank has
        applied the last global step. The last global step is the highest ``done`` mark, since the rank whose
        samples it trained marks only after applying it. Checked at most every 0.2 s: idle engines ask between
        their steps."""
        if self._dp_all_done_seen:
            return True
        assert self.dp is not None and self._dp_store is not None
        self._dp_mark_done()
        step = self.stats.adapter_step  # type: ignore[attr-defined]
        now = time.monotonic()
        if now - self._dp_done_checked < 0.2:
            return False
        self._dp_done_checked = now
        keys = [f"done/{r}" for r in range(self.dp.world_size)]
        if not self._dp_store.check(keys):
            return False
        self._dp_all_done_seen = step >= max(int(self._dp_store.get(k)) for k in keys)
        return self._dp_all_done_seen

    def _dp_recovered(self, step: int) -> None:
        """After this rank's backward restarted and replayed the decided steps: samples of its own that the replay
        shows trained are done, every other sample it held goes back to its pool (the restart dropped their
        captures), and forwards still in the host are marked stale."""
        bw = self.backward  # type: ignore[attr-defined]
        replay = (bw.last_ready.extra.get("dp_replay") if bw.last_ready is not None else None) or {}
        held = self.pool.in_flight_ids()  # type: ignore[attr-defined]
        trained = sorted(set(replay.get("own_ids", ())) & held)
        if trained:
            self.pool.complete(trained)  # type: ignore[attr-defined]
        in_host = {s.sample_id for v in self._admitted.values() for s in v}  # type: ignore[attr-defined]
        back = sorted(self.pool.in_flight_ids() - in_host)  # type: ignore[attr-defined]
        if back:
            self.pool.release(back)  # type: ignore[attr-defined]
        for k in self._admitted_version:
            self._admitted_version[k] = -1
        self._dp_close_requested = None
        log.info("rank %d caught up: %d global steps replayed from the store (from step sequence %s), %d of its "
                 "samples found trained, %d given back to its pool", self.dp.rank if self.dp else -1,
                 int(replay.get("steps", 0)), replay.get("from_seq"), len(trained), len(back))

    def _dp_status(self) -> dict[str, Any]:
        """Per-rank and total progress for the jobs API and the logs."""
        assert self.dp is not None
        total_tokens = sum(self._dp_rank_tokens.values())
        return {"rank": self.dp.rank, "world_size": self.dp.world_size,
                "last_global_step": self._dp_last, "stale_parts": self.dp_stale_parts,
                "trained_tokens_by_rank": {str(r): t for r, t in sorted(self._dp_rank_tokens.items())},
                "trained_samples_by_rank": {str(r): n for r, n in sorted(self._dp_rank_samples.items())},
                "trained_tokens_all_ranks": total_tokens,
                "global_steps_with_own_samples": self._dp_steps_with_own,
                "this_rank": self.pool.progress()}  # type: ignore[attr-defined]
