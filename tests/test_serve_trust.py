"""Issue 20 (items 1, 2, 5), in process and quick: what clients may do with DeltaServe's adapters, failed saves,
pruning and durable published versions, leftovers of killed processes.

The multiprocess ``vllm serve`` counterparts (the load-endpoint attacks over HTTP, SIGINT -> final checkpoint,
restart) are in tests/test_vllm_serve.py; ``deltaserve serve``, which runs that server, in tests/test_serve.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from deltaserve_core.checkpoint import check_writable_dir, clean_stale
from deltaserve_core.cleanup import clean_stale_files, make_temp_dir
from test_coserve import host  # noqa: F401  (the reference host, one per module)

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------------------------------------- checkpoint dir


@pytest.mark.parametrize("kind", ["file", "under_file", "proc"])
def test_unwritable_checkpoint_dir_is_refused_naming_the_key(tmp_path: Path, kind: str) -> None:
    if kind == "file":
        target = tmp_path / "ckpt"
        target.write_text("not a folder")
    elif kind == "under_file":
        (tmp_path / "f").write_text("x")
        target = tmp_path / "f" / "ckpt"
    else:
        target = Path("/proc/deltaserve-ckpt-test")
    with pytest.raises(ValueError, match=r"checkpoint\.dir") as err:
        check_writable_dir(target)
    assert str(target) in str(err.value)


def test_writable_checkpoint_dir_is_created_and_left_clean(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert check_writable_dir(target) == target
    assert target.is_dir() and list(target.iterdir()) == []


def test_stale_half_written_checkpoints_are_removed_only_for_dead_writers(tmp_path: Path) -> None:
    dead = tmp_path / f".tmp-checkpoint-00000004-{_dead_pid()}-abcdef12"
    live = tmp_path / f".tmp-checkpoint-00000005-{os.getppid()}-abcdef12"
    old = tmp_path / ".old-checkpoint-00000003-12345678"
    for d in (dead, live, old):
        d.mkdir()
    removed = clean_stale(tmp_path)
    assert sorted(removed) == sorted([dead, old])
    assert live.is_dir() and not dead.exists() and not old.exists()


def test_shm_segments_and_temp_dirs_of_dead_processes_are_removed(tmp_path: Path) -> None:
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    pid = _dead_pid()
    dead_seg = shm / f"deltaserve-{pid}-0123456789ab.bin"
    live_seg = shm / f"deltaserve-{os.getpid()}-0123456789ab.bin"
    other = shm / "someone-else.bin"
    dead_dir = tmp / f"deltaserve-vllm-{pid}-x1y2"
    live_dir = tmp / f"deltaserve-vllm-{os.getpid()}-x1y2"
    for f in (dead_seg, live_seg, other):
        f.write_bytes(b"0")
    for d in (dead_dir, live_dir):
        d.mkdir()
        (d / "f").write_text("x")
    removed = clean_stale_files(shm, tmp)
    assert sorted(removed) == sorted([dead_seg, dead_dir])
    assert live_seg.exists() and other.exists() and live_dir.is_dir()
    made = make_temp_dir("vllm")
    try:
        assert made.name.startswith(f"deltaserve-vllm-{os.getpid()}-")
    finally:
        made.rmdir()


# ---------------------------------------------------------------------------------------------- CoServer


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    topics = ["the sea", "a mountain", "bread", "rain", "the moon", "a river", "music", "trees"]
    records = [{"instruction": f"Write one sentence about {t}.", "input": "",
                "output": f"Here is a short sentence about {t}, written plainly."} for t in topics * 4]
    path = tmp_path_factory.mktemp("data") / "train.json"
    path.write_text(json.dumps(records))
    return path




def _job(dataset: Path, ckpt: Path, **over):  # noqa: ANN003, ANN202
    from deltaserve_core.job_config import CheckpointSpec, JobConfig, PublishSpec, SLOSpec

    base = dict(dataset=str(dataset), adapter_name="trust", max_length=64, buffer_tokens=512,
                backward_batch_tokens=48, epochs=3, slo=SLOSpec(ttft_s=5.0, tpot_s=5.0),
                checkpoint=CheckpointSpec(dir=str(ckpt), every_steps=1, keep=2),
                publish=PublishSpec(policy="on_checkpoint"), seed=3)
    base.update(over)
    return JobConfig(**base)


def _model():  # noqa: ANN202
    from deltaserve_core.latency_model import DecodeCoefficients, LatencyModel, PrefillCoefficients
    from deltaserve_core.types import ExecutionMode

    m = LatencyModel()
    m.set_coefficients(ExecutionMode.EAGER, prefill=PrefillCoefficients(1e-9, 1e-6, 1e-6, 1e-9, 1e-3),
                       decode=DecodeCoefficients(1e-5, 1e-9, 1e-3))
    return m


def _idle_until(host, co, done, timeout: float = 180.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out: {co.stats.as_dict()}"
        if not host.run_idle_step():
            co.poll()
            time.sleep(0.005)


def _assert_paused_trains_nothing(host, co) -> None:  # noqa: ANN001
    steps = co.stats.optimizer_steps
    for _ in range(100):  # paused: idle steps admit nothing, so nothing more is trained
        host.run_idle_step()
        co.poll()
        time.sleep(0.01)
    assert co.stats.optimizer_steps <= steps + 1  # at most the batch that was already in flight


def test_coserver_refuses_an_unwritable_checkpoint_dir_before_training(host, dataset: Path,  # noqa: ANN001
                                                                        tmp_path: Path) -> None:
    from deltaserve_core.coserve import CoServer

    (tmp_path / "ckpt").write_text("a file where the folder should be")
    co = CoServer(host, _job(dataset, tmp_path / "ckpt"), latency_model=_model(), backward_threads=1)
    with pytest.raises(ValueError, match=r"checkpoint\.dir"):
        co.start()
    assert co.backward is None  # refused before the backward process started


@pytest.mark.faults
def test_failed_saves_are_counted_and_pause_training(host, dataset: Path, tmp_path: Path) -> None:  # noqa: ANN001
    from deltaserve_core.coserve import MAX_CONSECUTIVE_SAVE_FAILURES, CoServer

    ckpt = tmp_path / "ckpt"
    from deltaserve_core.job_config import PublishSpec

    co = CoServer(host, _job(dataset, ckpt, publish=PublishSpec(policy="never")), latency_model=_model(),
                  backward_threads=1)
    with co:
        # the folder becomes unusable once the job runs (a file in its place)
        ckpt.rename(tmp_path / "moved")
        ckpt.write_text("not a folder any more")
        _idle_until(host, co, lambda: co.stats.paused_reason is not None)
        stats = co.stats.as_dict()
        assert stats["save_failures"] >= MAX_CONSECUTIVE_SAVE_FAILURES
        assert stats["consecutive_save_failures"] >= MAX_CONSECUTIVE_SAVE_FAILURES
        assert "paused" in stats["paused_reason"] and str(ckpt) in stats["paused_reason"]
        _assert_paused_trains_nothing(host, co)
        assert co.finished  # hosts stop offering idle steps to a paused job
        t0 = time.monotonic()
        assert co.final_checkpoint(timeout_s=60) is None  # a failed final save is reported, not waited out
        assert time.monotonic() - t0 < 20
        assert co.stats.save_failures >= stats["save_failures"] + 1


def test_published_versions_are_pruned_and_served_again_after_a_restart(host, dataset: Path,  # noqa: ANN001
                                                                        tmp_path: Path) -> None:
    from deltaserve_core.coserve import RETIRED_MARK, CoServer, delete_retired
    from deltaserve_core.hostkit import publish_dir as published_dir

    job = _job(dataset, tmp_path / "ckpt")
    co = CoServer(host, job, latency_model=_model(), backward_threads=1)
    with co:
        _idle_until(host, co, lambda: co.stats.optimizer_steps >= 3 and len(co.stats.checkpoints) >= 3
                    and not co._host_work)
        co.final_checkpoint(timeout_s=60)
        published = list(co.stats.published)
    assert len(published) == job.checkpoint.keep, published
    root = published_dir(job)
    live = sorted(p.name for p in root.iterdir() if not (p / RETIRED_MARK).exists())
    retired = sorted(p.name for p in root.iterdir() if (p / RETIRED_MARK).exists())
    assert live == sorted(published) and "trust@v1" in retired, (live, retired)
    assert not any(n in host._adapters for n in retired), "pruned versions are still served"
    # retired folders stay a grace period for requests already running on them, then go
    assert delete_retired(root, grace_s=3600) == []
    assert sorted(p.name for p in delete_retired(root, grace_s=0)) == retired
    assert sorted(p.name for p in root.iterdir()) == live
    for name in published:
        host._adapters.pop(name, None)  # what a fresh process would start with

    # What start() does after resuming (the whole restart runs in tests/test_serve.py's reference flow; a second
    # backward process here would double this test's time): the older kept version is served again.
    final_step = int(published[-1].split("@v")[1])
    again = CoServer(host, job, latency_model=_model(), backward_threads=1)
    again._republish_from_disk(final_step)
    assert again.stats.published == published[:-1], again.stats.published
    assert published[0] in host._adapters


# ---------------------------------------------------------------------------------------------- vLLM guard


@pytest.mark.skipif(not HAVE_VLLM and not os.environ.get("DELTASERVE_REQUIRE_ENGINES"),
                    reason="vLLM is not installed (pip install 'deltaserve[vllm]')")
class TestVllmGuard:
    """The API server's adapter table with the guard installed, on a stand-in engine client."""

    @pytest.fixture()
    def setup(self, tmp_path: Path, tiny_adapter: Path):  # noqa: ANN201
        import shutil

        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels

        from deltaserve_vllm import guard

        ckpt = tmp_path / "ckpt"
        publish = ckpt / "published"
        publish.mkdir(parents=True)
        shutil.copytree(tiny_adapter, publish / "served@v4")
        shutil.copytree(tiny_adapter, ckpt / "checkpoint-00000004")
        client = tmp_path / "client-adapter"
        shutil.copytree(tiny_adapter, client)
        (tmp_path / "link").symlink_to(ckpt)

        calls: list[tuple[str, object]] = []

        class Engine:
            model_config = SimpleNamespace(model="base")
            renderer = input_processor = None

            async def add_lora(self, req):  # noqa: ANN001, ANN202
                calls.append(("add", req.lora_name))
                if not Path(req.lora_path).is_dir():
                    raise RuntimeError(f"Loading lora {req.lora_name} failed: No adapter found for {req.lora_path}")
                return True

            async def remove_lora(self, lora_id):  # noqa: ANN001, ANN202
                calls.append(("remove", lora_id))
                return True

        previous = dict(guard._STATE)
        guard._STATE.clear()
        guard.install(guard.AdapterNamespace("served", ckpt, publish))
        models = OpenAIServingModels(Engine(), [BaseModelPath(name="base", model_path="base")])
        yield SimpleNamespace(models=models, ckpt=ckpt, publish=publish, client=client, tmp=tmp_path, calls=calls)
        guard._STATE.clear()
        guard._STATE.update(previous)

    @staticmethod
    def _load(models, name: str, path: str, inplace: bool = False):  # noqa: ANN001, ANN205
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        return asyncio.run(models.load_lora_adapter(LoadLoRAAdapterRequest(lora_name=name, lora_path=path,
                                                                           load_inplace=inplace)))

    @staticmethod
    def _unload(models, name: str):  # noqa: ANN001, ANN205
        from vllm.entrypoints.serve.lora.protocol import UnloadLoRAAdapterRequest

        return asyncio.run(models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=name)))

    @staticmethod
    def _check(models, name: str):  # noqa: ANN001, ANN205
        from vllm.entrypoints.serve.engine.serving import BaseServing

        serving = BaseServing(models, models.model_config)
        return asyncio.run(serving._check_model(SimpleNamespace(model=name)))

    def test_published_version_is_served_without_runtime_loading(self, setup, monkeypatch) -> None:  # noqa: ANN001
        monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
        assert self._check(setup.models, "served@v4") is None
        assert setup.models.lora_requests["served@v4"].lora_path == str(setup.publish / "served@v4")
        for name in ("served@v5", "SERVED@v4", "__deltaserve_finetune__", "served", "served@v4/../x"):
            err = self._check(setup.models, name)
            assert err is not None and err.error.code == 404, name
        assert os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") is None  # nothing turned it on

    @pytest.mark.parametrize("how", ["retired", "deleted"])
    def test_pruned_version_is_no_longer_served(self, setup, how: str) -> None:  # noqa: ANN001
        import shutil

        assert self._check(setup.models, "served@v4") is None
        if how == "retired":
            (setup.publish / "served@v4" / ".retired").touch()
        else:
            shutil.rmtree(setup.publish / "served@v4")
        err = self._check(setup.models, "served@v4")
        assert err is not None and err.error.code == 404
        assert "served@v4" not in setup.models.lora_requests
        # left to the engine's LRU: a request still running on it must not have to reload it
        assert not any(c[0] == "remove" for c in setup.calls)

    def test_client_loads_cannot_touch_deltaserve_names_folders_or_versions(self, setup) -> None:  # noqa: ANN001
        models, ckpt = setup.models, setup.ckpt
        assert self._check(models, "served@v4") is None  # a published version a client is using
        client = str(setup.client)
        attacks = [
            ("__deltaserve_finetune__", client, False),  # the reserved fine-tuning adapter
            (" __DeltaServe_Finetune__ ", client, False),
            ("served@v4", client, True),  # load_inplace over a published version
            ("served@v5", client, False),  # pre-registering the next version
            ("Served@V5", client, False),
            ("ｓｅｒｖｅｄ@v5", client, False),  # fullwidth
            ("served", client, False),
            ("mine", str(ckpt / "checkpoint-00000004"), False),  # training weights by path
            ("mine", str(ckpt / "published" / "served@v4"), False),
            ("mine", str(setup.tmp / "link" / "checkpoint-00000004"), False),  # through a symlink
            ("mine", str(setup.client / ".." / "ckpt" / ".serve-vllm" / "v3"), False),
            ("mine", str(ckpt / "nonexistent"), False),
        ]
        answers = []
        for name, path, inplace in attacks:
            res = self._load(models, name, path, inplace)
            assert not isinstance(res, str), (name, path, res)
            answers.append((res.error.code, res.error.type))
        # probes of server paths outside DeltaServe's folders answer the same as a refusal
        for path in ("/nonexistent/adapter", "/etc/hostname"):
            res = self._load(models, "probe", path)
            assert not isinstance(res, str), path
            answers.append((res.error.code, res.error.type))
            assert "hostname" not in res.error.message and "directory" not in res.error.message.lower()
        assert set(answers) == {(400, "BadRequestError")}, answers
        assert models.lora_requests["served@v4"].lora_path == str(setup.publish / "served@v4")
        assert "__deltaserve_finetune__" not in models.lora_requests and "served@v5" not in models.lora_requests
        assert not any(c == ("add", "mine") for c in setup.calls)

        # unloading a published version is refused like an unknown name
        for name in ("served@v4", "SERVED@v4 "):
            res = self._unload(models, name)
            assert not isinstance(res, str) and res.error.code == 404, name
        assert "served@v4" in models.lora_requests

        # the operator's own runtime loading still works for other adapters
        assert isinstance(self._load(models, "mine", client), str)
        assert isinstance(self._unload(models, "mine"), str)


