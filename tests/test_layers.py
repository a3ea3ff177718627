"""The package's layers (STYLE.md): a module imports only from its own layer or below, so each layer can be
read and tested without the ones above it, and no two modules import each other, even lazily inside a function.

Bottom to top: params and config; model; training; experiments; the block reviewer (blocklab.review: a consumer of
model/, which never imports it; reporting renders its recorded tables); figures and reporting; the command line. The rule is
read from the import statements themselves (ast), deferred imports included: an import inside a function is still a
dependency, and a circle through one is a circle (the params loader once imported experiments/sensitivity.py that way).

The studies are one package each, of one shape (studies/README.md), spread over the layers by kind:
``plan`` at the params level (a plan is made from the parameters alone), ``run`` and ``aggregate`` at the experiments
level, ``figures`` at the figures level, ``commands`` at the top with reporting; ``studies.cells`` (the cell, a run's
name and directory) sits below every plan. No study judges a claim: the sensitivity study's claim x setting
and the inference study's ranking by the document's numbers are the reporting level's (``reporting.sensitivity``,
``reporting.inference``), which serve those verbs. Inside a study, and from one study to another, the same order
holds: plan below run below aggregate below figures and commands; a study's own further module (the dynamics study's
``detectors``) is of one of those kinds (``EXTRA``).

Folders (the package's subpackages) import each other one way only: no folder imports a folder that
imports it back, directly or through others.

Validating parameters runs each study's checks: ``params_file.py`` (the one ``load_params``) reads ``studies.checks.CHECKS``,
each plan's ``check_problems``; the plans sit at the params level beside it and never import it, so there is no
circle (tested).
"""
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from blocklab.pipeline import imports_of, package_modules
from blocklab.studies import protocol

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "blocklab"

# First matching prefix wins (longest first); every module of the package must match one (tested).
STUDIES = list(protocol.STUDIES)
STUDY_MODULES = list(protocol.PARTS)  # plan, run, aggregate, figures, commands: bottom to top, inside each study
EXTRA = {"dynamics": {"detectors": "aggregate"}}  # a study's further modules, each of one kind
LAYERS = {
    "params": ["blocklab.model_config", "blocklab.params_file", "blocklab.records", "blocklab.run_settings", "blocklab.io", "blocklab.provenance",
               "blocklab.runtime", "blocklab.pipeline", "blocklab.integrity", "blocklab.studies.cells",
               "blocklab.studies.checks", "blocklab.studies.protocol",
               *[f"blocklab.studies.{s}.plan" for s in STUDIES]],
    "model": ["blocklab.model", "blocklab"],  # the package itself re-exports config and the model's blocks
    "training": ["blocklab.training"],
    "experiments": ["blocklab.experiments", "blocklab.bench", "blocklab.studies",  # studies.family: the commands' helper
                    *[f"blocklab.studies.{s}.{m}" for s in STUDIES for m in ("run", "aggregate")]],
    "reviewer": ["blocklab.review"],
    "figures and reporting": ["blocklab.figures", "blocklab.reporting", "blocklab.lab",
                              *[f"blocklab.studies.{s}.{m}" for s in STUDIES for m in ("figures", "commands")]],
    "cli": ["blocklab.cli", "blocklab.smoke", "blocklab.status"],
}
ORDER = list(LAYERS)


def modules() -> dict[str, Path]:
    return package_modules(PACKAGE)


