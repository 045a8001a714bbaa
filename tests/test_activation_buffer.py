"""ActivationBuffer: admission accounting, the ActivationSink contract, FT-only abort, cross-process sharing."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import multiprocessing as mp
import pickle

import pytest
import torch

from deltaserve_core.activation_buffer import (
    ActivationBuffer,
    ActivationBufferError,
    SlotState,
)
from deltaserve_core.shared_memory import SharedFlag, SharedMemoryError
from deltaserve_core.types import FineTuneSample

L, H = 3, 8


def sample(sid: int, n: int, prompt: int = 1) -> FineTuneSample:
    return FineTuneSample(sid, tuple(range(100 + sid, 100 + sid + n)), tuple([False] * prompt + [True] * (n - prompt)))


def feed(buf: ActivationBuffer, step: int, samples: list[FineTuneSample], *,
         layers: int = L) -> dict[int, torch.Tensor]:
    """Act as a host: begin_step, one layer_input per (layer, sample) in layer order; returns what was fed."""
    fed = {s.sample_id: torch.randn(L, s.num_tokens, H) for s in samples}
    buf.begin_step(step, samples)
    for layer in range(layers):
        for s in samples:
            buf.layer_input(step, layer, s.sample_id, fed[s.sample_id][layer])
    return fed


@pytest.fixture()
def buf():
    b = ActivationBuffer(L, H, capacity_tokens=32, max_samples=8)
    yield b
    b.close()


def test_reserve_accounts_tokens_and_refuses_when_full(buf: ActivationBuffer) -> None:
    assert buf.free_tokens == 32
    a = buf.reserve(sample(1, 10))
    b = buf.reserve(sample(2, 12))
    assert a is not None and b is not None and (a.offset, b.offset) == (0, 10)
    assert buf.free_tokens == 10 and buf.used_tokens == 22
    assert buf.reserve(sample(3, 11)) is None and buf.can_reserve(10) and not buf.can_reserve(11)
    with pytest.raises(ActivationBufferError, match="already holds"):
        buf.reserve(sample(1, 10))
    assert buf.release(1) and not buf.release(1)
    # freed range at the front is reused; contiguity is honoured
    c = buf.reserve(sample(4, 9))
    assert c is not None and c.offset == 0
    assert buf.free_tokens == 11 and not buf.can_reserve(11)  # 1 + 10 free, not contiguous
    d = buf.reserve(sample(5, 10))
    assert d is not None and d.offset == 22


def test_sink_protocol_stores_layer_inputs_and_tokens(buf: ActivationBuffer) -> None:
    samples = [sample(1, 5, prompt=2), sample(2, 7)]
    for s in samples:
        buf.reserve(s)
    fed = feed(buf, 0, samples)
    assert buf.slot(1).state == SlotState.CAPTURING
    buf.end_step(0, [1, 2], [])
    assert buf.ready_sample_ids() == [1, 2]
    for s in samples:
        cap = buf.captured(s.sample_id)
        assert torch.equal(cap.hidden, fed[s.sample_id])
        assert cap.input_ids.tolist() == list(s.input_ids) and cap.loss_mask.tolist() == list(s.loss_mask)
        assert cap.num_targets == s.num_targets
        assert cap.hidden.data_ptr() == buf.data[0, buf.slot(s.sample_id).offset].data_ptr()  # a view, no copy
    buf.release(1)
    with pytest.raises(ActivationBufferError, match="not ready"):
        buf.captured(1)


def test_sink_rejects_out_of_order_layers_wrong_shapes_and_unreserved_samples(buf: ActivationBuffer) -> None:
    with pytest.raises(ActivationBufferError, match="no buffer slot"):
        buf.begin_step(0, [sample(9, 4)])
    s = sample(1, 4)
    buf.reserve(s)
    buf.begin_step(1, [s])
    with pytest.raises(ActivationBufferError, match="expected layer 0"):
        buf.layer_input(1, 1, 1, torch.zeros(4, H))
    with pytest.raises(ActivationBufferError, match="shape"):
        buf.layer_input(1, 0, 1, torch.zeros(3, H))
    buf.layer_input(1, 0, 1, torch.zeros(1, 4, H))  # a leading batch dim of 1 is accepted
    with pytest.raises(ActivationBufferError, match="1/3 layers"):
        buf.end_step(1, [1], [])
    assert buf.slot(1) is None  # incomplete capture is never handed to the backward


def test_abort_only_for_marked_finetune_only_steps(buf: ActivationBuffer) -> None:
    mixed, ft_only = [sample(1, 4)], [sample(2, 4), sample(3, 4)]
    for s in mixed + ft_only:
        buf.reserve(s)
    assert not buf.request_abort()  # nothing marked: nothing to stop, flag stays clear
    assert not buf.abort_requested
    buf.mark_finetune_only(8)
    buf.begin_step(7, mixed)
    buf.begin_step(8, ft_only)
    assert not buf.should_abort(8)
    assert buf.request_abort()
    assert buf.should_abort(8) and not buf.should_abort(7)  # a mixed step is never cut short
    buf.layer_input(8, 0, 2, torch.ones(4, H))
    buf.end_step(8, [], [2, 3])
    assert buf.slot(2) is None and buf.slot(3) is None  # captures discarded, ranges free again
    assert not buf.abort_requested  # disarmed once no FT-only step is left
    for layer in range(L):
        buf.layer_input(7, layer, 1, torch.ones(4, H))
    buf.end_step(7, [1], [])
    assert buf.ready_sample_ids() == [1]
    assert buf.reserve(sample(2, 4)) is not None  # the aborted sample can be admitted again


def test_plain_pickle_shares_memory(buf: ActivationBuffer) -> None:
    s = sample(1, 4)
    buf.reserve(s)
    other = pickle.loads(pickle.dumps(buf))
    fed = feed(other, 0, [s])
    other.end_step(0, [1], [])
    assert buf.ready_sample_ids() == [1]
    assert torch.equal(buf.captured(1).hidden, fed[1])
    other.close()  # not the owner: frees nothing
    assert buf.free_tokens == 32 - 4
    buf.mark_finetune_only(3)
    buf.request_abort()
    assert other.should_abort(3)


def _child_feeds(buf: ActivationBuffer, flag: SharedFlag, s: FineTuneSample) -> None:
    buf.begin_step(0, [s])
    for layer in range(buf.num_layers):
        buf.layer_input(0, layer, s.sample_id, torch.full((s.num_tokens, buf.hidden_size), float(layer)))
    buf.end_step(0, [s.sample_id], [])
    flag.clear()


def test_another_process_feeds_the_buffer() -> None:
    """The host's forward may run in another process: it unpickles the sink and writes into the same memory."""
    buf = ActivationBuffer(L, H, capacity_tokens=16)
    flag = SharedFlag(True)
    try:
        s = sample(5, 6)
        buf.reserve(s)
        proc = mp.get_context("spawn").Process(target=_child_feeds, args=(buf, flag, s))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        assert not flag.is_set()
        cap = buf.captured(5)
        assert [float(cap.hidden[layer].mean()) for layer in range(L)] == [0.0, 1.0, 2.0]
    finally:
        buf.close()
        flag.close()


def test_close_unlinks_shared_files() -> None:
    b = ActivationBuffer(1, 4, capacity_tokens=4)
    path = b._data_shm.path
    assert os.path.exists(path)
    b.close()
    assert not os.path.exists(path)
    with pytest.raises(SharedMemoryError, match="no longer exists"):
        pickle.loads(pickle.dumps(b))


def test_random_reserve_release_never_overlaps() -> None:
    import random

    rng = random.Random(0)
    b = ActivationBuffer(1, 2, capacity_tokens=200, max_samples=16)
    held: dict[int, tuple[int, int]] = {}
    try:
        for sid in range(2000):
            if held and rng.random() < 0.45:
                victim = rng.choice(sorted(held))
                assert b.release(victim)
                del held[victim]
            n = rng.randint(2, 40)
            fits = b.can_reserve(n)
            slot = b.reserve(sample(sid, n))
            assert (slot is not None) == fits
            if slot is not None:
                held[sid] = (slot.offset, slot.offset + n)
            spans = sorted(held.values())
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
            assert all(0 <= lo and hi <= 200 for lo, hi in spans)
            assert b.free_tokens == 200 - sum(hi - lo for lo, hi in spans)
    finally:
        b.close()
