"""Bad parameter files are refused before any compute, with one message naming the key and what is allowed.

Every case starts from configs/tiny.yaml (which is valid), breaks one thing, and checks that the message names the
offending key path and the allowed values or range, written out here by hand from params.schema.yaml and the
documents, not captured from the code. The same refusal is then checked through the `blocklab` command (exit 2,
one line on stderr, no traceback, nothing written) and through `snakemake -n` in a scratch copy of the project.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from blocklab.params_file import ParamsError, load_params

PROJECT = Path(__file__).resolve().parents[1]
TINY_TEXT = (PROJECT / "configs/tiny.yaml").read_text(encoding="utf-8")
TINY = yaml.safe_load(TINY_TEXT)
BLOCKLAB = Path(sys.executable).with_name("blocklab")


def setting(path: str, value):
    """A mutation that sets `section.key` (or a top-level key) to ``value``."""
    def mutate(params):
        *parents, last = path.split(".")
        node = params
        for part in parents:
            node = node[part]
        node[last] = value
    return mutate


def removing(path: str):
    def mutate(params):
        *parents, last = path.split(".")
        node = params
        for part in parents:
            node = node[part]
        del node[last]
    return mutate


def both(*mutations):
    def mutate(params):
        for m in mutations:
            m(params)
    return mutate


# (case id, mutation of the tiny params, key path the message must name, what the message must say is allowed)
DICT_CASES = [
    # wrong types
    ("string-for-int", setting("copy_model.d_model", "32"), "copy_model.d_model", "an integer >= 1"),
    ("bool-for-int", setting("copy_model.n_layers", True), "copy_model.n_layers", "an integer >= 1"),
    ("bool-for-vocab", setting("copy_task.vocab_size", False), "copy_task.vocab_size", "an integer >= 2"),
    ("float-for-int", setting("copy_task.batch_size", 8.0), "copy_task.batch_size", "an integer >= 1"),
    ("fraction-for-int", setting("sweep.steps", 60.5), "sweep.steps", "an integer >= 1"),
    ("float-seed", setting("gradnorm.seeds", [0, 1.0]), "gradnorm.seeds[1]", "an integer >= 0"),
    ("null-value", setting("residual_sim.trials", None), "residual_sim.trials", "an integer >= 1"),
    ("string-for-bool", setting("sweep.compile", "maybe"), "sweep.compile", "true or false"),
    ("unknown-batching", setting("sweep.batched", "sometimes"), "sweep.batched", "['auto', True, False]"),
    ("bool-for-number", setting("reverse_copy.lr", True), "reverse_copy.lr", "a number > 0 and <= 1"),
    ("section-not-mapping", setting("copy_task", 8), "copy_task", "a mapping with keys ['batch_size', 'seq_len', 'vocab_size']"),
    ("section-null", setting("figures", None), "figures", "a mapping with keys ['dpi', 'lang']"),
    ("score-not-number", setting("problem9.scores.A", [90, "x", 70]), "problem9.scores.A[1]", "a number"),
    # unknown keys
    ("unknown-top-level", setting("sweeps", {"steps": 10}), "(top level)", "unknown key(s) ['sweeps']"),
    ("unknown-in-section", setting("copy_model.heads", 4), "copy_model", "unknown key(s) ['heads']"),
    ("unknown-in-sweep", setting("sweep.warmup", 20), "sweep", "'warmups'"),
    # missing
    ("missing-section", removing("gradnorm"), "(top level)", "missing required key(s) ['gradnorm']"),
    ("missing-key", removing("sweep.lr"), "sweep", "missing required key(s) ['lr']"),
    # sizes and ranges
    ("zero-layers", setting("copy_model.n_layers", 0), "copy_model.n_layers", ">= 1"),
    ("negative-seq-len", setting("copy_task.seq_len", -4), "copy_task.seq_len", ">= 1"),
    ("zero-threads", setting("threads_per_run", 0), "threads_per_run", ">= 1"),
    ("zero-width-list", setting("param_counts.d_models", [64, 0]), "param_counts.d_models[1]", ">= 1"),
    ("negative-seed", setting("sweep.seeds", [0, -1]), "sweep.seeds[1]", ">= 0"),
    ("negative-warmup", setting("sweep.warmups", [-20, 0]), "sweep.warmups[0]", ">= 0"),
    ("zero-lr", setting("sweep.lr", 0), "sweep.lr", "> 0"),
    ("negative-lr", setting("reverse_copy.lr", -1.0e-3), "reverse_copy.lr", "> 0"),
    ("huge-lr", setting("sweep.lr", 3.0), "sweep.lr", "<= 1"),
    ("zero-ffn-ratio", setting("copy_model.ffn_ratio", 0), "copy_model.ffn_ratio", "> 0"),
    ("dpi-too-high", setting("figures.dpi", 5000), "figures.dpi", "<= 600"),
    ("short-seq-reverse", setting("reverse_copy.seq_len", 1), "reverse_copy.seq_len", ">= 2"),
    # lists
    ("empty-seeds", setting("sweep.seeds", []), "sweep.seeds", "at least 1"),
    # a rate over seeds needs seeds: the collapse rate's and the held-out claims'
    ("empty-rate-seeds", setting("dynamics.collapse.seeds", []), "dynamics.collapse.seeds", "at least 1"),
    ("empty-compare-seeds", setting("dynamics.compare_seeds", []), "dynamics.compare_seeds", "at least 1"),
    ("empty-norms", setting("gradnorm.norms", []), "gradnorm.norms", "at least 1"),
    ("duplicate-seeds", setting("gradnorm.seeds", [0, 1, 0]), "gradnorm.seeds", "distinct"),
    ("duplicate-warmups", setting("sweep.warmups", [20, 20]), "sweep.warmups", "distinct"),
    ("one-subject", setting("problem9.subjects", ["국어"]), "problem9.subjects", "at least 2"),
    ("one-student", setting("problem9.scores", {"A": [1, 2, 3]}), "problem9.scores", "at least 2"),
    ("no-prompts", setting("probe.prompts", {}), "probe.prompts", "at least 1"),
    ("empty-prompt", setting("probe.prompts.ko", ""), "probe.prompts.ko", "a non-empty string"),
    # names
    ("unknown-norm-position", setting("sweep.norms", ["post", "mid"]), "sweep.norms[1]", "['post', 'pre'"),
    ("norm-position-case", setting("gradnorm.norms", ["Pre"]), "gradnorm.norms[0]", "['post', 'pre'"),
    ("unknown-norm-kind", setting("copy_model.norm_kind", "batchnorm"), "copy_model.norm_kind", "['layernorm', 'rmsnorm']"),
    ("unknown-ffn", setting("copy_model.ffn_kind", "geglu"), "copy_model.ffn_kind", "['relu', 'gelu', 'swiglu']"),
    ("unknown-position", setting("copy_model.position", "alibi"), "copy_model.position",
     "['learned', 'sinusoidal', 'rope', 'none']"),
    ("unknown-init", setting("gradnorm.init", "kaiming"), "gradnorm.init", "['default', 'xavier']"),
    ("unknown-model-init", setting("copy_model.init", "orthogonal"), "copy_model.init", "['default', 'xavier']"),
    ("unknown-variant", setting("reverse_copy.variants", ["classic", "fancy"]), "reverse_copy.variants[1]",
     "['classic', 'rmsnorm', 'swiglu', 'rope', 'modern']"),
    ("unknown-hf-config", setting("param_counts.hf_configs", ["gpt2"]), "param_counts.hf_configs[0]",
     "['llama3-8b', 'qwen3-vl-4b-text']"),
    ("unknown-lang", setting("figures.lang", "fr"), "figures.lang", "['ko', 'en']"),
    ("unknown-device", setting("device", "tpu"), "device", "['auto', 'cpu', 'cuda']"),
    # across fields
    ("heads-copy-model", setting("copy_model.n_heads", 3), "copy_model.n_heads", "a divisor of 32"),
    ("heads-activation-norms", setting("activation_norms.n_heads", 5), "activation_norms.n_heads", "a divisor of 32"),
    ("heads-reverse-copy", setting("reverse_copy.n_heads", 6), "reverse_copy.n_heads", "a divisor of 32"),
    ("rope-odd-head-dim-copy", both(setting("copy_model.position", "rope"), setting("copy_model.d_model", 36)),
     "copy_model.position", "even head dimension"),
    ("rope-odd-head-dim-reverse", setting("reverse_copy.d_model", 36), "reverse_copy.n_heads", "even"),
    ("width-not-multiple-of-heads", setting("param_counts.d_models", [64, 100]), "param_counts.d_models[1]",
     "a multiple of 8"),
    ("warmup-longer-than-training", setting("sweep.warmups", [0, 100]), "sweep.warmups[1]", "0..60"),
    ("checkpoint-after-training", setting("sweep.checkpoint_every", 61), "sweep.checkpoint_every", "1..60"),
    ("report-beyond-max-blocks", setting("residual_sim.report_blocks", [1, 4, 16, 37]), "residual_sim.report_blocks[3]",
     "1..36"),
    ("score-count-mismatch", setting("problem9.scores.B", [60, 50]), "problem9.scores.B", "one score per subject"),
    ("probe-model-missing-path", setting("probe.model", "/nonexistent/checkpoints/SmolLM2"), "probe.model",
     "'smollm2-135m' or a Hugging Face checkpoint directory"),
    # not numbers: JSON Schema's bounds compare false with NaN, so "> 0 and <= 1" alone lets it through
    ("nan-lr", setting("sweep.lr", float("nan")), "sweep.lr", "nan is not a finite number; allowed: a number > 0 and <= 1"),
    ("inf-ffn-ratio", setting("copy_model.ffn_ratio", float("inf")), "copy_model.ffn_ratio", "inf is not a finite number; allowed: a number > 0"),
    ("nan-in-a-list", setting("problem9.scores.A", [90, float("nan"), 70]), "problem9.scores.A[1]", "not a finite number"),
    # what does not fit: an estimate before any job, against this machine's memory and a year of compute
    ("width-2-20", setting("copy_model.d_model", 2 ** 20), "copy_model.d_model", "activations and logits) and this process may use"),
    ("depth-a-million", setting("copy_model.n_layers", 10 ** 6), "copy_model.n_layers", "activations and logits) and this process may use"),
    ("steps-1e12", setting("sweep.steps", 10 ** 12), "sweep.steps", "a step count under a year"),
    ("zero-width-mlp", setting("copy_model.ffn_ratio", 1e-9), "copy_model.ffn_ratio", "a width of at least 1"),
]


def _line_of(text: str, start: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if line.strip().startswith(start))


def _replace_line(text: str, start: str, new: str) -> str:
    lines = text.splitlines()
    lines[_line_of(text, start) - 1] = new
    return "\n".join(lines) + "\n"


def _insert_after(text: str, start: str, new: str) -> str:
    lines = text.splitlines()
    lines.insert(_line_of(text, start), new)
    return "\n".join(lines) + "\n"


STEPS_LINE = _line_of(TINY_TEXT, "steps: 60")
LR_LINE = _line_of(TINY_TEXT, "lr: 1.0e-3            # Adam")

# (case id, file text, what the message must name, what it must say)
TEXT_CASES = [
    ("yaml-syntax", _replace_line(TINY_TEXT, "steps: 60", "  steps: 60: 1"), f"line {STEPS_LINE}", "not valid YAML"),
    ("yaml-tab-indent", _replace_line(TINY_TEXT, "steps: 60", "\tsteps: 60"), f"line {STEPS_LINE}", "not valid YAML"),
    # PyYAML keeps the last of two equal keys without a word; the first value would be silently lost.
    ("duplicate-key", _insert_after(TINY_TEXT, "lr: 1.0e-3            # Adam", "  lr: 2.0e-3"),
     f"line {LR_LINE + 1}", "duplicate key 'lr'"),
    # YAML 1.1 reads 1e-3 (no dot) as a string.
    ("exponent-without-dot", TINY_TEXT.replace("lr: 1.0e-3            # Adam", "lr: 1e-3"), "sweep.lr", "1.0e-3"),
    ("yaml-true-for-int", TINY_TEXT.replace("n_layers: 3", "n_layers: true"), "copy_model.n_layers", "an integer >= 1"),
    ("yaml-float-for-int", TINY_TEXT.replace("d_model: 32\n", "d_model: 32.0\n", 1), "copy_model.d_model", "an integer"),
    ("top-level-list", "- device: cpu\n- threads_per_run: 1\n", "top level", "mapping"),
    ("top-level-scalar", "params\n", "top level", "mapping"),
    ("empty-file", "# nothing here\n", "top level", "empty file"),
]


def _write(tmp_path: Path, params_or_text) -> Path:
    path = tmp_path / "bad.yaml"
    text = params_or_text if isinstance(params_or_text, str) else yaml.safe_dump(params_or_text, allow_unicode=True)
    path.write_text(text, encoding="utf-8")
    return path


def _check_message(message: str, key: str, allowed: str) -> None:
    assert key in message, f"the key {key!r} is not named in: {message}"
    assert allowed in message, f"the allowed values {allowed!r} are not in: {message}"
    assert "\n" not in message, f"not one line: {message!r}"


def test_the_base_configurations_are_valid():
    # Without this, every case below could pass for the wrong reason.
    assert load_params(PROJECT / "configs/tiny.yaml")["sweep"]["steps"] == 60
    load_params(PROJECT / "params.yaml")


def test_there_are_at_least_thirty_distinct_cases():
    ids = [c[0] for c in DICT_CASES + TEXT_CASES]
    assert len(ids) == len(set(ids)) >= 30


@pytest.mark.parametrize("mutate,key,allowed", [c[1:] for c in DICT_CASES], ids=[c[0] for c in DICT_CASES])
def test_invalid_value_is_refused_naming_key_and_allowed(tmp_path, mutate, key, allowed):
    params = copy.deepcopy(TINY)
    mutate(params)
    with pytest.raises(ParamsError) as err:
        load_params(_write(tmp_path, params))
    _check_message(str(err.value), key, allowed)
    assert str(err.value).startswith(str(tmp_path / "bad.yaml")), "the message should name the file"


@pytest.mark.parametrize("text,key,allowed", [c[1:] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES])
def test_invalid_file_is_refused_naming_place_and_allowed(tmp_path, text, key, allowed):
    with pytest.raises(ParamsError) as err:
        load_params(_write(tmp_path, text))
    _check_message(str(err.value), key, allowed)


def test_several_problems_are_all_named(tmp_path):
    params = copy.deepcopy(TINY)
    params["sweep"]["lr"] = 0
    params["figures"]["dpi"] = 1
    with pytest.raises(ParamsError) as err:
        load_params(_write(tmp_path, params))
    assert "sweep.lr" in str(err.value) and "figures.dpi" in str(err.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ParamsError, match="does not exist"):
        load_params(tmp_path / "nope.yaml")
    with pytest.raises(ParamsError, match="directory"):
        load_params(tmp_path)


def test_probe_model_may_be_an_existing_checkpoint_directory(tmp_path):
    # The other side of probe-model-missing-path: a directory that exists is accepted.
    params = copy.deepcopy(TINY)
    params["probe"]["model"] = str(tmp_path)
    load_params(_write(tmp_path, params))


# ---- through the real command line ---------------------------------------------------------------

CLI_CASES = ["warmup-longer-than-training", "unknown-norm-kind", "float-for-int", "probe-model-missing-path"]
CLI_TEXT_CASES = ["yaml-syntax", "duplicate-key"]


def _bad_file(tmp_path: Path, case: str) -> tuple[Path, str]:
    for name, mutate, key, _ in DICT_CASES:
        if name == case:
            params = copy.deepcopy(TINY)
            mutate(params)
            return _write(tmp_path, params), key
    for name, text, key, _ in TEXT_CASES:
        if name == case:
            return _write(tmp_path, text), key
    raise KeyError(case)


@pytest.mark.parametrize("case", CLI_CASES + CLI_TEXT_CASES)
def test_blocklab_command_refuses_bad_params_before_compute(tmp_path, case):
    bad, key = _bad_file(tmp_path, case)
    out_dir = tmp_path / "run"
    result = subprocess.run(
        [str(BLOCKLAB), "sweep", "train", "--params", str(bad), "--norm", "pre", "--warmup", "0", "--seed", "0",
         "--out-dir", str(out_dir)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, f"expected one line on stderr, got: {result.stderr!r}"
    assert lines[0].startswith("blocklab sweep train: error:") and key in lines[0]
    assert not out_dir.exists(), "nothing may be written before the parameters are accepted"


# ---- through Snakemake (the Snakefile calls blocklab.pipeline.check_config) --------------------------

@pytest.fixture(scope="module")
def scratch_project(tmp_path_factory):
    from blocklab.smoke import make_scratch_project

    return make_scratch_project(tmp_path_factory.mktemp("bad-params-project"))


@pytest.mark.parametrize("case", ["warmup-longer-than-training", "unknown-position", "nan-lr", "width-2-20",
                                  "duplicate-key"])
def test_snakemake_stops_at_once_on_bad_params(scratch_project, case, tmp_path):
    bad, key = _bad_file(tmp_path, case)
    (scratch_project / "params.yaml").write_bytes(bad.read_bytes())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [str(Path(sys.executable).with_name("snakemake")), "-n", "--cores", "1"],
        cwd=scratch_project, capture_output=True, text=True, env=env, timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    # one line, as every blocklab command: not Snakemake's "ParamsError in file ..." and its traceback lines
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("Using workflow")]
    assert len(lines) == 1 and lines[0].startswith("blocklab: error: params.yaml: ") and key in lines[0], output
    assert "Building DAG of jobs" not in output, "the DAG must not be built from bad parameters"
    assert not (scratch_project / "data" / "sweep").exists()
