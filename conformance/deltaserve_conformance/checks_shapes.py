"""The numeric checks again, on a checkpoint shaped like a production model.

The suite's own checkpoint (``MODEL_SHAPES["test"]``: 2 layers, 4 heads over 2 KV heads) keeps every check fast, but
it cannot show a host whose bug needs what every deployed model has: a layer index of two digits (an adapter key
parsed with a one-digit pattern loads ``layers.10`` into layer 1), another GQA group size, wider projections, and the
configuration options real checkpoints differ in (head size, biases, tied head, rope base, a vocabulary past 16 bits,
generation defaults, a client adapter's own alpha; the list is at :data:`.harness.MODEL_SHAPES`). A host of
the same kind is started on ``MODEL_SHAPES["deep"]`` in a child process (a second engine never runs in the suite's
process), the checks named in :data:`.rules.SHAPE_RERUNS` run there exactly as they run on the suite's host, judged
against transformers + PEFT over that checkpoint, and each verdict comes back as its own check,
``deep_model__<check>``, failing with the original check's message. One child start per suite run serves them all.

Written after blind batch 2026-12-06 (its h15: a one-digit layer-index parser) and widened after 2026-12-06b; see
docs/conformance.md.
"""

from __future__ import annotations

import json
import os
import sys

from .checks import CHECKS, _fail, check, run_check, second_host_from_argv
from .checks_lifecycle import child_host_report
from .harness import ConformanceEnv
from .rules import SHAPE_RERUNS

__all__ = ["SHAPE", "shape_report"]

#: the entry of MODEL_SHAPES the re-runs use
SHAPE = "deep"
_MARK = "DELTASERVE-SHAPE-PROBE "
#: seconds the child gets to start its host and run every re-run (a 12-layer model on a 2-core CPU engine)
_CHILD_LIMIT_S = 600.0


def _shape_child() -> None:
    """Child-process entry: start a host of the kind under test on the deep checkpoint, run every re-run, print one
    marked JSON line: check name -> {"verdict": pass|fail|skip|error, "message": ...}."""
    import pytest

    try:
        env = second_host_from_argv()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which skips with it
        print(_MARK + json.dumps({"stage": "start", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    report: dict = {"stage": "done", "checks": {}}
    by_name = {c.name: c for c in CHECKS}
    try:
        caps = env.host.capabilities()  # type: ignore[attr-defined]
        for name in SHAPE_RERUNS:
            c = by_name[name]
            unmet = c.requires(caps)
            if unmet:
                report["checks"][name] = {"verdict": "skip", "message": unmet}
                continue
            try:
                run_check(env, c)
                report["checks"][name] = {"verdict": "pass", "message": ""}
            except AssertionError as exc:
                report["checks"][name] = {"verdict": "fail", "message": str(exc)}
            except pytest.skip.Exception as exc:
                report["checks"][name] = {"verdict": "skip", "message": str(exc)}
            except Exception as exc:  # noqa: BLE001 - a crash inside a check is the host's failure too
                report["checks"][name] = {"verdict": "error", "message": f"{type(exc).__name__}: {exc}"}
    finally:
        try:
            env.host.shutdown()  # type: ignore[attr-defined]
        finally:
            print(_MARK + json.dumps(report), flush=True)
            sys.stdout.flush()
            os._exit(0)  # the shutdown rules are checks_lifecycle's; a slow exit here would only cost time


def shape_report(env: ConformanceEnv) -> dict:
    """The child's report for the kind of host ``env`` runs (started once per env, shared by the re-run checks)."""
    return child_host_report(env, "deltaserve_conformance.checks_shapes:_shape_child", _MARK, model_shape=SHAPE,
                             wait_s=_CHILD_LIMIT_S)


def _rerun(name: str, hook: str, doc: str):  # noqa: ANN202
    def run(env: ConformanceEnv) -> None:
        import pytest

        report = shape_report(env)
        if report["stage"] == "no report":
            raise _fail(env, hook, f"a host of the same kind on the {SHAPE!r} checkpoint gave no report within "
                        f"{_CHILD_LIMIT_S:.0f} s: {report['error']}")
        if report["stage"] == "start":
            pytest.skip(f"a {env.host_spec} host could not start on the {SHAPE!r} checkpoint in a child process "
                        f"({report['error'][:300]}); {name} was not re-run there")
        verdict = report["checks"].get(name, {"verdict": "error", "message": "no verdict in the child's report"})
        if verdict["verdict"] == "skip":
            pytest.skip(f"deep_model__{name}: {verdict['message'][:300]}")
        if verdict["verdict"] in ("fail", "error"):
            raise _fail(env, hook, f"on the {SHAPE!r} checkpoint (12 layers, 8 heads over 2 KV heads, hidden 256), "
                        f"started in a child process: {verdict['message']}")

    run.__name__ = f"check_deep_model__{name}"
    run.__doc__ = (f"``{name}`` again, on a host of the same kind started on the {SHAPE!r} checkpoint "
                   f"(two-digit layer indices, another GQA group, wider projections):\n\n{doc}")
    return run


for _name in SHAPE_RERUNS:
    _original = next(c for c in CHECKS if c.name == _name)
    check(_original.hook, requires=_original.requires, spawns=True)(_rerun(_name, _original.hook, _original.func.__doc__ or ""))
