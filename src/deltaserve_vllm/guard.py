"""What a client of ``vllm serve`` may do with DeltaServe's adapters: request published versions, nothing else.

DeltaServe publishes each adapter version as a folder (``<checkpoint dir>/published/<adapter>@v<step>``) written
by the EngineCore process. Clients must reach those versions by name without the operator turning on vLLM's
runtime LoRA loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, which also opens the unauthenticated
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` endpoints). So this module, in the API server process:

- makes every published version servable and listed in ``/v1/models`` as soon as its folder is written, by
  adding it to the API server's adapter table through the engine client (an in-process call, the same one vLLM's
  resolvers end in) -- only names of the form ``<adapter>@v<step>`` whose folder DeltaServe wrote, looked up in
  DeltaServe's own publish folder when a client lists the models or names a version;
- serves ``<adapter>@latest``, an alias of the newest published version (looked up again on every request and
  listing, so it moves with each publication), and lists it once there is a version;
- forgets versions DeltaServe retired (``checkpoint.keep``) in that table, so new requests for them are refused
  (the engine's LRU evicts their weights; removing them at once could fail a request still running on one);
- when the operator did turn runtime loading on for their own adapters, refuses every client load or unload that
  touches DeltaServe: its names (the reserved fine-tuning adapter, every job's adapter name and anything
  ``<adapter>@...``, compared after Unicode normalisation, trimming and case folding), its folders (the checkpoint
  folder and everything under it, symlinks resolved) and the versions it serves (no ``load_inplace`` over them).

A refused load and a failed load answer alike (400, one message naming only the client's adapter name), so the
endpoint cannot be used to learn which server paths exist; the real cause goes to the server log.

:func:`install` patches vLLM's ``OpenAIServingModels.load_lora_adapter`` / ``unload_lora_adapter`` /
``show_available_models`` and the servings' ``_check_model``; the record is in docs/vllm-adapter.md.
"""

from __future__ import annotations

import functools
import logging
import os
import unicodedata
from http import HTTPStatus
from pathlib import Path
from typing import Any

from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.hostkit import published_pattern
from deltaserve_core.job_config import LATEST_SUFFIX

__all__ = ["AdapterNamespace", "install", "installed_namespaces"]

log = logging.getLogger("deltaserve.vllm")

_MARK = "__deltaserve_guard__"
#: every job's namespace in this server, by adapter name: each job's versions are served by name, whichever job was
#: created last
_STATE: dict[str, AdapterNamespace] = {}


def _fold(name: str) -> str:
    # NFKC + casefold: fullwidth or differently cased spellings of a name are the same name to a reader, and
    # some adapter stores compare case-insensitively.
    return unicodedata.normalize("NFKC", name).strip().casefold()


class AdapterNamespace:
    """DeltaServe's names and folders in one server: what clients may request and may never load over."""

    def __init__(self, adapter_name: str, checkpoint_dir: str | os.PathLike[str],
                 publish_dir: str | os.PathLike[str]) -> None:
        self.adapter_name = adapter_name
        self.checkpoint_dir = Path(os.path.realpath(checkpoint_dir))
        self.publish_dir = Path(os.path.realpath(publish_dir))
        self._folded = _fold(adapter_name)
        self._published = published_pattern(adapter_name)

    def owns_name(self, name: Any) -> bool:
        """Whether ``name`` is, or could be mistaken for, one of DeltaServe's adapters."""
        if not isinstance(name, str):
            return False
        folded = _fold(name)
        return (folded in (_fold(RESERVED_ADAPTER_NAME), self._folded)
                or folded.startswith(self._folded + "@") or "__deltaserve" in folded)

    def owns_path(self, path: Any) -> bool:
        """Whether ``path`` (as a client wrote it, relative to this process) is DeltaServe's folder or under it."""
        if not isinstance(path, str) or not path:
            return False
        try:
            real = Path(os.path.realpath(os.path.expanduser(path)))
        except (OSError, ValueError):
            return True  # unresolvable (NUL byte, loop): not ours to prove safe
        return any(real == root or root in real.parents for root in (self.checkpoint_dir, self.publish_dir))

    @property
    def latest_alias(self) -> str:
        return self.adapter_name + LATEST_SUFFIX

    def published_folder(self, name: Any) -> Path | None:
        """The folder of published version ``name`` (exact spelling only), or None if DeltaServe has none."""
        if not isinstance(name, str) or not self._published.fullmatch(name):
            return None
        folder = self.publish_dir / name
        return folder if _servable(folder) else None

    def published_versions(self) -> list[str]:
        """Names of the servable published versions, oldest step first."""
        try:
            names = [p.name for p in self.publish_dir.iterdir() if self._published.fullmatch(p.name)]
        except OSError:  # not written yet (nothing published) or unreadable: nothing to serve
            return []
        names = [n for n in names if _servable(self.publish_dir / n)]
        return sorted(names, key=lambda n: int(self._published.fullmatch(n).group(1)))  # type: ignore[union-attr]


