"""validate_host names the host, the member and the rule; the registry never falls back silently."""

from __future__ import annotations

import dataclasses
import importlib.metadata as md

import pytest

from deltaserve_core.hooks import REQUIRED_MEMBERS, HostProtocolError, validate_host
from deltaserve_core.registry import HostSpec, HostUnavailableError, UnknownHostError, available_hosts, get_host_spec
from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import PROTOCOL_VERSION, ExecutionMode, HostCapabilities, ProposedBatch


class _Complete:
    """Every member with the protocol's signature, no engine behind it: only validate_host looks at it."""

    name = "complete"

    def capabilities(self) -> HostCapabilities:
        return HostCapabilities(engine="none", engine_version="0")

    def model_spec(self): ...
    def intercept_schedule(self, interceptor): ...
    def capture_activation(self, sink): ...
    def report_step_time(self, sink): ...
    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode: ...
    def set_finetune_adapter(self, state): ...
    def publish_adapter(self, state): ...
    def retract_adapter(self, name): ...
    def run_profile_step(self, shape): ...


def _without(member: str) -> object:
    cls = type("Missing", (_Complete,), {member: None, "name": "missing-host"})
    return cls()


def test_complete_host_validates() -> None:
    assert validate_host(_Complete()).protocol_version == PROTOCOL_VERSION


@pytest.mark.parametrize("member", REQUIRED_MEMBERS)
def test_missing_member_is_named(member: str) -> None:
    with pytest.raises(HostProtocolError) as err:
        validate_host(_without(member))
    assert err.value.member == member and err.value.host == "missing-host"
    assert member in str(err.value) and "missing" in str(err.value)


def test_wrong_arity_is_named() -> None:
    class Extra(_Complete):
        name = "extra"

        def capture_activation(self, sink, layer_filter): ...

    with pytest.raises(HostProtocolError, match=r"host 'extra': capture_activation: requires extra argument"):
        validate_host(Extra())

    class Fewer(_Complete):
        name = "fewer"

        def report_step_time(self): ...

    with pytest.raises(HostProtocolError, match=r"report_step_time: takes 0 argument"):
        validate_host(Fewer())


def test_renamed_parameter_is_named() -> None:
    class Renamed(_Complete):
        name = "renamed"

        def graph_mode(self, proposed): ...

    with pytest.raises(HostProtocolError, match=r"graph_mode: parameter 'proposed' must be named 'batch'"):
        validate_host(Renamed())


def test_mistyped_annotation_is_named() -> None:
    class Mistyped(_Complete):
        name = "mistyped"

        def graph_mode(self, batch: ProposedBatch) -> int: ...

    with pytest.raises(HostProtocolError, match=r"graph_mode: returns"):
        validate_host(Mistyped())

    class BadParam(_Complete):
        name = "badparam"

        def graph_mode(self, batch: int) -> ExecutionMode: ...

    with pytest.raises(HostProtocolError, match=r"graph_mode: parameter 'batch' is annotated"):
        validate_host(BadParam())


def test_attribute_instead_of_method() -> None:
    host = _Complete()
    host.graph_mode = "eager"  # type: ignore[assignment]
    with pytest.raises(HostProtocolError, match="graph_mode: must be a method"):
        validate_host(host)


def test_protocol_version_mismatch() -> None:
    class Future(_Complete):
        name = "future"

        def capabilities(self) -> HostCapabilities:
            return dataclasses.replace(super().capabilities(), protocol_version=PROTOCOL_VERSION + 1)

    with pytest.raises(HostProtocolError, match="protocol_version"):
        validate_host(Future())


def test_missing_name() -> None:
    host = _Complete()
    host.name = ""  # type: ignore[misc]
    with pytest.raises(HostProtocolError, match="name"):
        validate_host(host)


def test_reference_host_class_validates_statically() -> None:
    # validate_host only inspects signatures before calling capabilities(); the class itself conforms.
    for member in REQUIRED_MEMBERS:
        assert callable(getattr(ReferenceHost, member))


def test_registry_lists_reference() -> None:
    hosts = available_hosts()
    assert "reference" in hosts
    assert hosts["reference"].engine_version()


def test_unknown_host_lists_known() -> None:
    with pytest.raises(UnknownHostError, match="no DeltaServe host named 'nope'.*reference"):
        get_host_spec("nope")


def test_missing_engine_names_install_command() -> None:
    spec = HostSpec(name="ghost", description="", factory="ghost_engine:create", install_command="pip install ghost-engine",
                    engine_distributions=("ghost-engine-not-installed",))
    with pytest.raises(HostUnavailableError, match="pip install ghost-engine"):
        spec.load_factory()


def test_unsupported_engine_version_refused() -> None:
    spec = HostSpec(name="old", description="", factory="x:y", install_command="pip install 'pytest>=99'",
                    engine_distributions=("pytest",), supported=">=99")
    problem = spec.version_problem()
    assert problem and "outside the supported range >=99" in problem
    with pytest.raises(HostUnavailableError, match="outside the supported range"):
        spec.load_factory()


def test_broken_adapter_import_is_reported() -> None:
    spec = HostSpec(name="broken", description="", factory="deltaserve_core.no_such_module:create",
                    install_command="pip install deltaserve")
    with pytest.raises(HostUnavailableError, match="importing its adapter .* failed"):
        spec.load_factory()


def test_broken_entry_point_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = md.EntryPoint(name="bad", value="deltaserve_core.no_such_module:SPEC", group="deltaserve.hosts")
    monkeypatch.setattr("deltaserve_core.registry._entry_points", lambda: [bad])
    with pytest.raises(HostUnavailableError, match="entry point 'bad'"):
        available_hosts()
