"""Every run-time patch ``deltaserve_vllm`` applies to vLLM, with its record (why, how, upstream status, when it can go).

The public extension points it uses (``scheduler_cls``, ``worker_extension_cls``, the plugin entry points,
``additional_config``) are not patches and are listed in ``docs/vllm-adapter.md`` ("Every vLLM internal touched")
beside these. Importing this module imports no vLLM: ``deltaserve hosts --patches`` prints it anywhere.
"""

from __future__ import annotations

from deltaserve_core.hostkit import PatchRecord, check_patch_records

__all__ = ["PATCHES"]

_STEP_HOOK = "upstream a per-step execute callback (before/after the forward, with the batch's rows)"

PATCHES: tuple[PatchRecord, ...] = (
    PatchRecord(
        target="vllm.engine.arg_utils.EngineArgs.create_engine_config",
        how="method wrapped once per process by deltaserve_vllm.plugin.register() (original kept as __wrapped__); "
            "acts only when additional_config has the 'deltaserve' key",
        why="one switch instead of five flags: sets scheduler_cls, worker_extension_cls, the executor, enable_lora, "
            "max_loras + 1 and the CUDA V1 runner unless VLLM_USE_V2_MODEL_RUNNER is set, pairs the scheduler with "
            "async_scheduling, raises "
            "shutdown_timeout to the final checkpoint's grace, and refuses bad settings before the engine starts",
        upstream="not proposed yet: a plugin hook that may adjust EngineArgs (or a plugin default for scheduler_cls)",
        remove_when="vLLM lets a general plugin adjust engine arguments before the config is built",
        breaks_if="vLLM renames the method or builds the config elsewhere", applies="engine"),
    PatchRecord(
        target="model_runner.execute_model/sample_tokens (V1 GPUModelRunner, CPUModelRunner on CPU, V2 "
               "vllm.v1.worker.gpu.model_runner.GPUModelRunner)",
        how="instance wrap on the worker's model runner by the worker extension (deltaserve_attach, through "
            "runner_view.RunnerView.install)",
        why="device-complete step timing, begin_step/end_step, the abort of a fine-tuning-only step (V2: the "
            "batch-queue loop's sample_tokens after an abort is answered with the empty output), and the mapping of "
            "rows to fine-tuning samples (V1: input_batch.req_ids)",
        upstream=_STEP_HOOK, remove_when="vLLM offers per-step execute callbacks to worker extensions",
        breaks_if="a renamed execute_model/sample_tokens, or V1's input_batch / V2's dummy_run keyword changing",
        applies="engine"),
    PatchRecord(
        target="model_runner.prepare_inputs (V2 model runner, CUDA)",
        how="instance wrap by the worker extension (runner_view.V2RunnerView.install): the InputBatch it returns is "
            "kept for the step being run",
        why="the V2 runner has no persistent input batch and sorts each step's requests itself (decodes first); "
            "its InputBatch (req_ids, query_start_loc_np, num_scheduled_tokens) is where the fine-tuning rows sit "
            "in the token batch the layers see",
        upstream=_STEP_HOOK, remove_when="vLLM offers per-step execute callbacks that carry the step's layout",
        breaks_if="V2 stops building the step's batch in prepare_inputs or renames those fields", applies="engine"),
    PatchRecord(
        target="model_runner.cudagraph_dispatcher.dispatch (V1 runner, CUDA)",
        how="instance wrap on the runner's dispatcher by the worker extension (deltaserve_attach): a step carrying "
            "fine-tuning rows is dispatched with valid_modes={CUDAGraphMode.NONE}",
        why="a CUDA graph (full or piecewise) replays without running the capture points (deltaserve_vllm."
            "layer_tap), so steps with rows to capture or abort run the compiled code without graphs; every other "
            "step is dispatched as vLLM decides",
        upstream="not proposed yet: a per-step 'run eagerly' request for worker extensions",
        remove_when="vLLM lets an extension force a step's CUDA-graph mode",
        breaks_if="the dispatcher loses valid_modes or the runner stops asking it per step", applies="engine"),
    PatchRecord(
        target="model_runner.cudagraph_manager.dispatch (V2 runner, CUDA)",
        how="instance wrap on the runner's cudagraph manager by the worker extension (runner_view.V2RunnerView): "
            "for a step carrying fine-tuning rows the descriptor it returns is replaced by its own no-graph one "
            "(cg_mode NONE, the step's unpadded token and request counts, the same LoRA case)",
        why="as for V1's dispatcher: a graph replay would skip the capture points; V2's dispatch has no valid_modes, "
            "so the no-match answer is given instead",
        upstream="not proposed yet: a per-step 'run eagerly' request for worker extensions",
        remove_when="vLLM lets an extension force a step's CUDA-graph mode",
        breaks_if="BatchExecutionDescriptor's fields or dispatch's (num_reqs, num_tokens, ...) signature change, or "
                  "the runner decides the graph elsewhere", applies="engine"),
    PatchRecord(
        target="vllm.lora.ops.torch_ops.lora_ops.bgmv_shrink/bgmv_expand/bgmv_expand_slice",
        how="module functions rebound in that module, vllm.lora.ops.torch_ops and punica_cpu by "
            "deltaserve_vllm.cpu_lora_fix.apply(); remove() restores them",
        why="vLLM-CPU bug: rows with LoRA index -1 (base-model rows) index the stacked weights with -1 and get the "
            "last slot's adapter; the fix keeps their values across the op",
        upstream="a vLLM bug, not reported upstream yet (docs/vllm-adapter.md, 'Base-model rows and the last LoRA "
                 "slot')",
        remove_when="the torch ops skip index -1: tests/test_vllm_host.py::"
                    "test_stock_vllm_cpu_gives_base_rows_the_last_lora_slot then fails",
        breaks_if="the punica CPU wrapper stops calling these module functions", applies="cpu"),
    PatchRecord(
        target="vllm.entrypoints.cli.main.importlib",
        how="module global replaced, in the process of `python -m deltaserve_vllm` only, by a stand-in whose "
            "metadata.version('vllm') answers with vllm-cpu's version",
        why="vllm-cpu's `vllm` console script fails before parsing anything (PackageNotFoundError: vllm), because "
            "its distribution is named vllm-cpu",
        upstream="a packaging bug of the community vllm-cpu build",
        remove_when="vllm-cpu's `vllm --version` exits 0: launch.vllm_cli_head then returns `vllm` everywhere",
        breaks_if="vLLM's CLI reads its version another way", applies="launcher"),
    PatchRecord(
        target="vllm.entrypoints.openai.models.serving.OpenAIServingModels.load_lora_adapter/unload_lora_adapter",
        how="class attributes wrapped by deltaserve_vllm.guard.install() in the API server process; the refusal is "
            "built with the create_error_response/ErrorResponse of OpenAIServingModels' own module (both moved "
            "between vLLM 0.26 and 0.32, that module did not)",
        why="a client's runtime LoRA load or unload touching DeltaServe's names, folders or versions is refused, "
            "and every failed load gets the same 400 so the endpoint cannot probe server paths",
        upstream="not proposed yet: an admission hook for runtime LoRA loads and uniform load errors",
        remove_when="vLLM offers that hook",
        breaks_if="the methods move or change signature, or their module stops importing those error types",
        applies="server"),
    PatchRecord(
        target="vllm.entrypoints.openai.models.serving.OpenAIServingModels.show_available_models",
        how="class attribute wrapped by guard.install() in the API server process",
        why="/v1/models lists every servable published version as soon as its folder exists, and <adapter>@latest",
        upstream="not proposed yet: a listing hook for plugins (or resolvers that can enumerate)",
        remove_when="vLLM lets resolvers list their adapters",
        breaks_if="the list is no longer built from lora_requests", applies="server"),
    PatchRecord(
        target="vllm.entrypoints.serve.engine.serving.BaseServing._check_model",
        how="method wrapped by guard.install() (and PoolingBaseServing._check_model, which overrides it)",
        why="a request naming a published version loads it through engine_client.add_lora first, without turning "
            "on VLLM_ALLOW_RUNTIME_LORA_UPDATING, which would open the load endpoint to every client",
        upstream="not proposed yet: consult registered LoRA resolvers whatever the env var",
        remove_when="resolvers are consulted without the env var: register a resolver instead",
        breaks_if="lora_requests, lora_id_counter or lora_resolver_lock change", applies="server"),
    PatchRecord(
        target="SIGTERM/SIGINT handlers of the EngineCore process",
        how="chained by the serve runtime after vLLM installed its own (vLLM's handler still runs); ignored "
            "during the final checkpoint",
        why="a stop ends fine-tuning's idle steps so vLLM's shutdown loop can exit, and a second signal cannot "
            "kill the process mid-save",
        upstream="not proposed yet: a shutdown callback for plugins/schedulers",
        remove_when="vLLM offers a shutdown callback", breaks_if="vLLM installs its handler after building the engine",
        applies="server"),
    PatchRecord(
        target="Scheduler.lora_config (the DeltaServe scheduler's own reference)",
        how="replaced in DeltaServeSchedulerMixin.__init__ by a copy with max_loras - 1; the worker keeps the real "
            "slot count",
        why="the reserved fine-tuning adapter is pinned in one slot, and vLLM caps a step at max_loras adapters: "
            "a step with max_loras client adapters failed in the worker (its LoRA mapping named an adapter no slot "
            "held; found by publish_adapter__every_version_in_one_step_serves_its_weights)",
        upstream="not proposed yet: the scheduler's cap could count pinned adapters (they hold a slot whether or "
                 "not the step uses them)",
        remove_when="vLLM's scheduler subtracts pinned adapters from max_loras",
        breaks_if="vLLM's scheduler reads the LoRA cap from somewhere else than self.lora_config", applies="engine"),
)

check_patch_records(PATCHES)
