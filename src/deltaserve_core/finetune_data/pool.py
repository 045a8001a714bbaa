"""The sample pools admission draws from: :class:`FinetunePool` (the job's) and :class:`InMemoryPool` (reference).

:class:`FinetunePool` is what the scheduler extension admits from on every step: samples ordered by token count
(ties in a seeded order), claimed while in flight, released on abort, completed after backward, with epoch
tracking and a JSON-serialisable state that is saved with checkpoints. :class:`InMemoryPool` is the minimal pool
over a list of samples that tests and the admission benchmark use.

Both implement :class:`~deltaserve_core.admission.AdmissionPool` the same way: ``len(pool)`` counts the admissible
samples, :meth:`iter_by_length` walks them shortest first, ``claim(samples)`` takes a prefix of that walk out of
the pool, and ``release(sample_ids)`` puts claimed samples back *by id* (what hosts and the backward process
report), refusing sample objects.
"""

from __future__ import annotations

import base64
import hashlib
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, compress, filterfalse, islice, repeat
from operator import attrgetter, is_, is_not, itemgetter
from typing import Any, Literal

import numpy as np

from deltaserve_core.types import FineTuneSample

from .records import DatasetError, _is_int

__all__ = [
    "FinetunePool",
    "InMemoryPool",
    "samples_fingerprint",
]


