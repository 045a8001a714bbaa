"""Benchmark harness: the paper's end-to-end comparison (§4.2, Figure 5) for any registered host.

- :mod:`.traces`: burst-light, burst-dense and production-shaped arrival traces, scaling, trace-file replay;
- :mod:`.lengths`: prompt/output lengths from ShareGPT (or a user file);
- :mod:`.policies`: the co-serving variants compared (DeltaServe, idle-only, no interruption, LLMStation-style);
- :mod:`.split_pool`: the dedicated trainer process of the static-MPS and split-pool baselines (and of the
  trainer-alone rate that harvest divides by);
- :mod:`.metrics`: per-request and per-system metrics, JSON/CSV output;
- :mod:`.plots`: Figure 5-style PNG;
- the ``stock`` systems: the engine as shipped, from the host's registry entry (``HostSpec.stock``);
- :mod:`.runner`: one run over every system, and the ``deltaserve bench`` command.
"""

#: Every system family the harness runs. ``static_mps`` and ``split_pool`` take a share (``static_mps@25``).
SYSTEMS = ("bare", "deltaserve", "paper_rule", "idle_only", "no_interrupt", "llmstation", "static_mps", "split_pool",
           "stock", "stock_ds_config", "served", "served_paused")
#: Systems that attach a CoServer to the host.
COSERVED = ("deltaserve", "paper_rule", "idle_only", "no_interrupt", "llmstation")
#: A trainer process beside the bare host (no DeltaServe): what an operator runs instead.
TRAINER_BASELINES = ("static_mps", "split_pool")
#: The engine as shipped, without DeltaServe, in a child process (the inference tax is measured against ``stock``;
#: ``stock_ds_config`` is the same engine given DeltaServe's engine settings). Opt-in: not part of ``--systems all``.
STOCK = ("stock", "stock_ds_config")
#: DeltaServe as an operator runs it: the engine's own serving engine with DeltaServe's plugin and the job, in a child
#: process (``served_paused``: the job paused before the first request, the configuration's tax alone). Opt-in.
SERVED = ("served", "served_paused")
#: Systems whose engine runs in a child process from the host's ``stock`` runner.
CHILD_ENGINES = STOCK + SERVED
#: The systems DeltaServe's headline ratio is taken against (the best of those that held 100 % SLO).
HEADLINE_BASELINES = ("static_mps", "split_pool", "idle_only", "llmstation", "paper_rule")


def family(system: str) -> str:
    """``static_mps@25`` -> ``static_mps``; ``deltaserve/tight`` -> ``deltaserve``."""
    return system.split("/", 1)[0].split("@", 1)[0]


__all__ = ["CHILD_ENGINES", "COSERVED", "HEADLINE_BASELINES", "SERVED", "STOCK", "SYSTEMS", "TRAINER_BASELINES", "family", "source_commit"]


def source_commit() -> str | None:
    """The commit of the code that produced a result, for every result JSON.

    ``DELTASERVE_COMMIT`` wins: the GPU machine gets a copy of the working tree without ``.git``, so its calls pass
    the hash in. Otherwise ``git rev-parse HEAD`` of the checkout this package runs from, with ``+dirty`` when
    tracked files differ from it; None outside a checkout."""
    import os
    import subprocess
    from pathlib import Path

    given = os.environ.get("DELTASERVE_COMMIT", "").strip()
    if given:
        return given
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
