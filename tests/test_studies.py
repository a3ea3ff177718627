"""One study protocol (issue 48): every study's plan and run modules implement ``studies.protocol`` with its
signatures, and the studies are named once (``protocol.STUDIES``), which the layer test and the params checks read."""
import importlib
import inspect
from pathlib import Path

import pytest

from blocklab.studies import checks, protocol

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "blocklab" / "studies"
PARTS = {"plan": protocol.StudyPlan, "run": protocol.StudyRun}


def _members(proto) -> dict[str, inspect.Signature | None]:
    """The protocol's methods (their signatures, self dropped) and data members (None)."""
    found = {name: None for name in getattr(proto, "__annotations__", {})}
    for name, value in vars(proto).items():
        if inspect.isfunction(value) and not name.startswith("_"):
            signature = inspect.signature(value)
            found[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return found


def test_the_studies_are_named_once():
    on_disk = sorted(p.parent.name for p in PACKAGE.glob("*/plan.py"))
    assert sorted(protocol.STUDIES) == on_disk
    assert {f.__module__ for f in checks.CHECKS} == {f"blocklab.studies.{s}.plan" for s in protocol.STUDIES}


@pytest.mark.parametrize("study", protocol.STUDIES)
@pytest.mark.parametrize("part", sorted(PARTS))
def test_every_study_implements_the_protocol(study, part):
    module = importlib.import_module(f"blocklab.studies.{study}.{part}")
    proto = PARTS[part]
    assert isinstance(module, proto), f"{module.__name__} lacks a member of {proto.__name__}"
    for name, expected in _members(proto).items():
        if expected is None:
            continue
        got = inspect.signature(getattr(module, name))
        want = [p.name for p in expected.parameters.values()]
        have = [p.name for p in got.parameters.values()]
        assert have[:len(want)] == want, f"{module.__name__}.{name}{got}: the protocol says {name}{expected}"
        extra = list(got.parameters.values())[len(want):]
        assert all(p.default is not inspect.Parameter.empty for p in extra), f"{module.__name__}.{name}: {extra}"