def layer(module: str) -> int:
    matches = [(len(prefix), ORDER.index(name)) for name, prefixes in LAYERS.items() for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is in no layer of LAYERS"
    return max(matches)[1]


imported = imports_of  # the package's own resolver (blocklab.pipeline), which code_closure uses for rule inputs


def test_every_module_is_in_a_layer_and_the_resolver_sees_relative_imports():
    known = modules()
    assert len(known) > 40 and {layer(m) for m in known} == set(range(len(ORDER)))
    # the resolver itself, on imports whose targets are known: relative, parent-relative, `from . import module`
    edges = {m: {t for t, _ in imported(m, p, known)} for m, p in known.items()}
    assert "blocklab.figures.style" in edges["blocklab.figures.doc000"]  # from . import style
    assert "blocklab.provenance" in edges["blocklab.training.sweep"]  # from .. import provenance
    assert "blocklab.training.sweep" in edges["blocklab.studies.sensitivity.run"]  # deferred imports, inside functions


def test_no_module_imports_a_higher_layer():
    known = modules()
    wrong = [f"{module} ({ORDER[layer(module)]}) imports {target} ({ORDER[layer(target)]}), line {line}"
             for module, path in known.items() for target, line in imported(module, path, known)
             if layer(target) > layer(module)]
    assert not wrong, "\n".join(wrong)


def test_the_studies_have_one_shape_and_keep_its_order_inside_and_between_them():
    """Each study is a package of the same modules (a fourth is a copy of that shape, studies/README.md), whose
    ``__init__`` re-exports nothing; and a study's module imports another study module only of a lower kind (plan below
    run below aggregate below figures below commands) or of the same kind in another study."""
    known = modules()
    studies = PACKAGE / "studies"
    found = {d.name: sorted(p.stem for p in d.glob("*.py") if p.stem != "__init__")
             for d in studies.iterdir() if (d / "__init__.py").is_file()}
    assert found == {s: sorted([*STUDY_MODULES, *EXTRA.get(s, {})]) for s in STUDIES}
    for s in STUDIES:
        assert not imported(f"blocklab.studies.{s}", studies / s / "__init__.py", known), s
    kind = {f"blocklab.studies.{s}.{m}": (s, STUDY_MODULES.index(m)) for s in STUDIES for m in STUDY_MODULES}
    kind |= {f"blocklab.studies.{s}.{m}": (s, STUDY_MODULES.index(k)) for s, extra in EXTRA.items() for m, k in extra.items()}
    wrong = [f"{module} imports {target}, line {line}" for module in kind
             for target, line in imported(module, known[module], known)
             if target in kind and target != module
             and kind[target][1] > kind[module][1]]
    assert not wrong, "\n".join(wrong)


def test_params_reads_the_studies_checks_only_and_no_plan_reads_params():
    """``params_file.validate_params`` runs every study's checks (``studies.checks.CHECKS``, the plans'); so that this is
    no circle, params reads nothing else of the studies and nothing it reads imports ``params`` back."""
    known = modules()
    below = {t for t, _ in imported("blocklab.params_file", known["blocklab.params_file"], known)}
    assert {t for t in below if t.startswith("blocklab.studies")} == {"blocklab.studies.checks"}, below
    for module in ["blocklab.studies.checks", "blocklab.studies.cells", *[f"blocklab.studies.{s}.plan" for s in STUDIES]]:
        assert "blocklab.params_file" not in {t for t, _ in imported(module, known[module], known)}, module
    from blocklab.studies import checks

    assert sorted(check.__module__ for check in checks.CHECKS) == sorted(f"blocklab.studies.{s}.plan" for s in STUDIES)


def folder_edges(known) -> dict[str, set[str]]:
    """Folder -> the folders it imports (a subpackage of blocklab: blocklab.X.*), from every module's imports."""
    def folder(module):
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None

    edges = {}
    for module, path in known.items():
        for target, _ in imported(module, path, known):
            a, b = folder(module), folder(target)
            if a and b and a != b:
                edges.setdefault(a, set()).add(b)
    return edges


def test_no_folder_imports_a_folder_that_imports_it_back():
    """experiments/detectors.py once imported studies.dynamics while studies/sensitivity/run.py imported
    experiments; the studies' aggregations imported reporting.claims, and reporting imports the studies. The folders'
    graph has no circle (so no two import each other); the check itself finds a planted one."""
    def circles(edges):
        found, state = [], {}

        def visit(node, trail):
            state[node] = "open"
            for nxt in sorted(edges.get(node, ())):
                if state.get(nxt) == "open":
                    found.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
                elif nxt not in state:
                    visit(nxt, trail + [nxt])
            state[node] = "done"

        for node in sorted(edges):
            if node not in state:
                visit(node, [node])
        return found

    edges = folder_edges(modules())
    assert {"studies", "reporting", "experiments", "training"} <= set(edges), edges
    assert not circles(edges), "\n".join(circles(edges))
    assert circles({**edges, "experiments": edges.get("experiments", set()) | {"studies"}})  # the old detectors import


def test_the_model_never_imports_the_reviewer():
    """The reviewer reads models; the model knows nothing of it (it left model/ for its own package)."""
    known = modules()
    model = {m: p for m, p in known.items() if layer(m) == ORDER.index("model")}
    assert "blocklab.model.layers" in model and not any(m.startswith("blocklab.review") for m in model)
    wrong = [f"{m} imports {t}, line {line}" for m, p in model.items() for t, line in imported(m, p, known)
             if t == "blocklab.review" or t.startswith("blocklab.review.")]
    assert not wrong, "\n".join(wrong)
    assert layer("blocklab.review.hf") > layer("blocklab.model.hf_config")


def test_no_import_circles():
    known = modules()
    edges = {m: {t for t, _ in imported(m, p, known) if t in known and t != m} for m, p in known.items()}
    # a package's __init__ importing its own submodules (re-exports) is not a circle with them: drop parent edges
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}
    circles, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not circles, "\n".join(circles)


