"""The package layout: every module imports, data files are found where the code looks and ship with the package, and
every source path the DAG names exists (src/blocklab/{model,training,reporting,experiments,figures}/)."""
import fnmatch
import importlib
import importlib.util
import pkgutil
import re
import tomllib
from importlib import resources
from pathlib import Path

import pytest

import blocklab
from blocklab.cli import COMMANDS
from blocklab.pipeline import MODEL_CODE, code_closure, code_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "blocklab"
# Top-level modules before model/, training/ and reporting/ existed: none may come back, not even as a shim.
FORMER_TOP_LEVEL = ["layers", "blocks", "models", "init", "fastpath", "peer", "precision", "counting", "hf_config",
                    "train", "sweep", "tasks", "batched", "claims", "answers", "report", "gallery", "browser", "probe"]
# Modules that moved out of a subpackage into their own (the reviewer left model/): no shim at the old path.
FORMER_SUBPACKAGE = {"blocklab.model.review": "blocklab.review"}
# Modules renamed for what they hold ("probe" named three things): the trained models' residual stream, problem 10 (c),
# measured and drawn. The reviewer's own probe (blocklab.review.probe) keeps its name.
RENAMED = {"blocklab.experiments.probe": "blocklab.experiments.residual_trained",
           "blocklab.figures.probe": "blocklab.figures.residual_trained"}


def test_every_module_imports():
    names = [m.name for m in pkgutil.walk_packages(blocklab.__path__, "blocklab.")]
    assert {"blocklab.model.layers", "blocklab.training.train", "blocklab.reporting.report",
            "blocklab.experiments.residual_trained", "blocklab.review"} <= set(names)
    for name in names:
        importlib.import_module(name)


@pytest.mark.parametrize("name", FORMER_TOP_LEVEL)
def test_no_module_left_at_its_former_path(name):
    assert importlib.util.find_spec(f"blocklab.{name}") is None
    assert not (PACKAGE / f"{name}.py").exists()


def test_the_top_level_review_module_is_now_the_reviewer_package():
    """The first reviewer was a top-level module review.py; the name is the reviewer's package now, never a module."""
    assert not (PACKAGE / "review.py").exists()
    assert (PACKAGE / "review" / "__init__.py").is_file()


@pytest.mark.parametrize("old, new", sorted(FORMER_SUBPACKAGE.items()))
def test_no_subpackage_left_at_its_former_path(old, new):
    assert importlib.util.find_spec(old.rpartition(".")[0]) is not None  # the parent package still exists
    assert importlib.util.find_spec(old) is None, f"{old} is back (a shim?): it moved to {new}"
    assert not (PACKAGE.parent / old.replace(".", "/")).exists()
    assert callable(importlib.import_module(new).register)


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_a_renamed_module_is_gone_from_its_former_name(old, new):
    assert importlib.util.find_spec(old) is None, f"{old} is back (a shim?): it is {new} now"
    assert importlib.util.find_spec(new) is not None


def test_every_folder_says_in_its_first_lines_what_it_holds():
    """Each top-level folder git tracks has a README.md (its first lines say what the folder holds), and each package
    of src/blocklab an __init__.py docstring: the first lines a reader of the folder sees."""
    import ast
    import subprocess

    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    folders = {name.split("/")[0] for name in listed if "/" in name and not name.startswith((".", "src/"))}
    assert {"docs", "records", "scripts", "tests", "workflow", "configs"} <= folders
    for folder in sorted(folders):
        readme = ROOT / folder / "README.md"
        assert readme.is_file(), f"{folder}/ has no README.md saying what it holds"
        assert readme.read_text(encoding="utf-8").strip(), f"{folder}/README.md is empty"
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and doc.strip(), f"{init.relative_to(ROOT)}: no docstring saying what the package holds"


def test_every_command_module_registers():
    for module in set(COMMANDS.values()):
        assert callable(importlib.import_module(module).register), module


def test_data_files_are_found_in_their_subpackage():
    from blocklab.model import hf_config
    from blocklab.reporting import answers, claims

    assert resources.files("blocklab").joinpath("params.schema.yaml").is_file()
    assert resources.files("blocklab.reporting").joinpath("claims.yaml").is_file()
    assert resources.files("blocklab.reporting").joinpath("answers.yaml").is_file()
    for name in hf_config.SHIPPED:
        assert hf_config.shipped_path(name).is_file(), name
    assert claims.load_claims() and answers.texts()


def _package_of(path: Path) -> tuple[str, Path]:
    """The innermost package directory holding ``path``, as (dotted name, directory)."""
    folder = path.parent
    while not (folder / "__init__.py").exists():
        folder = folder.parent
    return ".".join(folder.relative_to(PACKAGE.parent).parts), folder


