"""Benchmark harness: the paper's end-to-end comparison (§4.2, Figure 5) for any registered host.

- :mod:`.traces`: burst-light, burst-dense and production-shaped arrival traces, scaling, trace-file replay;
- :mod:`.lengths`: prompt/output lengths from ShareGPT (or a user file);
- :mod:`.policies`: the co-serving variants compared (DeltaServe, idle-only, no interruption, LLMStation-style);
- :mod:`.split_pool`: the dedicated trainer process of the static-MPS and split-pool baselines (and of the
  trainer-alone rate that harvest divides by);
- :mod:`.metrics`: per-request and per-system metrics, JSON/CSV output;
- :mod:`.plots`: Figure 5-style PNG;
- :mod:`.runner`: one run over every system, and the ``deltaserve bench`` command.
"""

#: Every system family the harness runs. ``static_mps`` and ``split_pool`` take a share (``static_mps@25``).
SYSTEMS = ("bare", "deltaserve", "paper_rule", "idle_only", "no_interrupt", "llmstation", "static_mps", "split_pool")
#: Systems that attach a CoServer to the host.
COSERVED = ("deltaserve", "paper_rule", "idle_only", "no_interrupt", "llmstation")
#: A trainer process beside the bare host (no DeltaServe): what an operator runs instead.
TRAINER_BASELINES = ("static_mps", "split_pool")
#: The systems DeltaServe's headline ratio is taken against (the best of those that held 100 % SLO).
HEADLINE_BASELINES = ("static_mps", "split_pool", "idle_only", "llmstation", "paper_rule")


def family(system: str) -> str:
    """``static_mps@25`` -> ``static_mps``; ``deltaserve/tight`` -> ``deltaserve``."""
    return system.split("/", 1)[0].split("@", 1)[0]


__all__ = ["COSERVED", "HEADLINE_BASELINES", "SYSTEMS", "TRAINER_BASELINES", "family"]