def _sample_ids(items: Iterable[int], verb: str) -> list[int]:
    """``items`` as a list of sample ids; ``TypeError`` for sample objects (both pools release by id only)."""
    ids = list(items)
    for item in ids:
        if isinstance(item, FineTuneSample):
            raise TypeError(f"{verb} takes sample ids, not samples (got the sample with id {item.sample_id})")
    return ids

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on uint64 arrays (wrapping arithmetic).

    Used for the seeded tie-break instead of an RNG stream: it is a pure function of (seed, epoch, sample id),
    identical on every platform and NumPy version, and vectorises, so a checkpoint never has to store an order.
    """
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


_STATE_VERSION = 1
# Ranks materialised by an iterator's first run; later runs double. Admission reads 16 samples first.
_RUN = 64
_epoch_of = attrgetter("epoch")


def samples_fingerprint(samples: Sequence[FineTuneSample]) -> str:
    """SHA-256 over every sample's id, tokens and loss mask, in order.

    Stored in :meth:`FinetunePool.state_dict` so a checkpoint is refused when the dataset file, tokenizer, chat
    template or ``max_length`` changed. Costs about a second per 25M tokens, so :class:`FinetuneDataset` computes
    it while loading and hands it to the pool instead of the pool computing it at the first checkpoint.
    """
    h = hashlib.sha256()
    for s in samples:
        h.update(array("q", (s.sample_id, len(s.input_ids))).tobytes())
        h.update(array("q", s.input_ids).tobytes())
        h.update(bytes(s.loss_mask))
    return h.hexdigest()


class FinetunePool:
    """The admission pool: which fine-tuning samples may join a step, in the order Algorithm 1 wants them.

    Owned by the core's scheduler extension in the scheduling process. Every sample of the current epoch is in
    exactly one place: the *pool* (admissible), *in flight* (claimed into a step, not yet trained) or *done* (its
    backward finished this epoch). When every sample of the epoch is done, the next epoch's samples (same ids,
    ``epoch`` + 1, freshly tie-broken) fill the pool; after the last epoch :attr:`finished` is true.

    Order: increasing token count; equal counts in a seeded pseudo-random order that changes every epoch
    (``shuffle=True``) or in sample-id order (``shuffle=False``). The order of an epoch is fixed when it starts,
    so the pool is a subset of one sorted array, kept as a presence byte per rank next to the epoch's samples in
    rank order. Admission walks and claims a short prefix on every step, so that path runs in C: the iterator is
    ``itertools.compress`` over the ranked samples and the *live* presence bytes (no interpreter work per
    sample), and claiming the prefix the iterator just produced is one identity check and two slice operations.
    Anything else (ids, samples from elsewhere, a claim with gaps) takes the general per-sample path.

    Not thread-safe: the scheduler calls it from one thread.
    """

    def __init__(self, samples: Sequence[FineTuneSample], *, epochs: int = 1, seed: int = 0,
                 shuffle: bool = True, fingerprint: str | None = None) -> None:
        if not samples:
            raise DatasetError("the fine-tuning pool needs at least one sample")
        if not _is_int(epochs) or epochs < 1:
            raise DatasetError(f"epochs must be an integer >= 1, got {epochs!r}")
        if not _is_int(seed):
            raise DatasetError(f"seed must be an integer, got {seed!r}")
        ids = [s.sample_id for s in samples]
        if len(set(ids)) != len(ids):
            dup = next(i for i, c in Counter(ids).items() if c > 1)
            raise DatasetError(f"sample ids must be unique, {dup} appears more than once")
        self._base: list[FineTuneSample] = list(samples)
        self._ids = np.asarray(ids, dtype=np.int64)
        self._lengths = np.asarray([s.num_tokens for s in samples], dtype=np.int64)
        self._pos_of: dict[int, int] = {sid: k for k, sid in enumerate(ids)}
        self.epochs = int(epochs)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._fingerprint = fingerprint  # computed on first use when the caller has none
        self._tokens_completed = 0
        # Datasets hand over epoch-0 samples; in the epoch they already carry, the pool uses them as they are
        # instead of building copies.
        base_epochs = set(map(_epoch_of, self._base))
        self._base_epoch: int | None = base_epochs.pop() if len(base_epochs) == 1 else None
        self._start_epoch(0)

    # -- epoch bookkeeping -------------------------------------------------------------------------------------

    def _order_for(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            # Seed and epoch are mixed in one after the other so different (seed, epoch) pairs give unrelated
            # orders rather than shifted copies of one another.
            salt = _mix64(_mix64(np.asarray([self.seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
                          ^ np.asarray([epoch], dtype=np.uint64))[0]
            with np.errstate(over="ignore"):
                tiebreak = _mix64(self._ids.astype(np.uint64) ^ salt)
        else:
            tiebreak = np.zeros(len(self._ids), dtype=np.uint64)
        # lexsort: last key is primary; sample id last-resort so the order is total.
        return np.lexsort((self._ids, tiebreak, self._lengths))

    def epoch_order(self, epoch: int) -> list[int]:
        """Sample ids of ``epoch`` in the order admission walks them (what data-parallel ranks claim runs of)."""
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch {epoch} is outside 0..{self.epochs - 1}")
        return self._ids[self._order_for(epoch)].tolist()

    def _start_epoch(self, epoch: int) -> None:
        order = self._order_for(epoch)
        n = len(order)
        old_present = getattr(self, "_present", None)
        if old_present is not None:
            # Iterators still walking the previous epoch read these bytes; clearing them ends those walks
            # (they must never yield a sample of an epoch that is over).
            old_present[:] = bytes(len(old_present))
        self._epoch = epoch
        self._finished = False
        self._order: list[int] = order.tolist()  # rank -> position in self._base
        rank_of = np.empty(n, dtype=np.int64)
        rank_of[order] = np.arange(n)
        self._rank_of: list[int] = rank_of.tolist()  # position -> rank
        self._present = bytearray(b"\x01") * n  # by rank
        self._head = 0  # every rank below it is absent (a hint: the first present rank is at or after it)
        self._count = n
        self._in_flight: set[int] = set()  # positions
        self._done = bytearray(n)  # by position
        self._done_count = 0
        # Samples of this epoch by position, built on first use when the base samples belong to another epoch:
        # a 100k-sample epoch switch must not stall the scheduler.
        self._epoch_samples: list[FineTuneSample | None] = (
            list(self._base) if epoch == self._base_epoch else [None] * n)
        # The same samples by rank, for ranks [0, len(self._ranked)); extended in runs as iterators reach them.
        # When the base samples are this epoch's there is nothing to build, so the whole list is made at once
        # (a C-level gather, cheap next to loading the samples) and iterators need no bound per run.
        self._ranked: list[FineTuneSample] = (
            list(map(self._base.__getitem__, self._order)) if epoch == self._base_epoch else [])
        self._generation = getattr(self, "_generation", 0) + 1

    def _sample_at(self, pos: int) -> FineTuneSample:
        s = self._epoch_samples[pos]
        if s is None:
            base = self._base[pos]
            s = base if base.epoch == self._epoch else FineTuneSample(base.sample_id, base.input_ids,
                                                                      base.loss_mask, self._epoch)
            self._epoch_samples[pos] = s
        return s

    def _materialize(self, upto: int) -> None:
        """Extend the ranked sample list to cover ranks below ``upto`` (capped at the epoch size)."""
        ranked = self._ranked
        start = len(ranked)
        if upto <= start:
            return
        upto = min(upto, len(self._order))
        cache = self._epoch_samples
        chunk = list(map(cache.__getitem__, self._order[start:upto]))
        if not all(map(is_not, chunk, repeat(None))):
            sample_at = self._sample_at
            chunk = [s if s is not None else sample_at(pos) for s, pos in zip(chunk, self._order[start:upto])]
        ranked.extend(chunk)

    # -- the hot path ------------------------------------------------------------------------------------------

    def iter_by_length(self) -> Iterator[FineTuneSample]:
        """Admissible samples in increasing token count (ties in the epoch's seeded order), lazily.

        Called by the admission step on every scheduling decision, which takes a short prefix, so nothing is
        materialised beyond what is read (plus a short look-ahead). Claiming or releasing while iterating is
        allowed (the iterator always reads the current pool and never yields a sample twice); the iterator stops
        when a new epoch starts.
        """
        return chain.from_iterable(self._runs())

    def _runs(self) -> Iterator[Iterator[FineTuneSample]]:
        """Consecutive rank ranges of the epoch as C iterators, each filtered by the live presence bytes.

        Like any generator it starts at the first ``next``: the walk begins at the pool's first admissible
        sample *then*, in the epoch current *then*. ``compress`` reads the next presence byte only when it is
        asked for the next sample, so a sample claimed after the iterator was made is skipped and one released
        ahead of it is yielded, as a Python loop over the bytes would. Ranges grow geometrically: a decision
        reading a dozen samples materialises a few dozen, a long walk costs a handful of generator steps.
        """
        present, generation, n = self._present, self._generation, len(self._order)
        rank = present.find(1, self._head)
        if rank < 0:
            self._head = n
            return
        self._head = rank
        step = _RUN
        while rank < n and self._generation == generation:
            end = len(self._ranked)
            if end <= rank:
                self._materialize(rank + step)
                end = len(self._ranked)
                step *= 2
            flags = iter(present)
            flags.__setstate__(rank)
            samples = iter(self._ranked)
            samples.__setstate__(rank)
            if end == n:
                yield compress(samples, flags)  # the rest of the epoch: nothing can be appended behind it
                return
            # islice bounds the run: the ranked list may grow while it is being read (another iterator).
            yield compress(islice(samples, end - rank), flags)
            rank = end

    def __len__(self) -> int:
        """Samples admissible right now (not in flight, not done this epoch)."""
        return self._count

    def _position(self, sample_id: int) -> int:
        try:
            return self._pos_of[sample_id]
        except (KeyError, TypeError):
            raise KeyError(f"sample id {sample_id!r} is not part of this fine-tuning pool") from None

    def claim(self, samples: Iterable[FineTuneSample | int]) -> None:
        """Take samples out of the pool because they were admitted into a step (they are now in flight).

        Called by the admission step with what it admitted. All-or-nothing: if any sample is not in the pool
        (already claimed, done, from another epoch, unknown) nothing changes and ``ValueError`` names it.
        """
        if not isinstance(samples, (list, tuple)):
            samples = list(samples)
        k = len(samples)
        if not k:
            return
        # The admission case: exactly the samples the iterator yields first, i.e. this epoch's sample objects
        # at the first k present ranks, with no gap. Identity with the ranked objects proves id and epoch.
        present = self._present
        start = present.find(1, self._head)
        end = start + k
        if (start >= 0 and end <= len(self._ranked) and present.find(0, start, end) < 0
                and all(map(is_, samples, self._ranked[start:end]))):
            present[start:end] = bytes(k)
            self._in_flight.update(self._order[start:end])
            self._count -= k
            self._head = end
            return
        positions: list[int] = []
        seen: set[int] = set()
        for s in samples:
            sid = s if isinstance(s, (int, np.integer)) else s.sample_id
            pos = self._position(int(sid))
            if not isinstance(s, (int, np.integer)) and s.epoch != self._epoch:
                raise ValueError(f"sample {sid} is from epoch {s.epoch}, the pool is in epoch {self._epoch}")
            if pos in seen or not present[self._rank_of[pos]]:
                where = "in flight" if pos in self._in_flight else "done for this epoch"
                if pos in seen:
                    where = "listed twice in one claim"
                raise ValueError(f"cannot claim sample {sid}: it is {where}, not in the pool")
            seen.add(pos)
            positions.append(pos)
        for pos in positions:
            present[self._rank_of[pos]] = 0
            self._in_flight.add(pos)
        self._count -= len(positions)

    def release(self, sample_ids: Iterable[int]) -> None:
        """Put in-flight samples back into the pool: their step was aborted, so they were not trained.

        Called when a host reports ``aborted_sample_ids`` or the backward process drops a batch. Takes sample
        ids (``TypeError`` for sample objects, as :meth:`InMemoryPool.release`). All-or-nothing; ``ValueError``
        if a sample is not in flight, ``KeyError`` if it is not part of the pool.
        """
        positions = self._in_flight_positions(_sample_ids(sample_ids, "release"), "release")
        head = self._head
        for pos in positions:
            self._in_flight.discard(pos)
            rank = self._rank_of[pos]
            self._present[rank] = 1
            if rank < head:
                head = rank
        self._head = head
        self._count += len(positions)

    def complete(self, sample_ids: Iterable[int | FineTuneSample]) -> None:
        """Mark in-flight samples as trained for this epoch; may start the next epoch or finish the job.

        Called when the backward process has applied the gradient of these samples. Takes ids or the samples
        themselves. All-or-nothing; ``ValueError`` if a sample is not in flight.
        """
        positions = self._in_flight_positions(sample_ids, "complete")
        for pos in positions:
            self._in_flight.discard(pos)
            self._done[pos] = 1
            self._tokens_completed += int(self._lengths[pos])
        self._done_count += len(positions)
        if self._done_count == len(self._order):
            if self._epoch + 1 < self.epochs:
                self._start_epoch(self._epoch + 1)
            else:
                self._finished = True

    def _in_flight_positions(self, sample_ids: Iterable[int | FineTuneSample], verb: str) -> list[int]:
        positions: list[int] = []
        seen: set[int] = set()
        for item in sample_ids:
            sid = item.sample_id if isinstance(item, FineTuneSample) else int(item)
            pos = self._position(sid)
            if pos not in self._in_flight or pos in seen:
                state = "listed twice" if pos in seen else self.state_of(int(sid))
                raise ValueError(f"cannot {verb} sample {sid}: it is not in flight (it is {state})")
            seen.add(pos)
            positions.append(pos)
        return positions

    # -- inspection --------------------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current epoch (0-based). Stays at ``epochs - 1`` once :attr:`finished`."""
        return self._epoch

    @property
    def finished(self) -> bool:
        """True once every sample of the last epoch is done."""
        return self._finished

    @property
    def samples_per_epoch(self) -> int:
        return len(self._order)

    @property
    def in_flight(self) -> frozenset[int]:
        """Sample ids claimed and not yet completed or released."""
        return frozenset(self._base[p].sample_id for p in self._in_flight)

    def state_of(self, sample_id: int) -> Literal["pool", "in_flight", "done"]:
        """Where one sample is in the current epoch (for invariant checks and error messages)."""
        pos = self._position(sample_id)
        if pos in self._in_flight:
            return "in_flight"
        if self._done[pos]:
            return "done"
        return "pool"

    def sample(self, sample_id: int) -> FineTuneSample:
        """The current epoch's sample with this id (e.g. for the backward process to fetch its tokens)."""
        return self._sample_at(self._position(sample_id))

    def progress(self) -> dict[str, Any]:
        """JSON-friendly progress for logs and the status endpoint."""
        n = len(self._order)
        completed = self._epoch * n + self._done_count
        total = self.epochs * n
        return {
            "epoch": self._epoch, "epochs": self.epochs, "finished": self._finished,
            "samples_per_epoch": n, "in_pool": self._count, "in_flight": len(self._in_flight),
            "done_in_epoch": self._done_count, "samples_completed": completed, "samples_total": total,
            "fraction": completed / total, "tokens_completed": self._tokens_completed,
        }

    def progress_line(self) -> str:
        """:meth:`progress` for a log line: ``epoch 1/2, 120/1998 samples done (6.0%), 3 in flight``."""
        p = self.progress()
        done = f"{p['samples_completed']}/{p['samples_total']} samples done ({p['fraction'] * 100:.1f}%)"
        if p["finished"]:
            return f"all {p['epochs']} epoch(s) done, {done}"
        return f"epoch {min(p['epoch'] + 1, p['epochs'])}/{p['epochs']}, {done}, {p['in_flight']} in flight"

    # -- checkpointing -----------------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """Hash of the samples (see :func:`samples_fingerprint`), so a checkpoint never lands on other data."""
        if self._fingerprint is None:
            self._fingerprint = samples_fingerprint(self._base)
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable progress, saved with each checkpoint.

        Only *done* samples are recorded; samples in flight at checkpoint time were not trained into the saved
        adapter, so on restore they are admissible again. Because the order of an epoch is a pure function of
        (seed, epoch, samples), this is all that is needed to continue with exactly the same future sequence.
        """
        return {
            "version": _STATE_VERSION,
            "fingerprint": self.fingerprint(),
            "epochs": self.epochs, "seed": self.seed, "shuffle": self.shuffle,
            "epoch": self._epoch, "finished": self._finished,
            "done_count": self._done_count,
            # Bitmap by dataset position: 12.5 kB for 100k samples, versus ~600 kB as a list of ids.
            "done_bitmap": base64.b64encode(np.packbits(np.frombuffer(bytes(self._done), dtype=np.uint8)
                                                        .astype(bool)).tobytes()).decode("ascii"),
            "tokens_completed": self._tokens_completed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore progress saved by :meth:`state_dict`; anything in flight now or then goes back to the pool.

        Called by the fine-tuning manager when it resumes from a checkpoint, before admission starts. Refuses a
        state taken from a different dataset, tokenizer or seed/shuffle/epochs setting (``ValueError`` says
        which), because resuming would then silently train a different sequence.
        """
        version = state.get("version") if isinstance(state, Mapping) else None
        if version != _STATE_VERSION:
            raise ValueError(f"not a FinetunePool state of version {_STATE_VERSION} (got {type(state).__name__} "
                             f"with version {version!r})")
        missing = {"fingerprint", "epochs", "seed", "shuffle", "epoch", "finished", "done_count", "done_bitmap",
                   "tokens_completed"} - set(state)
        if missing:
            raise ValueError(f"corrupt FinetunePool state: missing {sorted(missing)}")
        if state["fingerprint"] != self.fingerprint():
            raise ValueError("the checkpoint's fine-tuning pool was built from different samples (dataset file, "
                             "tokenizer, chat template or max_length changed); resume with the same data settings")
        for key in ("epochs", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(f"the checkpoint was taken with {key}={state[key]!r} but this pool has "
                                 f"{key}={getattr(self, key)!r}; resume with the same data settings")
        epoch = int(state["epoch"])
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"checkpoint epoch {epoch} is outside 0..{self.epochs - 1}")
        n = len(self._order)
        bits = np.unpackbits(np.frombuffer(base64.b64decode(state["done_bitmap"]), dtype=np.uint8))[:n]
        if len(bits) != n or int(bits.sum()) != int(state["done_count"]):
            raise ValueError("corrupt FinetunePool state: done bitmap does not match done_count")
        self._start_epoch(epoch)
        done_positions = np.flatnonzero(bits)
        self._done = bytearray(bits.astype(np.uint8).tobytes())
        self._done_count = len(done_positions)
        for pos in done_positions.tolist():
            self._present[self._rank_of[pos]] = 0
        self._count = n - self._done_count
        self._tokens_completed = int(state["tokens_completed"])
        self._finished = bool(state["finished"])
        if self._finished != (self._done_count == n and epoch == self.epochs - 1):
            raise ValueError("corrupt FinetunePool state: 'finished' disagrees with the done samples")


_third = itemgetter(2)
_second = itemgetter(1)
_order = itemgetter(0, 1)


class InMemoryPool:
    """A minimal :class:`~deltaserve_core.admission.AdmissionPool` over a list of samples, ordered by ``(num_tokens, sample_id)``.

    Used by tests and the admission benchmark, and as the reference behaviour the fine-tuning data manager's
    pool must match. Entries before ``_head`` are consumed; admission almost always claims the shortest
    samples, so a claim usually just moves the head (O(k) C-level work, no per-sample bookkeeping), and
    :meth:`release` of the latest claim (an aborted step) moves it back. Claims elsewhere are recorded in a
    set and skipped lazily.
    """

    def __init__(self, samples: Sequence[FineTuneSample] = ()) -> None:
        self._items: list[tuple[int, int, FineTuneSample]] = sorted(
            ((s.num_tokens, s.sample_id, s) for s in samples), key=_order)
        self._by_id: dict[int, FineTuneSample] = {s.sample_id: s for s in samples}
        if len(self._by_id) != len(self._items):
            raise ValueError("InMemoryPool: sample_id values must be unique")
        self._claimed: set[int] = set()  # claimed ids whose entries are still at or after _head
        self._head = 0

    def __len__(self) -> int:
        return len(self._items) - self._head - len(self._claimed)

    def iter_by_length(self) -> Iterator[FineTuneSample]:
        # C-level iterators: admission walks this on the critical path, a generator frame per item costs more.
        live = map(_third, islice(self._items, self._head, None))
        if not self._claimed:
            return live
        claimed = self._claimed
        return filterfalse(lambda s: s.sample_id in claimed, live)

    def _find(self, sample: FineTuneSample) -> int:
        """Index of ``sample``'s live entry (at or after the head), or -1."""
        key = (sample.num_tokens, sample.sample_id)
        idx = bisect_left(self._items, key, lo=self._head, key=_order)
        if idx < len(self._items) and self._items[idx][1] == sample.sample_id:
            return idx
        return -1

    def claim(self, samples: Sequence[FineTuneSample]) -> None:
        """Take ``samples`` (usually a prefix of :meth:`iter_by_length`) out of the pool; ``ValueError`` if one
        is not in it."""
        head, k = self._head, len(samples)
        if not self._claimed and list(map(_third, self._items[head:head + k])) == list(samples):
            self._head = head + k  # the usual case: admission took the shortest samples
            self._maybe_compact()
            return
        for s in samples:
            if self._find(s) < 0 or s.sample_id in self._claimed:
                raise ValueError(f"fine-tuning sample {s.sample_id} is not in the pool (already claimed?)")
            self._claimed.add(s.sample_id)
        items = self._items
        while self._head < len(items) and items[self._head][1] in self._claimed:
            self._claimed.discard(items[self._head][1])
            self._head += 1
        self._maybe_compact()

    def release(self, sample_ids: Iterable[int]) -> None:
        """Return claimed samples, by id, to the pool (they become admissible again, in length order).

        ``TypeError`` for sample objects, ``KeyError`` for an id that is not part of the pool, ``ValueError`` for
        one that is in the pool already (as :meth:`FinetunePool.release`)."""
        ids = _sample_ids(sample_ids, "release")
        head, k = self._head, len(ids)
        if k and k <= head and list(map(_second, self._items[head - k:head])) == ids:
            self._head = head - k  # undo of the latest prefix claim: the entries are still in place
            return
        for sid in ids:
            if sid in self._claimed:
                self._claimed.discard(sid)
                continue
            s = self._by_id.get(sid)
            if s is None:
                raise KeyError(f"sample id {sid!r} is not part of this fine-tuning pool")
            if self._find(s) >= 0:
                raise ValueError(f"fine-tuning sample {sid} is in the pool already; only claimed "
                                 "samples can be released")
            key = (s.num_tokens, s.sample_id)
            self._items.insert(bisect_left(self._items, key, lo=self._head, key=_order),
                               (s.num_tokens, s.sample_id, s))

    def _maybe_compact(self) -> None:
        # Consumed entries are dropped in bulk, rarely, so the common claim never pays for a list shift.
        if self._head > 4096 and self._head * 2 > len(self._items):
            del self._items[:self._head]
            self._head = 0
