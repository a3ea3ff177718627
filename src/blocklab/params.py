"""Load params.yaml and refuse bad values before any compute, with one message naming the key and what is allowed."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from .config import ConfigError

SMOLLM2 = "smollm2-135m"


class ParamsError(ConfigError):
    """A parameter file is invalid."""


def schema() -> dict:
    return yaml.safe_load(resources.files("blocklab").joinpath("params.schema.yaml").read_text(encoding="utf-8"))


def load_params(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"parameter file {str(path)!r} does not exist")
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    return validate_params(params, source=str(path))


def validate_params(params, source: str = "params.yaml") -> dict:
    """Schema first (types, names, ranges), then the checks a schema cannot express. Returns ``params``."""
    if not isinstance(params, dict):
        raise ParamsError(f"{source}: expected a mapping of sections at the top level, got {type(params).__name__}")
    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(params))
    if error is not None:
        raise ParamsError(f"{source}: {_describe(error)}")
    for key, message in _cross_field_problems(params):
        raise ParamsError(f"{source}: {key}: {message}")
    return params


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    key = _key(error.absolute_path)
    rule, expected = error.validator, error.validator_value
    if rule == "additionalProperties" and expected is False:
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        return f"{key}: unknown key(s) {extra}; allowed keys: {allowed}"
    if rule == "required":
        return f"{key}: {error.message}; required keys: {list(expected)}"
    if rule == "enum":
        return f"{key}: {error.instance!r} is not allowed; allowed values: {list(expected)}"
    if rule == "type":
        return f"{key}: {error.instance!r} has the wrong type; expected {expected}"
    if rule in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        relation = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[rule]
        return f"{key}: {error.instance!r} is out of range; allowed: {relation} {expected}"
    if rule in ("minItems", "minProperties"):
        return f"{key}: must not be empty (at least {expected} entries)"
    if rule == "uniqueItems":
        return f"{key}: entries must be distinct, got {error.instance!r}"
    if rule == "$ref" or error.context:
        return f"{key}: {error.message}"
    return f"{key}: {error.message}"


def _divides(params, section) -> list[tuple[str, str]]:
    d, heads = params[section]["d_model"], params[section]["n_heads"]
    if d % heads:
        return [(f"{section}.n_heads", f"{heads} does not divide d_model={d}; allowed: a divisor of {d}")]
    return []


def _cross_field_problems(params) -> list[tuple[str, str]]:
    problems = _divides(params, "copy_model") + _divides(params, "activation_norms") + _divides(params, "reverse_copy")
    steps = params["sweep"]["steps"]
    for i, warmup in enumerate(params["sweep"]["warmups"]):
        if warmup > steps:
            problems.append((f"sweep.warmups[{i}]", f"{warmup} is longer than training (sweep.steps={steps}); allowed: 0..{steps}"))
    if params["sweep"]["checkpoint_every"] > steps:
        problems.append(("sweep.checkpoint_every", f"{params['sweep']['checkpoint_every']} exceeds sweep.steps={steps}"))
    sim = params["residual_sim"]
    for i, blocks in enumerate(sim["report_blocks"]):
        if blocks > sim["max_blocks"]:
            problems.append((f"residual_sim.report_blocks[{i}]", f"{blocks} exceeds residual_sim.max_blocks={sim['max_blocks']}"))
    p9 = params["problem9"]
    for student, scores in p9["scores"].items():
        if len(scores) != len(p9["subjects"]):
            problems.append((f"problem9.scores.{student}", f"has {len(scores)} scores for {len(p9['subjects'])} subjects"))
    rc = params["reverse_copy"]
    if rc["vocab_size"] < 3:
        problems.append(("reverse_copy.vocab_size", "needs at least one token besides the start token"))
    if any(v in ("rope", "modern") for v in rc["variants"]) and (rc["d_model"] // rc["n_heads"]) % 2:
        problems.append(("reverse_copy.n_heads", "RoPE variants need an even head dimension d_model/n_heads"))
    model = params["probe"]["model"]
    if model != SMOLLM2 and not Path(model).is_dir():
        problems.append(("probe.model", f"{model!r} is not a directory; allowed: {SMOLLM2!r} or a Hugging Face checkpoint directory"))
    return problems
