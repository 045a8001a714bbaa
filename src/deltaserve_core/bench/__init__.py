"""Benchmark harness: the paper's end-to-end comparison (§4.2, Figure 5) for any registered host.

- :mod:`.traces`: burst-light, burst-dense and production-shaped arrival traces, scaling, trace-file replay;
- :mod:`.lengths`: prompt/output lengths from ShareGPT (or a user file);
- :mod:`.policies`: the co-serving variants compared (DeltaServe, idle-only, no interruption, LLMStation-style);
- :mod:`.split_pool`: the split-pool baseline's dedicated trainer process;
- :mod:`.metrics`: per-request and per-system metrics, JSON/CSV output;
- :mod:`.plots`: Figure 5-style PNG;
- :mod:`.runner`: one run over every system, and the ``deltaserve bench`` command.
"""

#: Every system the harness runs, in the order they run and are plotted.
SYSTEMS = ("bare", "deltaserve", "paper_rule", "idle_only", "no_interrupt", "llmstation", "split_pool")
#: Systems that attach a CoServer to the host.
COSERVED = ("deltaserve", "paper_rule", "idle_only", "no_interrupt", "llmstation")

__all__ = ["COSERVED", "SYSTEMS"]