def test_every_data_file_ships_with_the_package():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-data"]
    data_files = [p for p in PACKAGE.rglob("*") if p.suffix in (".yaml", ".json") and "__pycache__" not in p.parts]
    assert len(data_files) >= 5  # params.schema.yaml, claims.yaml, answers.yaml, two HF configs
    for path in data_files:
        package, folder = _package_of(path)
        relative = path.relative_to(folder).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in package_data.get(package, [])), (package, relative)


def test_every_source_path_the_dag_names_exists():
    named = set(code_files(*MODEL_CODE))
    for rules in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]:
        text = rules.read_text(encoding="utf-8")
        for how, args in re.findall(r"(code_files|code_closure)\(([^)]*)\)", text):
            named.update((code_files if how == "code_files" else code_closure)(*re.findall(r'"([^"]+)"', args)))
        named.update(re.findall(r'"(src/blocklab/[^"]+)"', text))
    assert len(named) > 20
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing


def test_a_rules_code_closure_follows_the_imports_deferred_ones_included():
    """The claims rule's code inputs are what its command imports, transitively: the verdict rules (verdicts.py) and the
    shared reading of a step (studies/dynamics/aggregate.py, imported inside a function) included, so an edit to either
    re-judges the claims; a module that does not exist is refused, not silently dropped."""
    closure = code_closure("reporting/claims")
    for module in ("reporting/claims", "reporting/verdicts", "studies/dynamics/aggregate", "params_file"):
        assert f"src/blocklab/{module}.py" in closure, module
    assert "src/blocklab/reporting/report.py" not in closure  # claims does not import the report
    assert all((ROOT / path).is_file() for path in closure)
    with pytest.raises(ValueError, match="reporting/nonesuch: no such module"):
        code_closure("reporting/nonesuch")


def test_every_list_of_norm_positions_names_model_config_norm_positions():
    """One list per extension point: model_config.NORM_POSITIONS. The figures' colours, the schema's enum and every
    command's --norm choices are checked against it here (so a new position without a colour fails now, not when the
    report is drawn); the rules' wildcard and the ranking's run-name pattern are made from it."""
    import yaml

    from blocklab.cli import build_parser
    from blocklab.model_config import NORM_POSITIONS
    from blocklab.figures.doc000 import NORM_COLORS

    positions = set(NORM_POSITIONS)
    schema = yaml.safe_load(resources.files("blocklab").joinpath("params.schema.yaml").read_text(encoding="utf-8"))
    assert set(schema["$defs"]["norm_position"]["enum"]) == positions
    assert set(NORM_COLORS) == positions

    def leaves(parser):
        for action in parser._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for sub in action.choices.values():
                    yield from leaves(sub)
        yield parser

    choices = {parser.prog: set(action.choices) for parser in leaves(build_parser(None))
               for action in parser._actions if "--norm" in action.option_strings}
    assert {"blocklab sweep train", "blocklab sweep train-group", "blocklab sensitivity train",
            "blocklab inference train"} <= set(choices)
    assert all(found == positions for found in choices.values()), choices
    assert 'norm="|".join(NORM_POSITIONS)' in (ROOT / "workflow" / "rules" / "doc000.smk").read_text(encoding="utf-8")


def test_every_list_of_model_choices_names_the_config_list():
    """One list per extension point: the FFN kinds, norm kinds, position kinds and init schemes are the
    tuples of blocklab.model_config. The schema's enums are checked against them, and a new FFN kind must come with its
    figure name, its matrix count for the parameter audit, and a closed-form count equal to the built model's."""
    import yaml

    from blocklab import model_config
    from blocklab.experiments.param_counts import FFN_MATRICES
    from blocklab.figures.params import FFN_NAMES
    from blocklab.model.counting import decoder_lm_params
    from blocklab.model.models import DecoderLM

    schema = yaml.safe_load(resources.files("blocklab").joinpath("params.schema.yaml").read_text(encoding="utf-8"))
    model = schema["properties"]["copy_model"]["properties"]
    assert model["ffn_kind"]["enum"] == list(model_config.FFN_KINDS)
    assert model["norm_kind"]["enum"] == list(model_config.NORM_KINDS)
    assert model["init"]["enum"] == list(model_config.INIT_SCHEMES)
    assert schema["$defs"]["position"]["enum"] == list(model_config.POSITION_KINDS)
    assert set(FFN_NAMES) == set(FFN_MATRICES) == set(model_config.FFN_KINDS)
    for kind in model_config.FFN_KINDS:
        cfg = model_config.ModelConfig(d_model=16, n_heads=2, n_layers=2, vocab_size=11, max_len=8, ffn_kind=kind)
        assert decoder_lm_params(cfg) == sum(p.numel() for p in DecoderLM(cfg).parameters()), kind
