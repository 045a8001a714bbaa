"""Hosts are found through the ``deltaserve.hosts`` entry-point group, never guessed.

Each entry point names a :class:`HostSpec`, a light object that imports nothing of its engine: listing hosts
(``deltaserve hosts``) must work when an engine is missing, and must say how to install it. Creating a host
imports the adapter; a missing engine or a broken adapter raises :class:`HostUnavailableError` with the
install command, and an unknown name raises with the list of known hosts. There is no fallback host.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .driver import HostConfig, HostDriver
from .hooks import HostHooks, validate_host
from .hostkit import PatchRecord

__all__ = ["ENTRY_POINT_GROUP", "HostSpec", "HostUnavailableError", "ServerCommand", "UnknownHostError",
           "available_hosts", "get_host_spec", "create_host"]

ENTRY_POINT_GROUP = "deltaserve.hosts"


class UnknownHostError(LookupError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"no DeltaServe host named {name!r}; installed hosts: {', '.join(known) or 'none'}. "
            "Run `deltaserve hosts` to see every host and how to install its engine."
        )


class HostUnavailableError(RuntimeError):
    """A registered host cannot be created here (engine missing, wrong version, adapter import failure)."""


@dataclass(frozen=True)
class ServerCommand:
    """An engine's own server command with DeltaServe switched on: ``argv`` as an operator would type it, run
    with ``env`` added to the environment.

    ``argv[0] == "python"`` means the interpreter DeltaServe runs under (:meth:`resolved_argv`): the engine and
    DeltaServe's plugin must load in the same environment, whichever ``python`` is first on ``PATH``.
    ``secret_env`` names entries of ``env``, ``secret_argv`` positions in ``argv``, that :meth:`shell` prints as a
    reference to an environment variable (an API key: as ``"$VLLM_API_KEY"``, an ``argv`` word as
    ``"$DELTASERVE_API_KEY"``), never as the value, so that a printed command can be shown and pasted into a shell
    that has the variable set."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: frozenset[str] = frozenset()
    secret_argv: frozenset[int] = frozenset()

    def shell(self) -> str:
        """The command as one shell line, environment first, secrets as variable references."""
        env = [f'{k}="${k}"' if k in self.secret_env else f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        words = ['"$DELTASERVE_API_KEY"' if i in self.secret_argv else shlex.quote(w) for i, w in enumerate(self.argv)]
        return " ".join([*env, *words])

    def resolved_argv(self) -> list[str]:
        """``argv`` to exec: ``python`` is this interpreter, and a console script (``vllm``) is the one installed
        beside it when there is one, also when its environment is not activated (not on ``PATH``)."""
        head = self.argv[0]
        if head == "python":
            return [sys.executable, *self.argv[1:]]
        beside = Path(sys.executable).with_name(head)
        if "/" not in head and beside.is_file():
            return [str(beside), *self.argv[1:]]
        return list(self.argv)


@dataclass(frozen=True)
class HostSpec:
    """Registry entry of one host.

    ``factory`` is ``"module:callable"``; the callable takes a :class:`HostConfig` and returns an object that
    implements :class:`HostHooks` and :class:`HostDriver`. ``engine_distributions`` are the pip
    distributions whose presence means the engine is installed (the first one found gives the version);
    ``supported`` is the PEP 440 range the adapter is tested against. ``stock`` is ``"module:callable"`` of the
    engine run as shipped, without DeltaServe (the bench's ``stock`` systems; see ``deltaserve_vllm.stock.run_stock``
    for the signature), or empty where the host has none. ``operator_command`` is ``"module:callable"`` of a
    function ``(HostConfig, job_path, *, listen=None, api_key=None, jobs_api=False, extra=()) -> ServerCommand``:
    the engine's own server command with DeltaServe switched on, under the settings ``HostConfig`` describes
    (``deltaserve calibrate`` prints it, ``deltaserve serve`` runs it); ``listen`` is an ``(address, port)``,
    ``api_key`` the key the server must require (None: none), ``jobs_api`` whether the fine-tuning jobs routes are
    mounted where the engine needs a switch for them, ``extra`` the operator's own engine arguments, appended; empty where the
    engine has no server DeltaServe attaches to (the reference host). ``patches`` is ``"module:attribute"`` of the adapter's run-time patches
    to its engine, a sequence of :class:`~deltaserve_core.hostkit.PatchRecord` in a module that imports no engine
    (``deltaserve hosts --patches``), or empty where the host patches nothing.
    """

    name: str
    description: str
    factory: str
    install_command: str
    engine_distributions: tuple[str, ...] = ()
    supported: str = ""
    notes: str = ""
    static_capabilities: dict[str, object] = field(default_factory=dict)
    stock: str = ""
    operator_command: str = ""
    patches: str = ""

    def patch_records(self) -> tuple[PatchRecord, ...]:
        """The adapter's patch records (empty when it patches nothing)."""
        if not self.patches:
            return ()
        module, _, attr = self.patches.partition(":")
        return tuple(getattr(importlib.import_module(module), attr))

    def engine_version(self) -> str | None:
        if not self.engine_distributions:
            import deltaserve_core

            return deltaserve_core.__version__
        for dist in self.engine_distributions:
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                continue
        return None

    def version_problem(self) -> str | None:
        """Why the installed engine cannot be used, or ``None`` when it can."""
        version = self.engine_version()
        if version is None:
            return f"engine not installed; install it with: {self.install_command}"
        if self.supported:
            from packaging.specifiers import SpecifierSet
            from packaging.version import Version

            if Version(version.split("+")[0]) not in SpecifierSet(self.supported):
                return (f"installed engine version {version} is outside the supported range {self.supported}; "
                        f"install a supported one with: {self.install_command}")
        return None

    def load_factory(self) -> Callable[[HostConfig], object]:
        return self._load(self.factory)

    def load_stock(self) -> Callable[..., dict[str, object]]:
        """The engine-as-shipped runner (``stock``); raises ``HostUnavailableError`` where the host has none."""
        if not self.stock:
            raise HostUnavailableError(f"host {self.name!r} has no stock engine to compare with (the stock systems "
                                       "run an engine as shipped, without DeltaServe)")
        return self._load(self.stock)

    def load_operator_command(self) -> Callable[..., ServerCommand]:
        """The ``operator_command`` function; raises ``HostUnavailableError`` where the host has none."""
        if not self.operator_command:
            raise HostUnavailableError(f"host {self.name!r} has no server of its own to start with DeltaServe")
        return self._load(self.operator_command)

    def _load(self, target: str) -> Callable[..., object]:  # type: ignore[type-arg]
        problem = self.version_problem()
        if problem:
            raise HostUnavailableError(f"host {self.name!r}: {problem}")
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
            return getattr(module, attr)
        except Exception as exc:  # the adapter itself is broken: say which and how to reinstall
            raise HostUnavailableError(
                f"host {self.name!r}: importing its adapter {target} failed ({type(exc).__name__}: {exc}); "
                f"reinstall with: {self.install_command}"
            ) from exc

    def create(self, config: HostConfig) -> "ServingHost":
        host = self.load_factory()(config)
        validate_host(host)
        if not isinstance(host, HostDriver):
            raise HostUnavailableError(
                f"host {self.name!r}: created object {type(host).__qualname__} lacks the HostDriver client methods "
                "(generate, submit, step, run_idle_step, has_unfinished, shutdown)"
            )
        return host  # type: ignore[return-value]


class ServingHost(HostHooks, HostDriver, Protocol):
    """What :meth:`HostSpec.create` returns: both protocols on one object."""


def _entry_points() -> list[md.EntryPoint]:
    return sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def available_hosts() -> dict[str, HostSpec]:
    """Every registered host, keyed by name. A broken entry point raises, naming its distribution."""
    specs: dict[str, HostSpec] = {}
    for ep in _entry_points():
        try:
            spec = ep.load()
        except Exception as exc:
            raise HostUnavailableError(
                f"entry point {ep.name!r} in group {ENTRY_POINT_GROUP!r} ({ep.value}) failed to load: {exc}"
            ) from exc
        if not isinstance(spec, HostSpec):
            raise HostUnavailableError(
                f"entry point {ep.name!r} ({ep.value}) must name a deltaserve_core.registry.HostSpec, "
                f"found {type(spec).__name__}"
            )
        if spec.name != ep.name:
            raise HostUnavailableError(f"entry point {ep.name!r} names a HostSpec called {spec.name!r}; they must match")
        specs[spec.name] = spec
    return specs


def get_host_spec(name: str) -> HostSpec:
    specs = available_hosts()
    if name not in specs:
        raise UnknownHostError(name, sorted(specs))
    return specs[name]


def create_host(name: str, config: HostConfig) -> "ServingHost":
    """Create the host registered as ``name`` and validate it against the protocol before returning it."""
    return get_host_spec(name).create(config)