# ---------------------------------------------------------------------------------------------- full disk


def _mount_tmpfs(target: Path, size: str) -> bool:
    """A real small filesystem at ``target`` (root only: tmpfs); False where this process may not mount."""
    target.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
                          capture_output=True, text=True, check=False)
    return done.returncode == 0


def _fill(folder: Path) -> Path:
    """Write a ballast file until the filesystem refuses more (ENOSPC from the kernel)."""
    import errno

    ballast = folder / "ballast"
    with open(ballast, "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                if len(chunk) == 1:
                    return ballast
                chunk = chunk[: len(chunk) // 2]


def _complete_checkpoints(ckpt: Path) -> list[Path]:
    from deltaserve_core.checkpoint import list_checkpoints

    return list_checkpoints(ckpt)


def _assert_nothing_half_written(ckpt: Path) -> None:
    from deltaserve_core.adapter_state import LoraAdapterState
    from deltaserve_core.checkpoint import load_checkpoint

    leftovers = [p for p in ckpt.rglob("*")
                 if p.name.startswith((".tmp-", ".old-")) or p.name.endswith((".tmp", ".old"))]
    if leftovers:  # a save or prune of the running job may be mid-way: what it leaves behind would stay
        time.sleep(3.0)
    assert [p.name for p in leftovers if p.exists()] == []
    for child in ckpt.glob("checkpoint-*"):
        try:
            load_checkpoint(child)  # every checkpoint folder is complete and loads
        except FileNotFoundError:
            if child.exists():  # pruned meanwhile (in one rename): gone whole, not half-written
                raise
    root = ckpt / "published"
    for folder in root.iterdir() if root.is_dir() else ():
        LoraAdapterState.load_pretrained(folder)  # every published folder is complete and loads


@pytest.mark.faults
def test_full_checkpoint_disk_pauses_keeps_the_last_good_checkpoint_and_recovers(host, dataset: Path,  # noqa: ANN001
                                                                                 tmp_path: Path) -> None:
    """A real full filesystem (tmpfs of 8 MiB): saves fail mid-file with ENOSPC from the kernel."""
    import torch

    from deltaserve_core.checkpoint import load_checkpoint
    from deltaserve_core.coserve import MAX_CONSECUTIVE_SAVE_FAILURES, CoServer

    fs = tmp_path / "fs"
    if not _mount_tmpfs(fs, "8m"):
        pytest.skip("cannot mount a tmpfs here (needs root); the RLIMIT_FSIZE test below covers the writer")
    try:
        ckpt = fs / "ckpt"
        co = CoServer(host, _job(dataset, ckpt, epochs=50), latency_model=_model(), backward_threads=1,
                      save_retry_s=0.5)
        with co:
            _idle_until(host, co, lambda: len(_complete_checkpoints(ckpt)) >= 2)
            last_good = _complete_checkpoints(ckpt)[-1]
            good = load_checkpoint(last_good)
            ballast = _fill(fs)
            _idle_until(host, co, lambda: co.stats.paused_reason is not None)
            status = co.stats.as_dict()  # what /deltaserve/status shows under `finetune`
            assert status["save_failures"] >= MAX_CONSECUTIVE_SAVE_FAILURES, status
            assert status["consecutive_save_failures"] >= MAX_CONSECUTIVE_SAVE_FAILURES
            assert "paused" in status["paused_reason"] and str(ckpt) in status["paused_reason"]
            _assert_paused_trains_nothing(host, co)
            assert co.stats.save_failures > status["save_failures"]  # retries, each failing and counted
            _assert_nothing_half_written(ckpt)
            again = load_checkpoint(last_good)  # the last good checkpoint is intact
            assert again.step == good.step
            assert all(torch.equal(again.adapter.tensors[k], v) for k, v in good.adapter.tensors.items())

            ballast.unlink()  # space returns: the next retry succeeds and fine-tuning resumes
            _idle_until(host, co, lambda: co.stats.paused_reason is None
                        and _complete_checkpoints(ckpt)[-1].name > last_good.name)
            resumed_at = co.stats.optimizer_steps
            _idle_until(host, co, lambda: co.stats.optimizer_steps > resumed_at)
            assert co.stats.consecutive_save_failures == 0
            _assert_nothing_half_written(ckpt)
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


_RLIMIT_CHILD = r"""
import json, os, resource, signal, sys
from pathlib import Path
import torch
from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from deltaserve_core.lora_spec import LoraConfigSpec

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
root = Path(sys.argv[1])
spec = LoraConfigSpec(r=8, lora_alpha=16.0, target_modules=("q_proj",))
def state(v):
    g = torch.Generator().manual_seed(v)
    return LoraAdapterState("full", v, spec, {f"base_model.model.layers.{i}.q_proj.lora_A.weight":
                                             torch.randn(8, 256, generator=g) for i in range(8)})
out = {}
save_checkpoint(root, state(1), None, 1)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, hard))  # the adapter file is ~64 KiB: fails mid-file
try:
    save_checkpoint(root, state(2), None, 2)
    out["failed"] = None
except OSError as exc:
    out["failed"] = exc.errno
try:
    state(3).save_pretrained(root / "published" / "full@v3")
    out["publish_failed"] = None
except OSError as exc:
    out["publish_failed"] = exc.errno
out["after_failure"] = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
save_checkpoint(root, state(2), None, 2)
out["final"] = [p.name for p in list_checkpoints(root)]
kept = load_checkpoint(root / "checkpoint-00000001").adapter.tensors
out["kept"] = all(torch.equal(kept[k], v) for k, v in state(1).tensors.items())
print("RESULT " + json.dumps(out))
"""


def test_checkpoint_write_failing_mid_file_leaves_no_half_written_folder(tmp_path: Path) -> None:
    """Where no small filesystem can be mounted: the kernel fails writes past RLIMIT_FSIZE mid-file (EFBIG),
    in a child process so that nothing else of this process is limited."""
    import errno

    done = subprocess.run([sys.executable, "-c", _RLIMIT_CHILD, str(tmp_path / "ckpt")], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"), check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["failed"] == errno.EFBIG and out["publish_failed"] == errno.EFBIG, out
    # only the good checkpoint's files: no temporary folder, no half-written adapter folder
    assert out["after_failure"] == ["checkpoint-00000001", "checkpoint-00000001/adapter_config.json",
                                    "checkpoint-00000001/adapter_model.safetensors",
                                    "checkpoint-00000001/trainer_state.json", "published"], out
    assert out["kept"] is True
    assert out["final"] == ["checkpoint-00000001", "checkpoint-00000002"]  # saving works once the limit goes


# ---------------------------------------------------------------------------------------------- API key


def test_where_the_api_key_comes_from() -> None:
    """`deltaserve serve` hands the key to the engine's server (tests/test_serve.py runs one with it)."""
    from deltaserve_core.serve import API_KEY_ENV, resolve_api_key

    assert resolve_api_key("from-flag", {API_KEY_ENV: "from-env"}) == "from-flag"  # the option wins
    assert resolve_api_key(None, {API_KEY_ENV: "from-env"}) == "from-env"
    assert resolve_api_key(None, {API_KEY_ENV: "  "}) is None and resolve_api_key(None, {}) is None
    with pytest.raises(ValueError, match="--api-key"):
        resolve_api_key(" ", {})
