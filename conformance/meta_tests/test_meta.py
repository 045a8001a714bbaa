"""The suite must fail each deliberately broken host on exactly its targeted check, and pass the reference."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deltaserve_conformance.checks import CHECKS, run_check
from deltaserve_conformance.plugin import build_env

from .broken_hosts import TARGETS

CACHE = Path(os.environ.get("DELTASERVE_CACHE", Path.home() / ".cache" / "deltaserve")) / "conformance"


def _failures(factory: str, targets: tuple[str, ...] = (), **options: str) -> dict[str, str]:
    """Failed checks and their messages. Broad (generated, stateful) checks run only when targeted or when every
    check is wanted (no targets): they assert every invariant, so they fail most broken hosts by design. Checks that
    spawn a second host (tens of seconds each) likewise run only when targeted or when every check is wanted."""
    env = build_env(factory, cache_dir=CACHE, validate=False, options=options)
    failed: dict[str, str] = {}
    try:
        for c in CHECKS:
            if c.requires(env.host.capabilities()) or (targets and (c.broad or c.spawns) and c.name not in targets):
                continue
            try:
                run_check(env, c)
            except AssertionError as exc:
                failed[c.name] = str(exc)
    finally:
        env.host.shutdown()
    return failed


@pytest.mark.parametrize("host_cls", list(TARGETS), ids=[cls.name for cls in TARGETS])
def test_broken_host_fails_exactly_its_check(host_cls: type) -> None:
    targets = TARGETS[host_cls]
    targets = (targets,) if isinstance(targets, str) else targets
    failed = _failures(f"{host_cls.__module__}:{host_cls.__qualname__}", targets)
    missed = [t for t in targets if t not in failed]
    assert not missed, f"{host_cls.__name__} breaks {missed} but the suite did not notice"
    extra = sorted(set(failed) - set(targets))
    assert not extra, (
        f"{host_cls.__name__} breaks only {list(targets)}, yet the suite also failed {extra}: "
        f"{[failed[k] for k in extra]}"
    )


def test_failure_messages_name_host_and_hook() -> None:
    from .broken_hosts import IgnoresAbortHost, MistypedHookHost

    failed = _failures(f"{IgnoresAbortHost.__module__}:IgnoresAbortHost", ("-",))
    msg = failed["capture_activation__abort_stops_finetune_only_step"]
    assert "broken-abort" in msg and "capture_activation" in msg
    failed = _failures(f"{MistypedHookHost.__module__}:MistypedHookHost", ("-",))
    assert "intercept_schedule" in failed["protocol__validate_host"] and "interceptor" in failed["protocol__validate_host"]


def test_reference_host_without_mixed_batches_passes_everything() -> None:
    # The S-LoRA shape of host: prefill and decode never share a step; fine-tuning rides only prefill steps.
    failed = _failures("deltaserve_core.testing.reference_host:ReferenceHost", mixed_batches="false")
    assert failed == {}, failed


def test_near_tie_allowance_follows_the_host_dtype() -> None:
    """A bf16 host's greedy token may flip a near-tie that fp32 would not: the reference (fp32) allows the flip for a
    bf16 host and refuses it for an fp32 host. Regression: every host was judged with fp32's allowance."""
    import dataclasses

    import torch

    env = build_env("deltaserve_core.testing.reference_host:ReferenceHost", cache_dir=CACHE, validate=False)
    try:
        fp32 = env.independent
        bf16 = dataclasses.replace(env, dtype="bfloat16", _independent=None).independent
        assert bf16.tie > fp32.tie
        model = fp32.model(None)
        found = None
        for seed in range(64):  # a prompt whose last position is a near-tie: between the two allowances
            gen = torch.Generator().manual_seed(seed)
            prompt = torch.randint(3, env.vocab_size, (24,), generator=gen).tolist()
            with torch.no_grad():
                top = model(input_ids=torch.tensor([prompt])).logits[0, -1].float().topk(2)
            rel_gap = float(top.values[0] - top.values[1]) / (1.0 + abs(float(top.values[0])))
            if fp32.tie < rel_gap < bf16.tie:
                found = prompt, int(top.indices[1])
                break
        assert found is not None, "no near-tied prompt among 64 seeds"
        prompt, second = found
        runner_up = [second]
        assert fp32.greedy_mismatch(None, prompt, runner_up) is not None
        assert bf16.greedy_mismatch(None, prompt, runner_up) is None
    finally:
        env.host.shutdown()
