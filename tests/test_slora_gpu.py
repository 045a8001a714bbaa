"""deltaserve_slora against real S-LoRA on CUDA: patch record, outputs vs. stock S-LoRA, no leaked rows, exactness.

Needs an S-LoRA checkout with its extension built and a CUDA GPU; CI has neither, so every test here skips there.
Run ``benchmarks/gpu/slora_h200.sh`` on a CUDA machine instead (it builds a trimmed copy of S-LoRA, runs
``deltaserve conformance slora`` and this file, and writes benchmarks/results/slora_h200.json).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_coserve import (  # noqa: F401  (collected here again, against the S-LoRA host)
    dataset,
    test_coserving_keeps_client_outputs_and_learns,
    assert_within_precision,
    train_and_compare,
)

SCRIPT = "benchmarks/gpu/slora_h200.sh"


def _slora_problem() -> str | None:
    from deltaserve_slora.locate import SloraNotFoundError, locate_slora

    if not torch.cuda.is_available():
        return f"needs CUDA and a built S-LoRA checkout; run {SCRIPT} on a CUDA machine"
    try:
        checkout = locate_slora()
    except SloraNotFoundError as exc:
        return f"{exc}; run {SCRIPT}"
    if checkout.kernels is None:
        return f"S-LoRA at {checkout.root} has no built extension; run {SCRIPT}"
    return None


pytestmark = pytest.mark.skipif(_slora_problem() is not None, reason=str(_slora_problem()))


@pytest.fixture(scope="module")
def host(tiny_model: Path, tiny_adapter: Path):
    from deltaserve_core.driver import HostConfig
    from deltaserve_core.registry import create_host

    h = create_host("slora", HostConfig(model=str(tiny_model), dtype="float16", device="cuda",
                                        client_adapters={"client": str(tiny_adapter)}))
    yield h
    h.shutdown()


def test_every_recorded_patch_is_applied(host) -> None:
    from deltaserve_slora.patches import ROUTER_PATCHES

    assert host.installed == [p.target for p in ROUTER_PATCHES]  # the operator path's are checked below


def test_client_lora_dir_resolves_published_versions_and_refuses_the_rest(host, tiny_adapter: Path) -> None:
    """What an operator-path request's ``lora_dir`` may name: a published version by its name, its durable copy in
    the publish folder or S-LoRA's own folder; never the reserved fine-tuning adapter, an unknown folder or a
    withdrawn version."""
    from deltaserve_core.adapter_state import LoraAdapterState

    state = LoraAdapterState.load_pretrained(tiny_adapter, name="served", version=3)
    host.set_finetune_adapter(LoraAdapterState.load_pretrained(tiny_adapter, name="served", version=0))
    name = host.publish_adapter(state)
    own = host.published_dirs[name]
    resolve = host.client_adapter_dir
    assert resolve(None) is None
    assert resolve(name) == resolve(str(host._publish_dir / name)) == resolve(own) == own
    for refused in (host.channel.reserved_dir, str(host._publish_dir / "served@v99"), "/nowhere/at/all"):
        with pytest.raises(LookupError):
            resolve(refused)
    host.retract_adapter(name)
    for gone in (name, own):
        with pytest.raises(LookupError):
            resolve(gone)


def _reqs(tag: str, adapter: str | None, n: int = 4, seed: int = 0):
    from deltaserve_core.driver import ClientRequest

    g = torch.Generator().manual_seed(seed)
    return [ClientRequest(f"{tag}-{i}", tuple(torch.randint(5, 400, (5 + 3 * i,), generator=g).tolist()), 8,
                          adapter=adapter) for i in range(n)]


class _Inject:
    """Injects two fine-tuning samples into every prefill step (S-LoRA has no mixed steps)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.ids = iter(range(10_000, 1_000_000))

    def on_schedule(self, batch):
        from deltaserve_core.types import FineTuneSample

        if not batch.has_prefill:
            return ()
        self.steps.append(batch.step_id)
        return [FineTuneSample(next(self.ids), tuple(range(7, 7 + n)), (False,) * 3 + (True,) * (n - 3))
                for n in (9, 13)]

    def on_arrival(self, request_id, arrival_time) -> None:
        pass


