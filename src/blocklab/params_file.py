"""The parameter file: load params.yaml and refuse bad values before any compute, with one message naming the key and
what is allowed.

Here: the schema and the cross-field checks of the sections every command reads, and ``load_params``, the one loader of
a parameter file: every command, the pipeline and the tests read parameters through it. Each study's own
checks are in its plan (``studies.<study>.plan.check_problems``), collected in ``studies.checks.CHECKS`` for the
registered studies (``studies.protocol.STUDIES``); validation runs them all. The plans sit at this level and never
import this module, so reading them here makes no circle (tests/test_layers.py)."""
from __future__ import annotations

import math

from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from .model_config import ConfigError

SMOLLM2 = "smollm2-135m"


class ParamsError(ConfigError):
    """A parameter file is invalid."""


def schema() -> dict:
    return yaml.safe_load(resources.files("blocklab").joinpath("params.schema.yaml").read_text(encoding="utf-8"))


def load_params(path: str | Path = "params.yaml", studies: bool = True) -> dict:
    """A parameter file read (``read_params_file``: a repeated key refused) and validated whole (``validate_params``:
    the schema, the general cross-field checks and every study's checks). ``studies=False``: without the studies'
    checks, for a command that reads no study section (the lab), since they look for recorded runs relative to the
    working directory."""
    path = Path(path)
    check_pinned(path)
    return validate_params(read_params_file(path), source=str(path), studies=studies)


# A pipeline plans its jobs from params.yaml as it was when it started; a job reads the file again when it starts, maybe
# an hour later. An edit in between would give a job other values than those its outputs are recorded under (Snakemake's
# params trigger, dvc.lock), and runs of one sweep would mix two settings. So Snakemake's main process pins the file
# (its path and sha256, in this variable, which its jobs inherit: ``pin_params``), and a job finding it changed refuses.
PINNED_ENV = "BLOCKLAB_PARAMS_PINNED"


def _file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def pin_params(path: str | Path) -> None:
    """Called by Snakemake's main process: the jobs it starts refuse ``path`` if it changes meanwhile."""
    import os

    os.environ[PINNED_ENV] = f"{_file_sha256(Path(path))}:{Path(path).resolve()}"


def check_pinned(path: Path) -> None:
    """``ParamsError`` when ``path`` is the file the running pipeline pinned and it has changed since."""
    import os

    digest, _, pinned = os.environ.get(PINNED_ENV, "").partition(":")
    if not pinned or not path.is_file() or path.resolve() != Path(pinned) or _file_sha256(path) == digest:
        return
    raise ParamsError(f"{path}: changed while the pipeline runs (it planned its jobs with the version of sha256 "
                      f"{digest[:12]}); this job does not start, and the jobs finished before the change are kept; once "
                      "the run stops, run the same command again: what the change affects is made again with the new values")


# What a parameter file may hold, checked before anything walks it: params.yaml is 12 KiB of 377 values. A file of
# megabytes, a list of 200,000 seeds or a YAML "billion laughs" (anchors whose aliases expand to 10^9 values while the
# text stays a few lines) would otherwise hold every reader (the schema, Snakemake's config, DVC) for minutes.
MAX_PARAMS_BYTES = 2 << 20
MAX_PARAMS_VALUES = 100_000