def _servable(folder: Path) -> bool:
    # a retired version (pruned by checkpoint.keep) keeps its folder a while for requests already running on it
    return (folder / "adapter_config.json").is_file() and not (folder / ".retired").exists()


def installed_namespaces() -> tuple[AdapterNamespace, ...]:
    """The namespaces :func:`install` guards in this process, one per job (none: DeltaServe is not enabled here)."""
    return tuple(_STATE.values())


def install(namespace: AdapterNamespace) -> None:
    """Guard vLLM's adapter endpoints and serve ``namespace``'s published versions by name, in this (API server)
    process, beside those of the namespaces installed before (a server runs several jobs); a namespace of the same
    adapter name replaces the earlier one. Idempotent."""
    _STATE[namespace.adapter_name] = namespace
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    _wrap(OpenAIServingModels, "load_lora_adapter", _guarded_load)
    _wrap(OpenAIServingModels, "unload_lora_adapter", _guarded_unload)
    _wrap(OpenAIServingModels, "show_available_models", _listing_published)
    from vllm.entrypoints.serve.engine.serving import BaseServing

    _wrap(BaseServing, "_check_model", _serving_published)
    try:
        from vllm.entrypoints.pooling.base.serving import PoolingBaseServing
    except ImportError:  # pragma: no cover - a vLLM without pooling servings
        return
    if "_check_model" in vars(PoolingBaseServing):  # it overrides BaseServing's, so it needs its own wrap
        _wrap(PoolingBaseServing, "_check_model", _serving_published)


def _wrap(cls: type, attr: str, make: Any) -> None:
    original = vars(cls)[attr]
    if getattr(original, _MARK, False):
        return
    wrapped = make(original)
    functools.update_wrapper(wrapped, original)
    setattr(wrapped, _MARK, True)
    setattr(cls, attr, wrapped)


def _serving_models_module() -> Any:
    """The module of vLLM's ``OpenAIServingModels``: its ``create_error_response`` and ``ErrorResponse`` globals are
    the ones vLLM's own adapter endpoints answer with. Both moved between releases (0.26:
    ``vllm.entrypoints.serve.utils.error_response`` / ``vllm.entrypoints.openai.engine.protocol``; 0.32:
    ``vllm.entrypoints.serve`` / ``vllm.entrypoints.serve.engine.protocol``), the module importing them did not."""
    import sys

    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    return sys.modules[OpenAIServingModels.__module__]


def _error(message: str, status: HTTPStatus, kind: str) -> Any:
    return _serving_models_module().create_error_response(message=message, err_type=kind, status_code=status)


def _load_refused(name: Any) -> Any:
    return _error(f"The LoRA adapter {name!r} could not be loaded.", HTTPStatus.BAD_REQUEST, "BadRequestError")


def _guarded_load(original: Any) -> Any:
    async def load_lora_adapter(self: Any, request: Any, base_model_name: str | None = None) -> Any:
        spaces = installed_namespaces()
        if not spaces:
            return await original(self, request, base_model_name)
        name = getattr(request, "lora_name", None)
        current = self.lora_requests.get(name) if isinstance(name, str) else None
        if any(ns.owns_name(name) or ns.owns_path(getattr(request, "lora_path", None))
               or (current is not None and ns.owns_path(current.lora_path)) for ns in spaces):
            log.warning("refused a client load of LoRA adapter %r from %r: DeltaServe's names and folders are not "
                        "loadable through the API", name, getattr(request, "lora_path", None))
            return _load_refused(name)
        result = await original(self, request, base_model_name)
        failed = isinstance(result, _serving_models_module().ErrorResponse)
        if failed and result.error.code != HTTPStatus.BAD_REQUEST:
            # vLLM answers a missing folder 404 and an unreadable one 500 with the OS error: a path probe.
            log.warning("loading LoRA adapter %r from %r failed: %s", name, getattr(request, "lora_path", None),
                        result.error.message)
            return _load_refused(name)
        return result

    return load_lora_adapter


