"""Replays the S-LoRA conformance failure of 2026-12-02 on a GPU, without hypothesis, in about a minute.

The H200 run at 3485d68 failed ``generated__scenarios_keep_every_invariant`` on ::

    Scenario(requests=((21, 3, False, 1), (61, 2, False, 3)), injections=((34, 68, 31, 33, 24), (32, 9, 39),
             (41, 33, 65)), template=16, fill=0.9, fill_rows=7, seed=41917)

Root cause (docs/slora-adapter.md, "The offload crash"): after the prefill with 7 fine-tuning rows (reserved adapter +
zero adapter loaded), the decode that finishes request 1 while request 0 runs calls S-LoRA's
``InferAdapter.offload_adapters({None})``, which raises IndexError after the router dropped request 1 but before the
model batch did; every later decode then raised ``KeyError: 'gen-3-41917-1'``.

What this checks, through the real SloraHost and conformance's own scenario player (every invariant, outputs
against transformers):

1. with the patches: the scenario passes, twice (the second run meets whatever the first left), and afterwards the
   router and the model hold no batch;
2. ``--stock-offload`` also: with the offload wrap removed the same scenario fails with S-LoRA's IndexError in
   ``offload_adapters`` (the root cause, on the engine), and the host recovers: a scenario right after it passes.

    DELTASERVE_SLORA_PATH=<built S-LoRA> python benchmarks/gpu/slora_repro.py [--stock-offload]

(``SLORA_REPRO=1 bash benchmarks/gpu/slora_h200.sh`` builds S-LoRA and runs this with ``--stock-offload``.)
Exit status 0 when every expectation holds.
"""

from __future__ import annotations

import argparse
import sys
import traceback

SCENARIO = dict(requests=((21, 3, False, 1), (61, 2, False, 3)),
                injections=((34, 68, 31, 33, 24), (32, 9, 39), (41, 33, 65)),
                template=16, fill=0.9, fill_rows=7, seed=41917)
#: every request finishes in the same step: no offload that keeps nothing, so it passes even without the wrap
SAFE = dict(requests=((21, 3, False, 0), (61, 3, True, 0)), injections=((34, 68), (32, 9)), template=16, seed=7)


def _engine_idle(env) -> str | None:  # noqa: ANN001
    host = env.host
    if host.router.running_batch is not None or host.server.cache:
        return (f"router batch {host.router.running_batch!r}, model batches "
                f"{ {k: [r['request_id'] for r in b.requests] for k, b in host.server.cache.items()} }")
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stock-offload", action="store_true",
                    help="also run the scenario with the offload wrap removed (expects S-LoRA's IndexError)")
    opts = ap.parse_args()

    from deltaserve_conformance.plugin import build_env
    from deltaserve_conformance.scenarios import Scenario, _play

    env = build_env("slora", device="cuda", dtype="float16")
    failures = []

    def expect(name: str, ok: bool, detail: str = "") -> None:
        print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
        if not ok:
            failures.append(name)

    try:
        for attempt in (1, 2):
            try:
                _play(env, Scenario(**SCENARIO))
                idle = _engine_idle(env)
                expect(f"scenario seed 41917, run {attempt}", idle is None, idle or "")
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the next expectations still run
                expect(f"scenario seed 41917, run {attempt}", False, "".join(traceback.format_exception(exc))[-3000:])

        if opts.stock_offload:
            from deltaserve_slora import patches

            target = "slora.server.router.model_infer.infer_adapter.InferAdapter.offload_adapters"
            assert env.host.installed[-1] == target, env.host.installed
            patches._UNDO.pop()()  # the offload wrap is the last one install() applies
            try:
                _play(env, Scenario(**SCENARIO))
                expect("stock offload crashes on the scenario", False, "the scenario passed without the wrap: S-LoRA "
                       "no longer crashes there, so the offload wrap can go (see its remove_when)")
            except IndexError as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                expect("stock offload crashes on the scenario", where.name == "offload_adapters",
                       f"IndexError in {where.name} ({where.filename}:{where.lineno}): {exc}")
                expect("the host noted the recovery", any("dropped its running batch" in n
                                                           for n in getattr(exc, "__notes__", [])))
            except Exception as exc:  # noqa: BLE001
                expect("stock offload crashes on the scenario", False, "".join(traceback.format_exception(exc))[-3000:])
            idle = _engine_idle(env)
            expect("engine consistent after the failed step", idle is None, idle or "")
            try:
                _play(env, Scenario(**SAFE))
                expect("a scenario after the recovery passes", _engine_idle(env) is None)
            except Exception as exc:  # noqa: BLE001
                expect("a scenario after the recovery passes", False, "".join(traceback.format_exception(exc))[-3000:])
    finally:
        env.host.shutdown()
    print("slora_repro:", "OK" if not failures else f"FAILED {failures}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
