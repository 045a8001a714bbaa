"""DeltaServe's host conformance suite: the contract of :class:`deltaserve_core.hooks.HostHooks` as checks.

Run it against any host with ``deltaserve conformance HOST`` or ``pytest --pyargs deltaserve_conformance
--host=HOST``. To run it from a fork's own test suite, subclass :class:`HostConformanceTests` and provide a
``deltaserve_conformance_env`` fixture (see :func:`deltaserve_conformance.plugin.build_env`).
"""

from __future__ import annotations

import pytest

from .checks import CHECKS, Check, run_check
from .harness import ConformanceEnv, Recorder

__all__ = ["CHECKS", "Check", "ConformanceEnv", "HostConformanceTests", "Recorder", "run_check"]


class HostConformanceTests:
    """Every check as a test method ``test_<check name>``; subclass it and supply the env fixture."""


def _method(c: Check):  # noqa: ANN202
    def test(self, deltaserve_conformance_env: ConformanceEnv) -> None:  # noqa: ANN001
        reason = c.requires(deltaserve_conformance_env.host.capabilities())  # type: ignore[attr-defined]
        if reason:
            pytest.skip(f"{c.name}: {reason}")
        run_check(deltaserve_conformance_env, c)

    test.__name__ = f"test_{c.name}"
    test.__doc__ = c.func.__doc__
    return test


for _c in CHECKS:
    setattr(HostConformanceTests, f"test_{_c.name}", _method(_c))