def _guarded_unload(original: Any) -> Any:
    async def unload_lora_adapter(self: Any, request: Any) -> Any:
        spaces = installed_namespaces()
        if not spaces:
            return await original(self, request)
        name = getattr(request, "lora_name", None)
        current = self.lora_requests.get(name) if isinstance(name, str) else None
        if any(ns.owns_name(name) or (current is not None and ns.owns_path(current.lora_path)) for ns in spaces):
            log.warning("refused a client unload of LoRA adapter %r: DeltaServe's versions are not unloadable "
                        "through the API", name)
            # the same answer as for a name that was never loaded
            return _error(f"The lora adapter {name!r} cannot be found.", HTTPStatus.NOT_FOUND, "NotFoundError")
        return await original(self, request)

    return unload_lora_adapter


def _serving_published(original: Any) -> Any:
    async def _check_model(self: Any, request: Any) -> Any:
        models = getattr(self, "models", None)
        if hasattr(models, "lora_requests") and hasattr(models, "engine_client"):
            name = getattr(request, "model", None)
            for ns in installed_namespaces():  # a name is at most one job's: each checks its own spelling
                await _forget_pruned(models, ns)
                if name == ns.latest_alias:
                    await _point_latest(models, ns)
                else:
                    await _admit_published(models, ns, name)
        return await original(self, request)

    return _check_model


def _listing_published(original: Any) -> Any:
    async def show_available_models(self: Any) -> Any:
        aliases = []
        for ns in installed_namespaces():
            await _forget_pruned(self, ns)
            for name in ns.published_versions():
                await _admit_published(self, ns, name)
            alias = await _point_latest(self, ns)
            if alias is not None:
                aliases.append((ns, alias))
        listing = await original(self)
        for ns, alias in aliases:
            # vLLM names each card after its LoRARequest, so the alias's entry came out as a second card of the
            # version it points at: that second one is the alias's.
            dup = [i for i, card in enumerate(listing.data) if card.id == alias.lora_name]
            if len(dup) > 1:
                listing.data[dup[-1]] = listing.data[dup[-1]].model_copy(update={"id": ns.latest_alias})
        return listing

    return show_available_models


async def _forget_pruned(models: Any, ns: AdapterNamespace) -> None:
    """Drop published versions DeltaServe retired (``checkpoint.keep``): a new request for one is then a 404.

    The engine keeps the adapter until its LRU evicts it: removing it now would make a request still running on
    it reload it from a folder that is about to go, and a failed load fails the engine's step."""
    for name, req in list(models.lora_requests.items()):
        if ns.owns_name(name) and not _servable(Path(req.lora_path)):
            models.lora_requests.pop(name, None)
            log.info("adapter version %s was pruned; no longer served", name)


async def _admit_published(models: Any, ns: AdapterNamespace, name: Any) -> None:
    folder = ns.published_folder(name)
    if folder is None or name in models.lora_requests:
        return
    from vllm.lora.request import LoRARequest

    async with models.lora_resolver_lock[name]:
        if name in models.lora_requests:
            return
        # the API server numbers adapters from its own counter; the reserved adapter's id is far above it
        req = LoRARequest(lora_name=name, lora_int_id=models.lora_id_counter.inc(1), lora_path=str(folder))
        try:
            await models.engine_client.add_lora(req)
        except Exception as exc:  # noqa: BLE001 - the client gets vLLM's 404 for an unknown model
            log.warning("published adapter %s could not be loaded: %s", name, exc)
            return
        models.lora_requests[name] = req
        log.info("serving published adapter %s", name)


async def _point_latest(models: Any, ns: AdapterNamespace) -> Any:
    """Point ``<adapter>@latest`` at the newest published version (admitting it first); returns its LoRARequest,
    or None (and no alias) while nothing is published.

    The alias's table entry is the version's own LoRARequest: vLLM serves a request by the entry its ``model``
    names, and answers with the LoRARequest's name, so a client sees which version served it."""
    versions = ns.published_versions()
    for name in reversed(versions):  # the newest that loads; a failed load was logged by _admit_published
        await _admit_published(models, ns, name)
        if name in models.lora_requests:
            models.lora_requests[ns.latest_alias] = models.lora_requests[name]
            return models.lora_requests[name]
    models.lora_requests.pop(ns.latest_alias, None)
    return None