def test_every_module_imports_alone_in_any_order():
    """Each module imported with no other module of the package loaded, in a shuffled order (seed in the message), in
    one fresh interpreter: between imports every ``blocklab`` module is dropped from sys.modules, so each import
    starts as in a fresh process (third-party modules such as torch stay loaded: they cannot take part in a circle of
    ours, and loading torch 50 times would cost a minute of CI)."""
    names = sorted(modules())
    seed = random.randrange(10**6)
    random.Random(seed).shuffle(names)
    driver = ("import importlib, sys, traceback\n"
              "failed = []\n"
              "for name in sys.argv[1:]:\n"
              "    for loaded in [m for m in sys.modules if m == 'blocklab' or m.startswith('blocklab.')]:\n"
              "        del sys.modules[loaded]\n"
              "    try:\n"
              "        importlib.import_module(name)\n"
              "    except Exception:\n"
              "        failed.append(name + ':\\n' + traceback.format_exc(limit=-3))\n"
              "print('\\n'.join(failed)); sys.exit(1 if failed else 0)\n")
    env = {**os.environ, "PYTHONPATH": f"{PACKAGE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", driver, *names], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"order seed {seed}:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("module", ["blocklab.studies.sensitivity.plan", "blocklab.studies.sensitivity.commands",
                                    "blocklab.experiments.residual_trained"])
def test_a_module_imports_alone_in_a_fresh_process(module):
    """The same, in a truly fresh interpreter, for a module of the params layer and two that sit on long chains."""
    env = {**os.environ, "PYTHONPATH": f"{PACKAGE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_plan_names_runs_as_the_sweep_does():
    """One run-directory name: ``run_settings.run_name``, which the sweep and the studies' cells both use."""
    from blocklab import run_settings
    from blocklab.studies import cells as study
    from blocklab.training import sweep

    assert study.run_name is run_settings.run_name and sweep.run_name is run_settings.run_name
    assert run_settings.run_name("post", 400, 2) == "post-w400-s2"


def test_one_loader_of_parameters_and_one_default_cadence():
    """One value, one home: a single ``load_params`` in the package (``params``: the whole validation,
    every study's checks included), and the diagnostics' default interval written once
    (``diagnostics.EVERY``), which the section's check and the recorder both use; the reviewer's old alias is gone."""
    import ast
    import inspect

    defined = [module for module, path in modules().items()
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.FunctionDef) and node.name == "load_params"]
    assert defined == ["blocklab.params_file"], defined
    from blocklab import review
    from blocklab.studies import checks
    from blocklab.training import diagnostics

    assert not hasattr(checks, "load_params") and not hasattr(review, "review_hf_config")
    assert inspect.signature(diagnostics.Recorder).parameters["every"].default == diagnostics.EVERY
    assert diagnostics.check_settings({"enabled": True})["every"] == diagnostics.EVERY
    source = inspect.getsource(diagnostics)
    assert source.count(f"= {diagnostics.EVERY}") == 1, "the default interval is written once, as EVERY"
