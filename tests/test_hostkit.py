"""The host kit: the bookkeeping the engine adapters share (deltaserve_core.hostkit)."""

from __future__ import annotations

import pytest

from deltaserve_core import hostkit
from deltaserve_core.hostkit import (
    PatchRecord,
    ProfileDraw,
    StepPlan,
    TokenClock,
    check_patch_records,
    parse_published_name,
    publish_dir,
    published_name,
    published_pattern,
)
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProfileShape


def _sample(i: int, n: int) -> FineTuneSample:
    return FineTuneSample(i, tuple(range(3, 3 + n)), (False,) + (True,) * (n - 1))


@pytest.mark.parametrize("name,version", [("support-bot", 0), ("a", 7), ("x.y_z", 123456)])
def test_published_names_round_trip(name: str, version: int) -> None:
    full = published_name(name, version)
    assert full == f"{name}@v{version}"
    assert parse_published_name(full) == (name, version)
    assert parse_published_name(full, name) == (name, version)
    assert published_pattern(name).fullmatch(full).group(1) == str(version)


@pytest.mark.parametrize("text", ["bot", "bot@v", "@v3", "bot@vx", "bot@v3a", "bot@latest", "bot@v\u0663"])
def test_names_that_are_not_published_versions(text: str) -> None:
    assert parse_published_name(text) is None


def test_a_published_name_of_another_adapter_is_not_ours() -> None:
    assert parse_published_name("other@v3", "bot") is None
    assert published_pattern("bot").fullmatch("bot2@v3") is None
    assert published_pattern("b.t").fullmatch("bat@v3") is None  # the adapter name is literal, not a pattern


def test_every_engine_publishes_into_the_same_folder(tmp_path) -> None:
    from deltaserve_core.job_config import load_job_config

    job_file = tmp_path / "job.yaml"
    data = tmp_path / "d.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n')
    job_file.write_text(f"dataset: {data}\nadapter_name: bot\ncheckpoint: {{dir: {tmp_path / 'ck'}}}\n")
    job = load_job_config(job_file)
    assert publish_dir(job) == tmp_path / "ck" / "published"


def test_a_plan_becomes_the_record_of_what_ran() -> None:
    plan = StepPlan(step_id=4, samples={"r1": _sample(1, 5), "r2": _sample(2, 3)}, prefill_lengths=(7,),
                    num_decode=2, kv_tokens=40, refused=(9,), start=10.0, duration=0.25)
    record = plan.to_record()
    assert (record.step_id, record.start_time, record.duration_s, record.mode) == (4, 10.0, 0.25, ExecutionMode.EAGER)
    assert record.finetune_sample_ids == (1, 2) and record.finetune_lengths == (5, 3)
    assert record.aborted_sample_ids == (9,)
    assert (record.prefill_lengths, record.num_decode, record.kv_tokens) == ((7,), 2, 40)


def test_an_aborted_step_voids_every_row_and_keeps_the_refused_ones() -> None:
    plan = StepPlan(step_id=1, samples={"r1": _sample(1, 5)}, refused=(3,))
    record = plan.to_record(start=1.0, duration=0.1, mode=ExecutionMode.GRAPH, aborted=True)
    assert record.finetune_sample_ids == () and record.finetune_lengths == ()
    assert record.aborted_sample_ids == (1, 3)
    assert record.mode is ExecutionMode.GRAPH


def test_a_plan_that_never_started_is_stamped_now() -> None:
    assert StepPlan(step_id=0).to_record().start_time > 0


def test_the_token_clock_moves_only_when_outputs_grow() -> None:
    clock = TokenClock()
    assert clock.times("a") == (None, None)
    clock.observe("a", 0, now=1.0)
    assert clock.times("a") == (None, None) and "a" not in clock
    clock.observe("a", 1, now=2.0)
    clock.observe("a", 1, now=3.0)  # no new token: times unchanged
    assert clock.times("a") == (2.0, 2.0)
    clock.observe("a", 3, now=4.0)
    assert clock.times("a") == (2.0, 4.0)
    clock.forget("a")
    assert clock.times("a") == (None, None) and len(clock) == 0