def read_params_file(path: str | Path) -> object:
    """A parameter file's YAML, a repeated key refused (naming it and its line), not yet validated; a file over
    MAX_PARAMS_BYTES, or whose values (YAML aliases expanded) number over MAX_PARAMS_VALUES, refused before it is
    read further, naming the size or the key that holds them."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ParamsError(f"parameter file {str(path)!r} {what}")
    if (size := path.stat().st_size) > MAX_PARAMS_BYTES:
        raise ParamsError(f"{path}: the file is {size / (1 << 20):.1f} MiB; allowed: a parameter file of at most "
                          f"{MAX_PARAMS_BYTES >> 20} MiB (the default params.yaml is 12 KiB)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ParamsError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and (problem := _too_many_values(node)):
            raise ParamsError(f"{path}: {problem}")
        params = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {_yaml_problem(err)}") from None
    except RecursionError:
        raise ParamsError(f"{path}: not valid parameters: nested too deep (lists or mappings inside each other "
                          "thousands of levels down)") from None
    finally:
        loader.dispose()
    return params


def _too_many_values(root: yaml.Node) -> str | None:
    """Where a composed YAML document holds over MAX_PARAMS_VALUES values with its aliases expanded (each alias counts
    what it stands for, as every reader sees it): the key that holds them, descending through mappings while one
    key holds more than the limit; None when the document is within it. Counted once per distinct node (aliases
    share theirs), so a bomb of 10^9 values is counted in microseconds."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:  # an anchor that contains an alias of itself: infinitely many values
            return math.inf
        open_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in node.value)
        else:
            total = 1
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    if size(root) <= MAX_PARAMS_VALUES:
        return None
    node, path = root, []
    while isinstance(node, yaml.MappingNode):
        biggest = max(node.value, key=lambda kv: size(kv[1]))
        if size(biggest[1]) <= MAX_PARAMS_VALUES or not isinstance(biggest[0], yaml.ScalarNode):
            break
        path.append(biggest[0].value)
        node = biggest[1]
    held = size(node)
    count = f"{held:,} values" if held != math.inf else "an unbounded number of values (an anchor inside itself)"
    aliased = " with its YAML aliases (*name) expanded" if _has_alias(node) else ""
    return (f"{_key(path)}: holds {count}{aliased}; allowed: at most {MAX_PARAMS_VALUES:,} values in a parameter file "
            "(the default params.yaml has under 400; a seed list, e.g. sweep.seeds, names a few seeds)")


def _has_alias(root) -> bool:
    """Whether a composed node shares a node with another place (YAML anchors and aliases)."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            return True
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            todo += [n for kv in node.value for n in kv]
        elif isinstance(node, yaml.SequenceNode):
            todo += node.value
    return False


def validate_params(params, source: str = "params.yaml", studies: bool = True) -> dict:
    """Schema first (types, names, ranges), then the checks a schema cannot express: this module's, then each
    registered study's (``studies.checks.CHECKS``: functions of params giving (key, message) pairs), all in one
    message. Returns ``params``."""
    if not isinstance(params, dict):
        got = "an empty file" if params is None else f"a {type(params).__name__} ({params!r:.40})"
        raise ParamsError(f"{source}: expected a mapping of sections at the top level (device: ..., sweep: ...), got {got}")
    # JSON Schema's bounds compare false with NaN (neither below a minimum nor above a maximum): refused here, first
    if nonfinite := _non_finite(params):
        (path, value), rest = nonfinite[0], nonfinite[1:]
        key, rest = _key(path), [(_key(p), v) for p, v in rest]
        raise ParamsError(f"{source}: {key}: {value} is not a finite number; allowed: {_allowed_at(path)}"
                          f"{_and_more([k for k, _ in rest])}")
    errors = sorted(_VALIDATOR(schema()).iter_errors(params), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise ParamsError(f"{source}: {_describe(best)}{_and_more([_key(e.absolute_path) for e in errors if e is not best])}")
    # the studies' checks import torch (seconds): after the schema, so that a malformed file is refused at once
    from .studies.checks import CHECKS  # the plans: this level, and they never import this module
    problems = _cross_field_problems(params) + [problem for check in (CHECKS if studies else ()) for problem in check(params)]
    if problems:
        (key, message), rest = problems[0], problems[1:]
        raise ParamsError(f"{source}: {key}: {message}{_and_more([k for k, _ in rest])}")
    return params


# JSON Schema counts 32.0 as an integer; in a YAML file a float where a count belongs is a typo, and the model code
# would reject it only once a job runs. Booleans are already not integers in JSON Schema.
_VALIDATOR = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    ),
)


def _non_finite(value, path=()) -> list[tuple[tuple, float]]:
    """(key path, value) of every NaN or infinity in the parameters (YAML's .nan, .inf), at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return [(path, value)]
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _non_finite(v, (*path, k))]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in _non_finite(v, (*path, i))]
    return []