def test_outputs_identical_to_stock_slora_and_no_finetune_row_reaches_client(host) -> None:
    """Greedy outputs with fine-tuning rows in every prefill step equal stock S-LoRA's (patches removed) on
    LoRA-only and base-only workloads; mixed base+LoRA batches differ in stock S-LoRA (its adapter-#0 bug), and
    equal the base-only outputs with the patches."""
    from deltaserve_slora import patches

    lora, base = _reqs("l", "client"), _reqs("b", None)
    mixed = [r if i % 2 else type(r)(r.request_id + "m", r.prompt_ids, r.max_tokens, adapter="client")
             for i, r in enumerate(_reqs("x", None))]
    inject = _Inject()
    host.intercept_schedule(inject)
    try:
        ours = {o.request_id: o.token_ids for o in host.generate(lora + base + mixed)}
        assert inject.steps, "no prefill step was offered"
        leaked = host._collector.strays
        assert not leaked and set(ours) == {r.request_id for r in lora + base + mixed}
    finally:
        host.intercept_schedule(None)
    patches.uninstall()
    try:
        stock_lora = {o.request_id: o.token_ids for o in host.generate(lora)}
        stock_base = {o.request_id: o.token_ids for o in host.generate(base)}
        stock_mixed = {o.request_id: o.token_ids for o in host.generate(mixed)}
    finally:
        host.channel.installed.clear()
        host.installed = patches.install(host.router, host.server, host.channel)
    assert {k: ours[k] for k in stock_lora} == stock_lora
    assert {k: ours[k] for k in stock_base} == stock_base
    base_in_mixed = [r for r in mixed if r.adapter is None]
    alone = {o.request_id: o.token_ids for o in host.generate(
        [type(r)(r.request_id + "-alone", r.prompt_ids, r.max_tokens) for r in base_in_mixed])}
    for r in base_in_mixed:
        assert ours[r.request_id] == alone[r.request_id + "-alone"], "base rows mixed with LoRA rows got a LoRA applied"
    seen = any(stock_mixed[r.request_id] != alone[r.request_id + "-alone"] for r in base_in_mixed)
    print(f"stock S-LoRA adapter-#0 bug reproduced on mixed batches: {seen}")


def test_aborted_step_leaves_slora_as_a_finished_step_does(host, tiny_adapter: Path) -> None:
    """A client request arrives during a fine-tuning-only step and the sink asks to abort (the core's
    should_abort): the step stops at that layer boundary, its samples are reported aborted, and S-LoRA is left as
    after any finished step: no batch in the router or the model, every KV cell free again, no fine-tuning token
    at the output stage; the request that arrived is served next, with the tokens it gets without any abort."""
    from deltaserve_conformance.harness import Recorder
    from deltaserve_core.adapter_state import LoraAdapterState
    from deltaserve_core.types import FineTuneSample

    host.set_finetune_adapter(LoraAdapterState.load_pretrained(tiny_adapter, name="abort-test", version=0))
    (late,) = _reqs("abort-late", "client", n=1, seed=7)
    want = {o.request_id: o.token_ids for o in host.generate([late])}[late.request_id]
    mm = host.server.model.mem_manager

    def ft_only_step(rec: Recorder) -> None:
        host.intercept_schedule(rec)
        host.capture_activation(rec)
        host.report_step_time(rec)
        try:
            assert host.run_idle_step() is True
        finally:
            host.intercept_schedule(None)
            host.capture_activation(None)
            host.report_step_time(None)

    # the same step, not aborted: the free KV cells it leaves (the reserved adapter stays in the pool after a
    # prefill, as S-LoRA keeps adapters loaded after a prefill minibatch) are what the aborted step must leave too
    whole = [FineTuneSample(80_000 + i, tuple(range(11, 11 + n)), (True,) * n) for i, n in enumerate((40, 24))]
    ref = Recorder(inject=lambda batch: whole if batch.is_empty and not ref.injected else ())
    ft_only_step(ref)
    assert [r.finetune_sample_ids for r in ref.records if r.finetune_sample_ids] == [(80_000, 80_001)]
    free_before = int(mm.can_use_mem_size)
    samples = [FineTuneSample(90_000 + i, tuple(range(11, 11 + n)), (True,) * n) for i, n in enumerate((40, 24))]
    rec = Recorder(inject=lambda batch: samples if batch.is_empty and not rec.injected else (), abort_after_layer=1)
    poll = rec.should_abort
    arrived: list[str] = []

    def arrival_then_poll(step_id: int) -> bool:
        if not arrived:  # the client request enters the host while the step runs (a server's request thread)
            arrived.append(late.request_id + "-again")
            host.submit(type(late)(arrived[0], late.prompt_ids, late.max_tokens, adapter=late.adapter))
        return poll(step_id)

    rec.should_abort = arrival_then_poll  # type: ignore[method-assign]
    ft_only_step(rec)
    (step_id,) = rec.injected
    record = rec.record_for(step_id)
    ids = sorted(s.sample_id for s in samples)
    assert record is not None and sorted(record.aborted_sample_ids) == ids and not record.finetune_sample_ids
    assert [e for e in rec.ended if e[0] == step_id] == [(step_id, (), tuple(s.sample_id for s in samples))]
    assert {layer for s, layer, _, _ in rec.captures if s == step_id} == {0}
    assert host.router.running_batch is None and not host.server.cache, "the aborted rows were not retired"
    assert int(mm.can_use_mem_size) == free_before, "KV cells of the aborted rows were not freed"
    assert not host._collector.strays, "a fine-tuning row's token reached the output stage"
    outs: dict = {}
    for _ in range(64):
        outs.update({o.request_id: o.token_ids for o in host.step()})
        if not host.has_unfinished():
            break
    assert outs.get(arrived[0]) == want