def test_a_profile_shape_draws_the_same_inputs_every_time() -> None:
    shape = ProfileShape(prefill_lengths=(4, 6), num_decode=2, decode_context=8, finetune_lengths=(5, 2))
    a, b = ProfileDraw(shape, 100), ProfileDraw(shape, 100)
    assert [a.tokens(4), a.tokens(6)] == [b.tokens(4), b.tokens(6)]
    samples = a.finetune_samples()
    assert samples == b.finetune_samples()
    assert [s.sample_id for s in samples] == [-1, -2] and [s.num_tokens for s in samples] == [5, 2]
    assert all(s.loss_mask[0] is False and all(s.loss_mask[1:]) for s in samples)
    assert all(3 <= t < 100 for s in samples for t in s.input_ids)
    other = ProfileDraw(ProfileShape(prefill_lengths=(4,), num_decode=2, decode_context=8), 100)
    assert other.tokens(20) != ProfileDraw(shape, 100).tokens(20)


def _record(**kw: str) -> PatchRecord:
    fields = dict(target="engine.Thing.method", how="instance wrap", why="w", upstream="u", remove_when="r")
    fields.update(kw)
    return PatchRecord(**fields)


@pytest.mark.parametrize("empty", ["target", "how", "why", "upstream", "remove_when"])
def test_a_patch_record_without_its_reasons_is_refused(empty: str) -> None:
    with pytest.raises(ValueError, match=empty):
        check_patch_records([_record(**{empty: "  "})])


def test_a_patch_recorded_twice_is_refused() -> None:
    check_patch_records([_record(), _record(applies="server")])
    with pytest.raises(ValueError, match="twice"):
        check_patch_records([_record(), _record()])


def test_the_host_kit_imports_no_engine_and_no_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, deltaserve_core.hostkit; "
            "bad = [m for m in ('torch', 'vllm', 'sglang', 'slora', 'transformers') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert hostkit.__all__


ADAPTER_DOCS = {"vllm": "vllm-adapter.md", "sglang": "sglang-adapter.md", "slora": "slora-adapter.md"}


@pytest.mark.parametrize("host", sorted(ADAPTER_DOCS))
def test_every_engine_patch_has_a_complete_record_named_in_its_adapter_doc(host: str) -> None:
    """Each adapter's patches load without its engine, carry every field, and the adapter's doc names each one."""
    from pathlib import Path

    from deltaserve_core.registry import available_hosts

    spec = available_hosts()[host]
    records = spec.patch_records()
    assert records, f"{host}: no patch records (HostSpec.patches)"
    check_patch_records(records)
    doc = (Path(__file__).resolve().parents[1] / "docs" / ADAPTER_DOCS[host]).read_text()
    for r in records:
        # the changed method or global by its last dotted name (docs abbreviate the module path)
        leaf = r.target.split()[0].split("/")[0].split(".")[-1]
        assert leaf in doc, f"{host}: patch {r.target!r} is not named in docs/{ADAPTER_DOCS[host]}"


def test_hosts_patches_lists_every_record(capsys) -> None:
    from deltaserve_core.cli import main
    from deltaserve_core.registry import available_hosts

    assert main(["hosts", "--patches"]) == 0
    out = capsys.readouterr().out
    for spec in available_hosts().values():
        for r in spec.patch_records():
            assert r.target in out and "remove when:" in out


def test_installs_hooks_replaces_and_removes() -> None:
    class Host(hostkit.InstallsHooks):
        def __init__(self) -> None:
            self.hooks = hostkit.HookSlots()

    host, first, second = Host(), object(), object()
    host.intercept_schedule(first)  # type: ignore[arg-type]
    host.capture_activation(first)  # type: ignore[arg-type]
    host.report_step_time(first)  # type: ignore[arg-type]
    host.intercept_schedule(second)  # type: ignore[arg-type]
    assert host.hooks.interceptor is second and host.hooks.activation_sink is first
    host.intercept_schedule(None)
    host.capture_activation(None)
    host.report_step_time(None)
    assert (host.hooks.interceptor, host.hooks.activation_sink, host.hooks.step_sink) == (None, None, None)
