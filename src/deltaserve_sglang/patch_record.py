"""Every place ``deltaserve_sglang`` changes SGLang at run time, with its record (why, how, upstream, when it can go).

Most go through SGLang's own ``HookRegistry`` (AROUND hooks, registered by :func:`deltaserve_sglang.plugin.register`)
on internal methods: the registry is public, the methods are not, so each is recorded as a patch. Importing this
module imports no SGLang: ``deltaserve hosts --patches`` prints it anywhere.
"""

from __future__ import annotations

from deltaserve_core.hostkit import PatchRecord, check_patch_records

__all__ = ["PATCHES"]

_HOOK = "HookRegistry AROUND hook"
_STEP = "not proposed yet: a scheduler step hook that may add rows to a formed batch and see its result"
_SCHED = "sglang.srt.managers.scheduler.Scheduler"

PATCHES: tuple[PatchRecord, ...] = (
    PatchRecord(target=f"{_SCHED}.get_next_batch_to_run", how=_HOOK,
                why="offer each formed step to the core once and add fine-tuning rows to that very step",
                upstream=_STEP, remove_when="SGLang offers that step hook",
                breaks_if="ScheduleBatch's per-row fields (reqs, extend_lens, prefix_lens, decoding_reqs) change"),
    PatchRecord(target=f"{_SCHED}.run_event_loop", how=_HOOK,
                why="operator path: start co-serving in SGLang's scheduler process before its loop, stop it after",
                upstream="not proposed yet: a scheduler start/stop callback for plugins",
                remove_when="SGLang offers that callback", breaks_if="the loop is started another way"),
    PatchRecord(target=f"{_SCHED}.run_batch", how=_HOOK,
                why="begin_step/end_step and device-complete step timing", upstream=_STEP,
                remove_when="SGLang offers that step hook", breaks_if="the forward no longer runs inside run_batch"),
    PatchRecord(target=f"{_SCHED}.process_batch_result", how=_HOOK,
                why="one StepRecord per executed step, after SGLang processed its outputs", upstream=_STEP,
                remove_when="SGLang offers that step hook", breaks_if="results are processed elsewhere"),
    PatchRecord(target="sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"
                       ".stream_output", how=_HOOK,
                why="no fine-tuning (or calibration) row reaches a client: rows with DeltaServe's rid prefixes are "
                    "removed before streaming",
                upstream="not proposed yet: an output filter for internal requests",
                remove_when="SGLang can run internal requests that never stream",
                breaks_if="a second streaming path"),
    PatchRecord(target="sglang.srt.server_args.prepare_server_args", how=_HOOK + " (launcher process)",
                why="refuse a bad job before anything loads (sglang.launch_server)",
                upstream="not needed: a plugin validation hook would do the same",
                remove_when="SGLang validates plugin settings itself", breaks_if="the launcher stops calling it",
                applies="launcher"),
    PatchRecord(target="sglang.srt.server_args.ServerArgs.check_server_args", how=_HOOK + " (launcher process)",
                why="the same refusal for sgl.Engine, which builds ServerArgs itself",
                upstream="not needed: as above", remove_when="as above", breaks_if="sgl.Engine stops calling it",
                applies="launcher"),
    PatchRecord(target="sglang.srt.utils.common.kill_process_tree", how=_HOOK + " (launcher process)",
                why="a stop that SGLang ends with SIGKILL first SIGTERMs the scheduler processes and waits for the "
                    "final checkpoint (at most DELTASERVE_SHUTDOWN_GRACE_S)",
                upstream="not proposed yet: a graceful shutdown phase for plugins",
                remove_when="SGLang gives its schedulers a graceful stop before killing them",
                breaks_if="schedulers are no longer found by their process title", applies="launcher"),
    PatchRecord(target="sglang.srt.entrypoints.http_server.app", how="routes added to app.router one by one (launcher process)",
                why="the jobs API (/v1/fine_tuning/jobs, deltaserve_sglang.jobs_api): mounted by the "
                    "prepare_server_args hook once the job is accepted, before SGLang adds its API-key middleware",
                upstream="not proposed yet: an HTTP route extension point for plugins (vLLM has endpoint_plugins)",
                remove_when="SGLang lets plugins add routes", breaks_if="the app is built per launch instead of at "
                "import, or the API-key middleware stops matching routes through app.router.routes",
                applies="launcher"),
    PatchRecord(target="sglang.srt.managers.io_struct._msgpack_decoder",
                how="io_struct.hook_custom_types(DeltaServeJobReq, DeltaServeJobReqOutput) in the launcher and "
                    "scheduler processes",
                why="the jobs API's call and answer cross SGLang's msgpack IPC as two message types of our own",
                upstream="not proposed yet: hook_custom_types is SGLang's (used by its unit tests), not a documented "
                         "plugin API; a generic RPC with a return value would do (RpcReqInput returns only "
                         "success/message)",
                remove_when="SGLang offers a plugin control request with a JSON payload and answer",
                breaks_if="hook_custom_types goes or the IPC stops decoding against a tagged union",
                applies="server"),
    PatchRecord(target=f"{_SCHED}._request_dispatcher", how="TypeBasedDispatcher entry added (+=) on the instance",
                why="the scheduler answers DeltaServeJobReq in process_input_requests, between two loop iterations",
                upstream="not proposed yet: as above", remove_when="as above",
                breaks_if="control requests are dispatched another way"),
    PatchRecord(target="sglang.srt.managers.tokenizer_manager.TokenizerManager._result_dispatcher",
                how="TypeBasedDispatcher entry added (+=) on the instance (launcher process)",
                why="the API server receives DeltaServeJobReqOutput; answers are matched to calls by rid",
                upstream="not proposed yet: as above", remove_when="as above",
                breaks_if="scheduler outputs are dispatched another way", applies="launcher"),
    PatchRecord(target="sglang.srt.model_executor.model_runner.ModelRunner.{decode,prefill}_cuda_graph_runner"
                       ".can_run_graph",
                how="instance attribute over the graph runner's own method (plugin.install_graph_guard; CUDA only)",
                why="a step carrying fine-tuning rows runs SGLang's eager path, where the layer-capture and abort hooks "
                    "fire (they do not inside a replayed CUDA graph); every other step gets SGLang's own answer",
                upstream="not proposed yet: a per-batch 'run eagerly' flag on ForwardBatch/ScheduleBatch",
                remove_when="SGLang lets a batch ask for the eager path",
                breaks_if="ModelRunner._forward_raw stops asking the runner instances, or the attributes are renamed "
                          "(0.5.15 and 0.5.23 both have them)", applies="cuda"),
    PatchRecord(target="sglang.srt.managers.schedule_batch.Req.skip_radix_cache_insert",
                how="attribute set to True on each fine-tuning row's Req right after handle_generate_request",
                why="a finished fine-tuning row's KV is freed instead of inserted into the radix cache (its unique "
                    "extra_key already keeps it from being served or skipped): the cache never stores those rows",
                upstream="SGLang's own flag (set for fake-bootstrap and embedding-override requests); not settable from a "
                         "request today", remove_when="a request-level 'do not cache' option exists",
                breaks_if="release_kv_cache stops reading the flag (it reads it in 0.5.15 and 0.5.23)"),
    PatchRecord(target="model.model.layers[i] (decoder layers of the loaded model)",
                how="torch forward pre-hook per layer (plugin.install_layer_capture)",
                why="capture each layer's residual-stream input for fine-tuning rows (0.5.23: through the layer's "
                    "capture_output callback; 0.5.15: hidden_states + residual before the fused add-RMSNorm) and poll "
                    "should_abort at every layer boundary of a fine-tuning-only step",
                upstream="not proposed yet: a per-layer callback for plugins",
                remove_when="SGLang offers per-layer input callbacks and an early stop",
                breaks_if="the layers' forward arguments change (versions.SHAPES checks them at start-up)"),
    PatchRecord(target="model.forward (the loaded model instance)",
                how="instance attribute wrapping the original (plugin.install_layer_capture)",
                why="abort: a fine-tuning-only step stopped at a layer boundary returns zero logits, so SGLang finishes "
                    "its rows as after any step",
                upstream="not proposed yet: a way to end a forward early",
                remove_when="SGLang can end a forward early",
                breaks_if="SGLang calls the model through another attribute"),
    PatchRecord(target="sglang.srt.managers.tokenizer_manager._SCHEDULER_EXIT_TIMEOUT_SECS",
                how="module constant raised in the launching process",
                why="the API server waits long enough for the final checkpoint after its ShutdownReq",
                upstream="not proposed yet: a configurable exit timeout",
                remove_when="the timeout is a server argument", breaks_if="the constant is renamed",
                applies="launcher"),
)

check_patch_records(PATCHES)
