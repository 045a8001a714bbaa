"""The ``sglang.srt.plugins`` entry point: registers DeltaServe's hooks in every SGLang process that loads plugins.

SGLang calls :func:`register` from ``sglang.srt.plugins.load_plugins()`` (engine, scheduler and detokenizer
processes) and then ``HookRegistry.apply_hooks()``. Registering is cheap and idempotent and imports only SGLang's
hook registry. Every hook passes straight through unless the scheduler carries a DeltaServe
:class:`~deltaserve_sglang.binding.Binding`, so installing this package changes nothing for SGLang deployments
that do not enable DeltaServe.

SGLang *logs and carries on* when a hook fails to apply (``HookRegistry.apply_hooks`` catches the exception), so
the adapter never trusts registration: :func:`verify_hooks` checks that every target is wrapped by our hook and
the host refuses to start otherwise.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["HOOKS", "STREAMERS", "HooksNotLiveError", "install_graph_guard", "install_layer_capture", "register",
           "verify_hooks"]

#: id(SchedulerOutputStreamer) -> Binding of its scheduler, for the streamers DeltaServe is attached to.
STREAMERS: dict[int, Any] = {}

_SCHED = "sglang.srt.managers.scheduler.Scheduler"
_SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
_STREAMER = "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"


def _binding(scheduler: Any):
    return getattr(scheduler, "_deltaserve", None)


def _get_next_batch_to_run(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    b = _binding(self)
    if b is None:
        return original(self, *args, **kwargs)
    return b.around_get_next_batch(original, self, *args, **kwargs)


def _run_batch(original: Callable[..., Any], self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    b = _binding(self)
    if b is None:
        return original(self, batch, *args, **kwargs)
    return b.around_run_batch(original, self, batch, *args, **kwargs)


def _process_batch_result(original: Callable[..., Any], self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    b = _binding(self)
    if b is None:
        return original(self, batch, *args, **kwargs)
    return b.around_process_batch_result(original, self, batch, *args, **kwargs)


def _stream_output(original: Callable[..., Any], self: Any, reqs: Any, *args: Any, **kwargs: Any) -> Any:
    # The streamer has no back-reference to its scheduler (and takes no new attributes): the host registers it.
    b = STREAMERS.get(id(self))
    if b is None:
        return original(self, reqs, *args, **kwargs)
    return original(self, b.filter_stream(reqs), *args, **kwargs)


def _run_event_loop(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    # The operator path (deltaserve_sglang.serving): attach in SGLang's scheduler process before its loop starts,
    # when the environment names a job. Schedulers DeltaServe already drives (the driver path) never get here.
    from .serving import start_serving

    runtime = start_serving(self) if _binding(self) is None else None
    try:
        return original(self, *args, **kwargs)
    finally:
        if runtime is not None:
            runtime.stop()


def _preflight(server_args: Any) -> bool:
    from .serving import enabled, extend_scheduler_exit_timeout, preflight

    preflight(server_args)
    if not enabled():
        return False
    extend_scheduler_exit_timeout()
    return True


def _prepare_server_args(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # `sglang.launch_server` parses its command line here, right after its imports and before it imports the
    # HTTP server and spawns the scheduler that loads the model: the earliest point a bad job can be refused.
    # Only this launcher serves HTTP (sgl.Engine has no server), so the jobs routes are mounted here, once the job
    # (or jobs settings without a job) is accepted and before SGLang's launcher adds its API-key middleware and
    # starts uvicorn.
    server_args = original(*args, **kwargs)
    if _preflight(server_args):
        from .jobs_api import attach_http_routes

        attach_http_routes(server_args)
    return server_args


def _check_server_args(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    # Every launching process (sgl.Engine too) checks its arguments here, still before it spawns the scheduler.
    result = original(self, *args, **kwargs)
    _preflight(self)
    return result


def _kill_process_tree(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # SIGKILL to every child: in the launching process, the schedulers get the chance to write their final
    # checkpoint first (a SIGINT to the API server goes straight from uvicorn's stop to this kill)
    from .serving import stop_schedulers_first

    try:
        stop_schedulers_first(args[0] if args else kwargs.get("parent_pid"))
    except KeyboardInterrupt:  # a second Ctrl-C while waiting: kill now, as SGLang would
        pass
    return original(*args, **kwargs)


#: target -> hook (all AROUND). Also the patch record's list (docs/sglang-adapter.md).
HOOKS: dict[str, Callable[..., Any]] = {
    f"{_SCHED}.get_next_batch_to_run": _get_next_batch_to_run,
    f"{_SCHED}.run_batch": _run_batch,
    f"{_SCHED}.process_batch_result": _process_batch_result,
    f"{_SCHED}.run_event_loop": _run_event_loop,
    f"{_STREAMER}.stream_output": _stream_output,
    f"{_SERVER_ARGS}.check_server_args": _check_server_args,
    "sglang.srt.server_args.prepare_server_args": _prepare_server_args,
    "sglang.srt.utils.common.kill_process_tree": _kill_process_tree,
}

#: the hooks a launching process (``sglang.launch_server``'s main process, a program holding ``sgl.Engine``)
#: needs: preflight and the stop. Applying the others imports SGLang's scheduler (2,300 modules, 20+ s on a busy
#: machine), which would come before a bad job could be refused.
LAUNCHER_HOOKS = frozenset({f"{_SERVER_ARGS}.check_server_args", "sglang.srt.server_args.prepare_server_args",
                            "sglang.srt.utils.common.kill_process_tree"})

_registered: set[str] = set()


def register(*, scheduler: bool | None = None) -> None:
    """Entry point of ``sglang.srt.plugins``: register the hooks once per process (idempotent).

    ``scheduler``: also the scheduler's hooks. ``None`` (SGLang's call): in SGLang's subprocesses (the scheduler
    runs in one), not in a launching process. The driver path, which builds a scheduler in its own process,
    passes ``True``."""
    import multiprocessing

    if scheduler is None:
        scheduler = multiprocessing.parent_process() is not None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook in HOOKS.items():
        if target in _registered or not (scheduler or target in LAUNCHER_HOOKS):
            continue
        HookRegistry.register(target, hook, HookType.AROUND)
        _registered.add(target)


class HooksNotLiveError(RuntimeError):
    """A DeltaServe hook is not applied to its SGLang target (SGLang logged the failure and went on)."""


def _is_wrapped_by(fn: Any, hook: Callable[..., Any]) -> bool:
    # HookRegistry's AROUND wrapper calls ``hook(original, ...)`` from a closure and sets __wrapped__.
    seen = 0
    while fn is not None and seen < 16:
        closure = getattr(fn, "__closure__", None) or ()
        if any(getattr(c, "cell_contents", None) is hook for c in closure):
            return True
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def verify_hooks() -> None:
    """Raise :class:`HooksNotLiveError` unless every hook in :data:`HOOKS` wraps its target in this process
    (called where a scheduler runs, which needs them all)."""
    missing = []
    for target, hook in HOOKS.items():
        owner_path, attr = target.rsplit(".", 1)
        module_path, cls_name = owner_path.rsplit(".", 1)
        try:
            owner = getattr(importlib.import_module(module_path), cls_name)
            fn = owner.__dict__.get(attr)
        except Exception as exc:  # noqa: BLE001  (the target moved: same outcome as a failed apply)
            missing.append(f"{target} ({type(exc).__name__}: {exc})")
            continue
        if fn is None or not _is_wrapped_by(fn, hook):
            missing.append(target)
    if missing:
        raise HooksNotLiveError(
            "DeltaServe's SGLang hooks are not applied to: " + ", ".join(missing) + ". SGLang logs a failed hook and "
            "carries on, so DeltaServe refuses to run. Check that the `deltaserve` plugin is installed (entry point "
            "group sglang.srt.plugins), that SGLANG_PLUGINS (if set) includes `deltaserve`, and that the installed "
            "SGLang is a supported version (deltaserve_sglang.versions)")


def install_layer_capture(model: Any, binding: Any) -> int:
    """Capture every decoder layer's input, poll ``should_abort`` at every layer boundary of a fine-tuning-only
    step, and make the model's forward stoppable there; returns the number of layers.

    SGLang 0.5.23's Llama-family decoder layers take ``capture_output`` (the EAGLE3 auxiliary-hidden-state path)
    and call it with the layer's residual-stream input once the pending residual add is done; the
    ``hidden_states`` argument itself may be an un-added partial ("owed output"), so reading it in a pre-hook
    would be wrong. SGLang 0.5.15's layers take ``(positions, hidden_states, forward_batch, residual)``: the
    layer's input is ``hidden_states + residual`` (``hidden_states`` alone at the first layer), computed in the
    pre-hook before the layer's fused add-RMSNorm updates both tensors in place (as on vLLM).

    Abort: the pre-hook raises :class:`StopForward` before the layer runs; the wrapped ``model.forward`` catches it
    and returns the logits the sampler expects (zeros: a fine-tuning-only step holds no client row, and its rows
    are finished by ``max_new_tokens=0`` whatever they sample), so SGLang's own result processing finishes the rows
    and frees their KV as after any step. Their partly written KV sits under each row's private radix key, which no
    request can match.
    """
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise RuntimeError(f"{type(model).__name__} has no model.layers; deltaserve_sglang supports Llama-family "
                           "decoder-only models")

    def pre_hook(layer: int, module: Any, args: tuple, kwargs: dict) -> tuple | None:
        if binding.plan is None or not binding._rows:
            return None
        if binding.should_stop():
            raise StopForward
        if kwargs.get("capture_output") is not None:
            return None
        kwargs = dict(kwargs)
        kwargs["capture_output"] = functools.partial(_capture, binding, layer)
        return args, kwargs

    def residual_pre_hook(layer: int, module: Any, args: tuple, kwargs: dict) -> None:
        if binding.plan is None or not binding._rows:
            return None
        if binding.should_stop():
            raise StopForward
        hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
        residual = args[3] if len(args) > 3 else kwargs.get("residual")
        binding.capture(layer, hidden if residual is None else hidden + residual)
        return None

    for i, layer in enumerate(layers):
        takes_callback = "capture_output" in inspect.signature(type(layer).forward).parameters
        hook = pre_hook if takes_callback else residual_pre_hook
        layer.register_forward_pre_hook(functools.partial(hook, i), with_kwargs=True)
    forward = model.forward

    @functools.wraps(forward)
    def stoppable_forward(input_ids: Any, positions: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return forward(input_ids, positions, forward_batch, *args, **kwargs)
        except StopForward:
            binding.stopped()
            return _empty_logits(model, forward_batch, input_ids)

    model.forward = stoppable_forward
    return len(layers)


#: the attributes of SGLang's ModelRunner that hold a CUDA-graph runner (decode; prefill, 0.5.15's breakable or
#: piecewise backends), each asked ``can_run_graph(forward_batch)`` before every forward
GRAPH_RUNNERS = ("decode_cuda_graph_runner", "prefill_cuda_graph_runner")


def install_graph_guard(model_runner: Any, binding: Any) -> list[str]:
    """Make SGLang's CUDA-graph runners answer no to ``can_run_graph`` for a step that carries fine-tuning rows
    (``binding.forces_eager()``), so that step runs SGLang's eager path, where the capture and abort hooks fire;
    every other step gets SGLang's own answer. Idempotent; returns the runner attributes guarded now.

    An instance attribute over the runner's own method (not a HookRegistry hook): the runner classes differ by
    backend and SGLang release, the instance is the one ``ModelRunner._forward_raw`` asks. The eager runner
    (SGLang's stand-in where graphs are off) already answers no and is left alone."""
    guarded = []
    for attr in GRAPH_RUNNERS:
        runner = getattr(model_runner, attr, None)
        can_run = getattr(runner, "can_run_graph", None)
        if runner is None or can_run is None or type(runner).__name__ == "EagerRunner":
            continue
        if getattr(can_run, "_deltaserve_guard", None) is binding:
            continue

        def guarded_can_run(forward_batch: Any, *args: Any, _original: Any = can_run, **kwargs: Any) -> bool:
            if binding.forces_eager():
                return False
            return _original(forward_batch, *args, **kwargs)

        guarded_can_run._deltaserve_guard = binding  # type: ignore[attr-defined]
        runner.can_run_graph = guarded_can_run
        guarded.append(attr)
    return guarded


class StopForward(Exception):
    """Raised at a layer boundary of a fine-tuning-only step whose sink asked to abort."""


def _empty_logits(model: Any, forward_batch: Any, input_ids: Any) -> Any:
    import torch
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    vocab = int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)
    return LogitsProcessorOutput(next_token_logits=input_ids.new_zeros((forward_batch.batch_size, vocab),
                                                                       dtype=torch.float32))


def _capture(binding: Any, layer: int, hidden: Any, *, owned: bool = False) -> None:
    binding.capture(layer, hidden)
