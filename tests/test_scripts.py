"""scripts/test.sh, scripts/test_sglang.sh and scripts/test_vllm_low.sh: pytest arguments reach every part of the
run.

The scripts run with ``DELTASERVE_TEST_PLAN=1``, which prints each command instead of running it (no setup, no
pytest): what is checked is which arguments each pytest call would get.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _plan(script: str, *args: str) -> list[list[str]]:
    run = subprocess.run(["bash", f"scripts/{script}", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, DELTASERVE_TEST_PLAN="1"))
    assert run.returncode == 0, run.stderr
    return [shlex.split(ln[len("plan:"):]) for ln in run.stdout.splitlines() if ln.startswith("plan:")]


def _pytest_calls(plan: list[list[str]]) -> list[list[str]]:
    return [cmd for cmd in plan if cmd[1:3] == ["-m", "pytest"]]


def test_options_reach_the_sglang_part() -> None:
    plan = _plan("test.sh", "-x", "-k", "publish and not slow")
    assert ["bash", "scripts/test_sglang.sh", "-x", "-k", "publish and not slow"] in plan
    main = _pytest_calls(plan)
    # the engine tests serially, then the meta-tests on two workers
    assert [cmd[3] for cmd in main] == ["tests", "conformance/meta_tests"] and main[1][4:6] == ["-n", "2"]
    assert all(cmd[-3:] == ["-x", "-k", "publish and not slow"] for cmd in main)
    sglang = _pytest_calls(_plan("test_sglang.sh", "-x", "-k", "publish and not slow"))
    assert len(sglang) == len(list((REPO / "tests" / "sglang").glob("test_*.py"))) > 1  # one process per module
    assert all(cmd[0] == ".venv-sglang/bin/python" and cmd[-3:] == ["-x", "-k", "publish and not slow"]
               for cmd in sglang)


def test_paths_go_to_their_own_environment() -> None:
    args = ("-v", "tests/test_cli.py", "tests/sglang/test_sglang_server.py::test_x")
    plan = _plan("test.sh", *args)
    main = _pytest_calls(plan)
    assert len(main) == 1 and "tests/test_cli.py" in main[0] and not any("sglang/" in w for w in main[0])
    assert ["bash", "scripts/test_sglang.sh", *args] in plan
    sglang = _pytest_calls(_plan("test_sglang.sh", *args))
    assert sglang == [[".venv-sglang/bin/python", "-m", "pytest", "tests/sglang/test_sglang_server.py::test_x",
                       "-p", "no:cacheprovider", "-q", "-v"]]


def test_a_part_without_paths_of_its_own_is_skipped() -> None:
    assert _pytest_calls(_plan("test_sglang.sh", "tests/test_cli.py")) == []
    plan = _plan("test.sh", "tests/sglang/test_sglang_host.py")
    assert _pytest_calls(plan) == []  # nothing for the main environment, not even its setup
    assert plan == [["bash", "scripts/test_sglang.sh", "tests/sglang/test_sglang_host.py"]]


def test_a_selection_that_empties_a_module_is_a_pass() -> None:
    def ok(rc: int, *args: str) -> bool:
        script = f"source scripts/test_args.sh; split_test_args {shlex.join(args)}; pytest_ok {rc}"
        return subprocess.run(["bash", "-c", script], cwd=REPO, timeout=30).returncode == 0

    assert ok(0) and ok(5, "-k", "publish") and ok(5, "-mslow")
    assert not ok(5) and not ok(5, "-x") and not ok(1, "-k", "publish")


def test_import_direction_holds() -> None:
    # docs/architecture.md states it: the core never imports an adapter, the contract imports only the contract
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "check_import_direction.py")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_the_oldest_vllm_part_gets_options_and_only_vllm_paths() -> None:
    opts = ("-x", "-k", "publish and not slow")
    assert ["bash", "scripts/test_vllm_low.sh", *opts] in _plan("test.sh", *opts)
    low = _pytest_calls(_plan("test_vllm_low.sh", *opts))
    assert len(low) == 1 and low[0][0] == ".venv-vllm-low/bin/python" and low[0][-3:] == list(opts)
    assert "tests/test_vllm_host.py" in low[0] and "tests/test_coserve_vllm.py" in low[0]
    # a vLLM test path replaces the default selection; other paths are not this part's
    args = ("-v", "tests/test_cli.py", "tests/test_vllm_async.py::test_x")
    assert ["bash", "scripts/test_vllm_low.sh", *args] in _plan("test.sh", *args)
    assert _pytest_calls(_plan("test_vllm_low.sh", *args)) == [
        [".venv-vllm-low/bin/python", "-m", "pytest", "tests/test_vllm_async.py::test_x", "-p", "no:cacheprovider",
         "-q", "--durations=10", "-v"]]
    assert _pytest_calls(_plan("test_vllm_low.sh", "tests/test_cli.py")) == []
    assert not any("test_vllm_low.sh" in w for cmd in _plan("test.sh", "tests/test_cli.py") for w in cmd)