@pytest.mark.exactness
def test_training_through_slora_equals_plain_peft(host, dataset: Path, tiny_model: Path, tmp_path: Path) -> None:
    """S-LoRA computes in fp16 only, so the trained update is held to fp16's own noise: its distance from fp32
    PEFT's update must be within 2x plain fp16 PEFT's (test_coserve.assert_within_precision)."""
    details: dict = {}
    worst, moved, steps = train_and_compare(host, dataset, tiny_model, tmp_path, details)
    print(f"exactness through S-LoRA: adapter after {steps} steps differs from plain PEFT by {worst:.4g} (relative "
          f"max), update error {details['update_error']:.4g} (relative L2) vs plain PEFT in "
          f"{details.get('dtype')}: {details.get('peft_update_error', float('nan')):.4g}; moved {moved:.4g}")
    assert moved > 0, "training did not change the adapter"
    assert_within_precision(details)


# ------------------------------------------------------------------------------------------ operator path
# S-LoRA's own API server started by `python -m deltaserve_slora.launch` (DeltaServe in its router process) against
# the same server started plainly (S-LoRA's api_server.main through tests/slora_stock_server.py, which adds only the
# Python-3.12 event-loop fix its detokenizer needs), both as subprocesses on one GPU.

OPERATOR_PROMPTS = ["one two three four", "hello world this is a", "count to five six seven", "the cat sat on"]
OPERATOR_MAX_NEW = 8


def _http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw.strip().startswith(b"{") else {})
    except urllib.error.HTTPError as err:
        return err.code, {}


def _generate(base: str, prompt: str, lora_dir: str | None) -> tuple[int, dict]:
    body: dict = {"inputs": prompt, "parameters": {"do_sample": False, "ignore_eos": True,
                                                   "max_new_tokens": OPERATOR_MAX_NEW, "return_details": True}}
    if lora_dir is not None:
        body["lora_dir"] = lora_dir
    return _http(f"{base}/generate", body)


def _wait_up(proc, base: str, log: Path, deadline_s: float) -> None:
    from deltaserve_core.testing.servers import wait_until_up

    why = wait_until_up(f"{base}/health", proc, deadline_s)
    if why:
        if proc.poll() is None:
            proc.kill()
        pytest.fail(f"server {why}:\n{log.read_text()[-5000:]}")


