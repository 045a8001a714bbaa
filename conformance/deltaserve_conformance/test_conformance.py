"""Collects every check of :mod:`deltaserve_conformance.checks` for the host chosen with ``--host``."""

from __future__ import annotations

import pytest

from deltaserve_conformance.checks import CHECKS, Check, run_check
from deltaserve_conformance.harness import ConformanceEnv


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_host(check: Check, deltaserve_conformance_env: ConformanceEnv) -> None:
    reason = check.requires(deltaserve_conformance_env.host.capabilities())  # type: ignore[attr-defined]
    if reason:
        pytest.skip(f"{check.name}: {reason}")
    run_check(deltaserve_conformance_env, check)