def _allowed_at(path: tuple) -> str:
    """What the schema allows at a key path, in words ('a number > 0 and <= 1'), finite in any case."""
    node, root = schema(), schema()
    for part in path:
        if "$ref" in node:
            node = {**root["$defs"][node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
        if isinstance(part, int):
            node = node.get("items", {}) if isinstance(node.get("items"), dict) else {}
        else:
            extra = node.get("additionalProperties")
            node = node.get("properties", {}).get(part) or (extra if isinstance(extra, dict) else {})
    words = _allowed(node) if node else "a number"
    return words if words != "a value" else "a finite number"


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML silently keeps the last of two equal keys, so a repeated section would drop the first one unseen.
    libyaml's parser where PyYAML has it (a 2 MiB file composed in a fraction of a second, not half a minute)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # unhashable keys: PyYAML's own error follows
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (each key may appear once per mapping)", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's messages span several lines with a source excerpt; keep the line, column and problem."""
    mark = getattr(err, "problem_mark", None)
    problem = " ".join(filter(None, [getattr(err, "context", None), getattr(err, "problem", None)])) or str(err)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}".split())


def _and_more(keys: list[str]) -> str:
    if not keys:
        return ""
    shown = ", ".join(dict.fromkeys(keys[:5]))
    return f" (and {len(keys)} more problem(s): {shown}{', ...' if len(keys) > 5 else ''})"


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
_KINDS = {"integer": "an integer", "number": "a number", "boolean": "true or false", "string": "a string",
          "array": "a list", "object": "a mapping"}


def _allowed(sub: dict) -> str:
    """What a (sub)schema accepts, in words: 'an integer >= 1', "one of ['post', 'pre']", 'a list of ...'."""
    if "$ref" in sub:  # only local "#/$defs/name" references occur in params.schema.yaml
        sub = {**schema()["$defs"][sub["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in sub.items() if k != "$ref"}}
    if "enum" in sub:
        return f"one of {sub['enum']}"
    kind = sub.get("type")
    words = _KINDS.get(kind, "a value")
    if kind == "array" and isinstance(sub.get("items"), dict):
        words = f"a list, each entry {_allowed(sub['items'])}"
        if "minItems" in sub:
            words = f"{words}, at least {sub['minItems']} entries"
        if "maxItems" in sub:
            words = f"{words}, at most {sub['maxItems']:,} entries"
    elif kind == "object" and sub.get("properties"):
        words = f"a mapping with keys {sorted(sub['properties'])}"
    elif kind == "string" and sub.get("minLength"):
        words = "a non-empty string"
    bounds = [f"{_BOUNDS[k]} {sub[k]}" for k in _BOUNDS if k in sub]
    return " ".join([words, " and ".join(bounds)]).strip()


def _describe(error: jsonschema.ValidationError) -> str:
    key = _key(error.absolute_path)
    rule, expected, value = error.validator, error.validator_value, error.instance
    if rule == "additionalProperties" and expected is False:
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(value) - set(allowed))
        return f"{key}: unknown key(s) {extra}; allowed keys: {allowed}"
    if rule == "required":
        missing = [k for k in expected if k not in value]
        return f"{key}: missing required key(s) {missing}; required keys: {list(expected)}"
    if rule == "enum":
        return f"{key}: {value!r} is not allowed; allowed values: {list(expected)}"
    if rule == "type":
        hint = ""
        if isinstance(value, str) and expected in ("number", "integer") and _looks_numeric(value):
            hint = f" (YAML reads {value} as text: write numbers with a dot and a signed exponent, e.g. 1.0e-3)"
        return f"{key}: {value!r} has the wrong type; allowed: {_allowed(error.schema)}{hint}"
    if rule in _BOUNDS:
        return f"{key}: {value!r} is out of range; allowed: {_allowed(error.schema)}"
    if rule in ("minItems", "minProperties"):
        return f"{key}: has {len(value)} entries; allowed: at least {expected}"
    if rule in ("maxItems", "maxProperties"):
        return f"{key}: has {len(value):,} entries; allowed: at most {expected:,}"
    if rule == "minLength":
        return f"{key}: {value!r} is too short; allowed: {_allowed(error.schema)}"
    if rule == "uniqueItems":
        repeated = sorted({repr(v) for i, v in enumerate(value) if v in value[:i]})
        return f"{key}: entries must be distinct; repeated: {', '.join(repeated)}"
    if error.context:  # anyOf/oneOf: say which alternative came closest, then what each alternative allows
        closest = jsonschema.exceptions.best_match(error.context)
        options = " | ".join(_allowed(s) for s in expected) if isinstance(expected, list) else ""
        return f"{_describe(closest)}" + (f"; allowed at {key}: {options}" if options else "")
    return f"{key}: {error.message}; allowed: {_allowed(error.schema)}"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _divides(params, section) -> list[tuple[str, str]]:
    d, heads = params[section]["d_model"], params[section]["n_heads"]
    if d % heads:
        divisors = [k for k in range(1, d + 1) if d % k == 0]
        return [(f"{section}.n_heads", f"{heads} does not divide {section}.d_model={d}; allowed: a divisor of {d} {divisors}")]
    return []


def _cross_field_problems(params) -> list[tuple[str, str]]:
    problems = _divides(params, "copy_model") + _divides(params, "activation_norms") + _divides(params, "reverse_copy")
    model = params["copy_model"]
    if model["position"] == "rope" and not model["d_model"] % model["n_heads"] and (model["d_model"] // model["n_heads"]) % 2:
        problems.append(("copy_model.position", "'rope' needs an even head dimension d_model/n_heads="
                         f"{model['d_model'] // model['n_heads']}; allowed: another position or an even head dimension"))
    counts = params["param_counts"]
    for i, d in enumerate(counts["d_models"]):
        if d % counts["n_heads"]:
            problems.append((f"param_counts.d_models[{i}]", f"{d} is not divisible by param_counts.n_heads={counts['n_heads']}; "
                             f"allowed: a multiple of {counts['n_heads']}"))
    steps = params["sweep"]["steps"]
    for i, warmup in enumerate(params["sweep"]["warmups"]):
        if warmup > steps:
            problems.append((f"sweep.warmups[{i}]", f"{warmup} is longer than training (sweep.steps={steps}); allowed: 0..{steps}"))
    if params["sweep"]["checkpoint_every"] > steps:
        problems.append(("sweep.checkpoint_every", f"{params['sweep']['checkpoint_every']} exceeds sweep.steps={steps}; allowed: 1..{steps}"))
    sim = params["residual_sim"]
    for i, blocks in enumerate(sim["report_blocks"]):
        if blocks > sim["max_blocks"]:
            problems.append((f"residual_sim.report_blocks[{i}]",
                             f"{blocks} exceeds residual_sim.max_blocks={sim['max_blocks']}; allowed: 1..{sim['max_blocks']}"))
    p9 = params["problem9"]
    for student, scores in p9["scores"].items():
        if len(scores) != len(p9["subjects"]):
            problems.append((f"problem9.scores.{student}", f"has {len(scores)} scores for {len(p9['subjects'])} subjects; "
                             f"allowed: exactly one score per subject in problem9.subjects {p9['subjects']}"))
    rc = params["reverse_copy"]
    if any(v in ("rope", "modern") for v in rc["variants"]) and not rc["d_model"] % rc["n_heads"] \
            and (rc["d_model"] // rc["n_heads"]) % 2:
        problems.append(("reverse_copy.n_heads", f"the variants 'rope' and 'modern' need an even head dimension, got "
                         f"d_model/n_heads={rc['d_model'] // rc['n_heads']}; allowed: n_heads giving an even d_model/n_heads"))
    problems += _cost_problems(params)
    probe_model = params["probe"]["model"]
    if probe_model != SMOLLM2 and not Path(probe_model).is_dir():
        problems.append(("probe.model", f"{probe_model!r} is not a directory; allowed: {SMOLLM2!r} or a Hugging Face checkpoint directory"))
    return problems


# ---- what a configuration costs, before any job: memory and time of one training job ---------------------------------
# A width or depth that does not fit would be killed by the kernel (exit 137, an empty log) or end in an allocation
# traceback after the DAG has started; a step count of years would train on. The estimate is deliberately simple and
# on the generous side (fp32 weights, gradients and Adam's two moments; the activations autograd keeps, attention
# scores included; the logits with their log-softmax and gradients; a fixed allowance for the runtime; checked against
# the peak a real training step measures in tests/test_faults_io.py), and the limits are the process's: the machine's
# memory, or the smallest limit of the process's own memory cgroup and those above it (/proc/self/cgroup, v1 or v2),
# where smaller, and a year of compute at a rate no CPU of 2026 reaches, so no configuration that can run is refused.
RUNTIME_BYTES = 1 << 30          # torch itself, the data, the diagnostics: an allowance
FLOPS_CEILING = 1e13             # floating-point operations a second: above any CPU (the H200's fp32 is ~6e13)
STEP_OVERHEAD_S = 1e-4          # a training step of any size takes longer in PyTorch (dispatch, optimizer, data)
MAX_SECONDS = 365 * 24 * 3600


# Where the memory limits are: the cgroup file system and this process's own cgroups (module-level, so that a test can
# point them at a tree of its own).
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def _cgroup_levels(mount: Path, path: str):
    """``mount``/``path`` and every folder above it up to ``mount`` itself: the cgroup and its ancestors."""
    level = mount.joinpath(*[part for part in path.split("/") if part and part not in (".", "..")])
    while True:
        yield level
        if level == mount:
            return
        level = level.parent


def _v1_memory_mounts(root: Path, controllers: str) -> list[Path]:
    """Where cgroup v1's memory controller is mounted under ``root``: ``memory``, or a folder of joint controllers."""
    found = [root / "memory", root / controllers]
    try:
        found += sorted(p for p in root.iterdir() if "memory" in p.name.split(","))
    except OSError:
        pass
    return [p for p in dict.fromkeys(found) if p.is_dir()]


def cgroup_memory_limit(root: str | Path | None = None, self_cgroup: str | Path | None = None) -> tuple[int, Path] | None:
    """(bytes, the file that says so) of the smallest memory limit on this process: its own cgroup's (read from
    ``self_cgroup``, /proc/self/cgroup) or one above it, cgroup v2 (``memory.max``) or v1 (``memory.limit_in_bytes``),
    under ``root`` (/sys/fs/cgroup); None where no limit is set (``max``, or no cgroup file system)."""
    root = Path(CGROUP_ROOT if root is None else root)
    try:
        lines = Path(PROC_SELF_CGROUP if self_cgroup is None else self_cgroup).read_text().splitlines()
    except OSError:
        lines = []
    places: list[tuple[Path, str, str]] = []  # (the controller's mount, the cgroup's path in it, the limit's file)
    for line in lines:
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: one hierarchy, every controller
            places.append((root, path, "memory.max"))
        elif "memory" in controllers.split(","):
            places += [(mount, path, "memory.limit_in_bytes") for mount in _v1_memory_mounts(root, controllers)]
    if not places:  # no /proc/self/cgroup: the roots' own files, where there are any
        places = [(root, "/", "memory.max"), (root / "memory", "/", "memory.limit_in_bytes")]
    smallest = None
    for mount, path, name in places:
        for level in _cgroup_levels(mount, path):
            try:
                text = (level / name).read_text().strip()
            except OSError:
                continue  # not this level (a container sees its own cgroup at the mount's root)
            if text.isdigit() and (smallest is None or int(text) < smallest[0]):
                smallest = (int(text), level / name)
    return smallest


def memory_limit() -> tuple[int, str]:
    """(bytes of memory this process may use, where that number comes from): physical memory, or the smallest limit
    of its cgroup and the cgroups above it where smaller."""
    import os

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = cgroup_memory_limit()
    if limit is not None and limit[0] < total:
        return limit[0], f"the limit of this process's memory cgroup ({limit[1]})"
    return total, "this machine's memory"


def machine_memory() -> int:
    """Bytes of memory this process may use: physical memory, or its cgroup's limit where smaller."""
    return memory_limit()[0]


def training_cost(model: dict, task: dict, steps: int) -> tuple[int, float, int]:
    """(bytes, seconds at FLOPS_CEILING, ffn width) of one copy-task training job with ``model`` and ``task``."""
    d, layers, vocab = model["d_model"], model["n_layers"], task["vocab_size"]
    ffn = round(model["ffn_ratio"] * d)
    gated = model.get("ffn_kind") == "swiglu"
    tokens, positions = task["batch_size"] * 2 * task["seq_len"], 2 * task["seq_len"]
    per_layer = 4 * d * d + 4 * d + (3 if gated else 2) * d * ffn + ffn + d + 4 * d
    weights = layers * per_layer + 2 * vocab * d + positions * d
    # kept for backward, per layer: ~12 values of width d a token (norms, q k v, attention out, residuals), 2-3 of the
    # MLP's width, and the scores and their softmax (batch x heads x positions^2, twice)
    activations = layers * (tokens * (12 * d + (3 if gated else 2) * ffn)
                            + 2 * task["batch_size"] * model["n_heads"] * positions * positions)
    # the logits, tokens x vocabulary, three times at once in the backward pass: their log-softmax (kept for backward),
    # its gradient and the logits' gradient; at a large vocabulary they are most of the job
    logits = 3 * tokens * vocab
    memory = 4 * (4 * weights + activations + logits) + RUNTIME_BYTES
    flops = 6.0 * weights * tokens + 12.0 * layers * task["batch_size"] * positions * positions * d
    return memory, steps * (flops / FLOPS_CEILING + STEP_OVERHEAD_S), ffn


def _cost_keys(model: dict, task: dict):
    """(key, section, name, value) of every size the memory estimate grows with."""
    yield from (("copy_task.vocab_size", "task", "vocab_size", task["vocab_size"]),
                ("copy_model.d_model", "model", "d_model", model["d_model"]),
                ("copy_model.n_layers", "model", "n_layers", model["n_layers"]),
                ("copy_task.batch_size", "task", "batch_size", task["batch_size"]),
                ("copy_task.seq_len", "task", "seq_len", task["seq_len"]))


def _largest_fitting(model: dict, task: dict, section: str, name: str, available: int) -> int:
    """The largest value >= 1 of ``section``'s ``name`` (others unchanged) whose training job fits in ``available``
    bytes; 0 where even 1 does not. Bisection: the estimate grows with every one of these sizes."""
    def fits(value: int) -> bool:
        changed = ({**model, name: value}, task) if section == "model" else (model, {**task, name: value})
        return training_cost(*changed, 1)[0] <= available

    low, high = 0, (model if section == "model" else task)[name]
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    if section == "model" and name == "d_model" and low:  # a width the heads divide
        low -= low % model["n_heads"]
    return low


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _cost_problems(params) -> list[tuple[str, str]]:
    model, task, sweep = params["copy_model"], params["copy_task"], params["sweep"]
    memory, seconds, ffn = training_cost(model, task, sweep["steps"])
    problems = []
    if ffn < 1:
        problems.append(("copy_model.ffn_ratio", f"{model['ffn_ratio']} gives an MLP of width round({model['ffn_ratio']} x "
                         f"{model['d_model']}) = {ffn}; allowed: a ratio giving a width of at least 1 "
                         f"(>= {0.5 / model['d_model']:.3g} at d_model={model['d_model']})"))
    available, where = memory_limit()
    if memory > available:
        # the keys one of which, changed alone, brings the estimate within the machine, each at its largest value that
        # fits; the key blamed is the one that must shrink least (by factor): the one that drives the estimate
        fits = [(key, value, largest) for key, value, largest in
                ((key, value, _largest_fitting(model, task, section, name, available))
                 for key, section, name, value in _cost_keys(model, task)) if largest]
        fits.sort(key=lambda fit: fit[1] / fit[2])
        key = fits[0][0] if fits else "copy_model.d_model"
        advice = (" or ".join(f"{k} <= {largest:,} (now {value:,})" for k, value, largest in fits[:3]) + ", the others "
                  "as they are") if fits else "smaller values of copy_model.d_model, n_layers and copy_task's sizes together"
        problems.append((key, f"one training job needs an estimated {_gib(memory)} (copy_task.vocab_size="
                         f"{task['vocab_size']:,}, copy_model.d_model={model['d_model']:,}, n_layers={model['n_layers']:,}, "
                         f"batch {task['batch_size']:,} x {2 * task['seq_len']:,} tokens: weights, Adam, activations and logits) "
                         f"and this process may use {_gib(available)}, {where}; allowed: a configuration whose estimate fits, here {advice}"))
    if seconds > MAX_SECONDS:
        problems.append(("sweep.steps", f"{sweep['steps']} steps need an estimated {seconds / 86400:,.0f} days a run "
                         f"even at {FLOPS_CEILING:.0e} floating-point operations a second and {STEP_OVERHEAD_S * 1e6:.0f} µs a step; allowed: a step count "
                         f"under a year at that rate (<= {int(sweep['steps'] * MAX_SECONDS / seconds):,})"))
    return problems