def _outputs(base: str, requests: list[tuple[str, str | None]]) -> list[list[int]]:
    """All requests at once (threads), so that they share steps with each other and with fine-tuning rows."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(lambda r: _generate(base, *r), requests))
    out = []
    for status, body in results:
        assert status == 200, body
        assert body["count_output_tokens"] == OPERATOR_MAX_NEW  # no fine-tuning row's token reached the client
        out.append([t["id"] for t in body["tokens"]])
    return out


@pytest.fixture(scope="module")
def operator_servers(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tiny_adapter: Path):
    import json
    import signal
    import socket
    import subprocess
    import sys

    from deltaserve_core.adapter_state import LoraAdapterState
    from deltaserve_slora import layout
    from deltaserve_slora.locate import locate_slora

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    tmp = tmp_path_factory.mktemp("slora-operator")
    checkout = locate_slora()
    # S-LoRA serves MHA only; its API server only starts for a folder named like a Llama (print_mem_stats)
    mha, mha_cfg = layout.write_mha_checkpoint(tiny_model, tmp / "tiny-llama-mha")
    hf_cfg = json.loads((tiny_model / "config.json").read_text())
    adapter = str(layout.write_slora_adapter(LoraAdapterState.load_pretrained(tiny_adapter, name="client"), hf_cfg,
                                             tmp / "adapters" / "client"))
    records = [{"instruction": f"Count to {i} in words.", "input": "", "output": " ".join(["one"] * (i % 7 + 2))}
               for i in range(24)]
    (tmp / "data.json").write_text(json.dumps(records))
    (tmp / "job.yaml").write_text(
        "dataset: data.json\nadapter_name: served\nlora: {r: 8, alpha: 16}\nepochs: 1\n"
        "backward_batch_tokens: 48\nmax_length: 64\nbuffer_tokens: 512\nslo: {ttft_s: 5.0, tpot_s: 1.0}\n"
        "checkpoint: {dir: ckpt, every_steps: 1, keep: 2}\npublish: {policy: on_checkpoint}\n")
    env = dict(os.environ, DELTASERVE_PROFILE_DIR=str(tmp / "profiles"), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(checkout.root), os.environ.get("PYTHONPATH", "")]))
    common = ["--model_dir", str(mha), "--tokenizer_mode", "auto", "--max_total_token_num", "4096",
              "--max_req_input_len", "256", "--max_req_total_len", "512", "--batch_max_tokens", "1024",
              "--pool-size-lora", "2048", "--swap", "--lora-dirs", adapter, "--disable_log_stats",
              "--eos_id", str(mha_cfg.get("eos_token_id") or 2)]
    stock_port, ds_port = port(), port()
    stock_log, ds_log, cal_log = tmp / "stock.log", tmp / "deltaserve.log", tmp / "calibrate.log"
    procs = []
    with open(stock_log, "w") as f:
        # stock S-LoRA plus only its Python-3.12 event-loop fix (see tests/slora_stock_server.py)
        stock = subprocess.Popen([sys.executable, str(Path(__file__).with_name("slora_stock_server.py")), *common,
                                  "--port", str(stock_port), "--nccl_port", str(port())], env=env, stdout=f,
                                 stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
    procs.append(stock)
    try:
        with open(cal_log, "w") as f:  # the operator's one-time step; concurrent with the stock server's start-up
            cal = subprocess.run([sys.executable, "-m", "deltaserve_core.cli", "calibrate", "--host", "slora",
                                  "--model", str(mha), "--device", "cuda", "--dtype", "float16", "--max-prefill", "128",
                                  "--max-decode", "4", "--max-kv", "512", "--max-ft", "128", "--no-progress"],
                                 check=False, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=tmp, timeout=120)
        assert cal.returncode == 0, cal_log.read_text()[-4000:]
        with open(ds_log, "w") as f:
            ds = subprocess.Popen([sys.executable, "-m", "deltaserve_slora.launch", "--job", str(tmp / "job.yaml"),
                                   "--log-every-s", "1", "--", *common, "--port", str(ds_port), "--nccl_port",
                                   str(port())], env=env, stdout=f, stderr=subprocess.STDOUT, cwd=tmp,
                                  start_new_session=True)
        procs.append(ds)
        stock_base, ds_base = f"http://127.0.0.1:{stock_port}", f"http://127.0.0.1:{ds_port}"
        _wait_up(stock, stock_base, stock_log, 90)
        _wait_up(ds, ds_base, ds_log, 90)
        yield {"stock": stock_base, "ds": ds_base, "proc": ds, "log": ds_log, "ckpt": tmp / "ckpt",
               "adapter": adapter}
    finally:
        # Stock S-LoRA's server does not stop its router process on SIGINT (it joins it forever): each server runs
        # in its own session, whose processes all go at the end. The launcher was stopped gracefully by the test.
        for p in procs[1:]:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    pass
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def test_operator_path_outputs_equal_stock_server_and_fine_tuning_progresses(operator_servers) -> None:
    """`python -m deltaserve_slora.launch`: greedy outputs over S-LoRA's HTTP API equal the same server started
    without DeltaServe (base and LoRA requests sent to DeltaServe together, so they share steps with each other and
    with fine-tuning rows; to the stock server in separate rounds, since its mixed batches hit its adapter-#0 bug), every
    recorded patch is applied in the router process, the job trains to a checkpoint and publishes a version that
    serves, and SIGINT leaves a final checkpoint."""
    import signal
    import time

    from deltaserve_slora.patches import PATCHES

    s = operator_servers
    base = [(p, None) for p in OPERATOR_PROMPTS]
    lora = [(p, s["adapter"]) for p in OPERATOR_PROMPTS]
    requests = base + lora
    # The stock server is asked for base and LoRA requests in separate rounds: batched together, stock S-LoRA applies
    # adapter #0 to the base rows (the bug DeltaServe's zero adapter fixes), so its mixed-batch answer is not the
    # reference. DeltaServe gets them together, with fine-tuning rows in the same steps.
    expected = _outputs(s["stock"], base) + _outputs(s["stock"], lora)
    for _ in range(3):  # more than one round: later rounds meet a job that is training
        assert _outputs(s["ds"], requests) == expected
    log = s["log"].read_text()
    assert "DeltaServe co-serving started in S-LoRA's router process" in log, log[-4000:]
    applied = log.split("patches applied", 1)[1].splitlines()[0]
    assert all(p.target in applied for p in PATCHES), applied

    deadline = time.monotonic() + 60
    while not any(s["ckpt"].glob("checkpoint-*/adapter_config.json")):
        assert s["proc"].poll() is None, s["log"].read_text()[-4000:]
        assert time.monotonic() < deadline, "no checkpoint written: fine-tuning did not progress\n" + \
            s["log"].read_text()[-4000:]
        time.sleep(1)
    assert "fine-tuning: step" in s["log"].read_text()
    def newest() -> Path:
        """The newest durable copy, as an operator finds them: <checkpoint dir>/published/served@v<step>."""
        published = sorted((int(p.name.rpartition("@v")[2]), p) for p in (s["ckpt"] / "published").glob("served@v*")
                           if (p / "adapter_config.json").is_file() and not (p / ".retired").exists())
        assert published, "no adapter version was published"
        return published[-1][1]

    for by_name in (False, True):  # by its folder, by its version name
        for _ in range(10):  # the job publishes every optimizer step and keeps 2: a version may retire meanwhile
            version = newest()
            status, body = _generate(s["ds"], OPERATOR_PROMPTS[0], version.name if by_name else str(version))
            if status == 200:
                assert body["count_output_tokens"] == OPERATOR_MAX_NEW, body
                break
            assert status == 499 and (version / ".retired").exists() or not version.exists(), (version, status)
        else:
            raise AssertionError("the newest published version was never served")
    # an unknown folder is refused at once (S-LoRA's abort answer), and the server goes on serving
    assert _generate(s["ds"], OPERATOR_PROMPTS[0], str(s["ckpt"] / "published" / "no-such-adapter"))[0] == 499
    assert _outputs(s["ds"], requests) == expected  # base and client outputs unchanged by publishing

    s["proc"].send_signal(signal.SIGINT)
    assert s["proc"].wait(timeout=90) == 0, s["log"].read_text()[-4000:]
    assert "DeltaServe final checkpoint" in s["log"].read_text(), s["log"].read_text()[-4000:]
