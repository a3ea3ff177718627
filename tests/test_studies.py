"""One study protocol: every registered study (``protocol.STUDIES``) is a package whose five modules
implement ``protocol.Study`` with its signatures, parameter for parameter; the registry is what the parameters'
validation, the command line and the rules read."""
import importlib
import inspect
from pathlib import Path

import pytest

from blocklab.cli import COMMANDS, SECTIONS, TABLE
from blocklab.studies import checks, protocol

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "blocklab" / "studies"
ROOT = PACKAGE.parents[2]


def _members(proto) -> dict[str, inspect.Signature | None]:
    """The protocol's methods (their signatures, self dropped) and data members (None)."""
    found = {name: None for name in getattr(proto, "__annotations__", {})}
    for name, value in vars(proto).items():
        if inspect.isfunction(value) and not name.startswith("_"):
            signature = inspect.signature(value)
            found[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return found


def test_the_studies_are_named_once_and_read_by_the_checks_the_cli_and_the_rules():
    on_disk = sorted(p.parent.name for p in PACKAGE.glob("*/plan.py"))
    assert sorted(protocol.STUDIES) == on_disk
    assert {f.__module__ for f in checks.CHECKS} == {f"blocklab.studies.{s}.plan" for s in protocol.STUDIES}
    people_and_jobs = {name for names in SECTIONS.values() for name in names}
    snakefile = (ROOT / "Snakefile").read_text(encoding="utf-8")
    for study in protocol.STUDIES:
        assert study in TABLE and study in people_and_jobs, study
        verbs = {words.split()[1] for words in COMMANDS if words.split()[0] == study}
        assert {"plan", "train", "status", "snapshot", "aggregate"} <= verbs, (study, verbs)
        assert COMMANDS[f"{study} train"] == f"blocklab.studies.{study}.commands"
        assert (ROOT / "workflow" / "rules" / f"{study}.smk").is_file(), study
    assert 'for _study in STUDIES:' in snakefile and 'include: f"workflow/rules/{_study}.smk"' in snakefile


@pytest.mark.parametrize("study", protocol.STUDIES)
def test_every_study_implements_the_protocol_with_its_signatures(study):
    package = importlib.import_module(f"blocklab.studies.{study}")
    for part in protocol.PARTS:
        importlib.import_module(f"blocklab.studies.{study}.{part}")
    assert isinstance(package, protocol.Study), f"{package.__name__} lacks one of {list(protocol.PARTS)}"
    for part, proto in protocol.PARTS.items():
        module = getattr(package, part)
        assert isinstance(module, proto), f"{module.__name__} lacks a member of {proto.__name__}"
        for name, expected in _members(proto).items():
            if expected is None:
                continue
            got = inspect.signature(getattr(module, name))
            want = [(p.name, p.kind, p.default) for p in expected.parameters.values()]
            have = [(p.name, p.kind, p.default) for p in got.parameters.values()]
            assert have[:len(want)] == want, f"{module.__name__}.{name}{got}: the protocol says {name}{expected}"
            extra = list(got.parameters.values())[len(want):]
            assert all(p.default is not inspect.Parameter.empty for p in extra), f"{module.__name__}.{name}: {extra}"


def test_the_signature_check_can_fail():
    """A study whose ``train`` took a Cell and no norm (as two once did) is refused by the same check."""
    def train(params, cell, seed, out_dir, threads=None):
        return {}

    expected = _members(protocol.StudyRun)["train"]
    have = [p.name for p in inspect.signature(train).parameters.values()]
    assert have[:len(expected.parameters)] != list(expected.parameters)
