"""What a lab run trains: the profile's setup, the block and the stack around it, decided and checked before any run.

A lab spec is a small JSON file (``spec.json`` in the lab's output folder): the Snakemake jobs read it, so every run of
one lab trains the same block at the same setup, and a changed spec retrains (it is an input of every job).
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..model_config import NORM_POSITIONS, NORM_POSITION_SPECS, ConfigError, ModelConfig
from ..model.layers import LearnedPosition, make_norm
from ..params_file import load_params
from ..run_settings import CopyModel, CopyTask, Sweep
from ..records import SENSITIVITY

PROFILES = ("document", "quick", "lr-sweep", "tiny")
PROFILE_TRADES = {
    "document": "nothing: document 000's setup as params.yaml holds it (24 blocks, d 128, 4 heads, lr 1e-3, the default"
                " batch, 1,200 steps, warm-ups and seeds of the sweep)",
    "quick": "batch 16 instead of the default and 400 steps instead of 1,200, no warm-up arm, seeds 0 and 1: whether "
             "the block starts at all at 24 blocks and lr 1e-3 (in the recorded batch-16 runs without warm-up, seed 0, "
             "pre-norm fell below a tenth of chance at step 166 and post-norm stayed at chance for 1,200 steps: "
             f"{SENSITIVITY}/choices), in about 10 min a run on an idle core; it cannot see a collapse after "
             "warm-up, nor compare with the recorded default runs",
    "lr-sweep": "batch 16 instead of the default and 300 steps instead of 1,200, no warm-up arm, seeds 0-2: the "
                "document's depth, width and heads, short enough that a block's learning-rate sensitivity (five "
                "learning rates x three seeds, `--lr-sweep`) fits an afternoon; it cannot see a collapse after "
                "warm-up, and its final loss after 300 steps is not the document's after 1,200",
    "tiny": "2 blocks of width 16, 12 steps: the code path only (tests); it measures nothing about stability",
}


@dataclass(frozen=True)
class Setup:
    """The copy task and the stack's size and training, one profile's values."""

    n_layers: int
    d_model: int
    n_heads: int
    ffn_ratio: float
    vocab_size: int
    seq_len: int
    batch_size: int
    lr: float
    steps: int
    warmups: tuple[int, ...]
    seeds: tuple[int, ...]
    checkpoint_every: int
    position: str = "learned"


def profile_setup(params: dict, profile: str, seeds=None, warmups=None) -> Setup:
    """The profile's setup from params.yaml; ``seeds``/``warmups`` replace the profile's lists."""
    if profile not in PROFILES:
        raise ConfigError(f"--profile {profile!r} is not allowed; choose one of {list(PROFILES)}")
    model, task, sweep = CopyModel.from_params(params), CopyTask.from_params(params), Sweep.from_params(params)
    base = dict(n_layers=model.n_layers, d_model=model.d_model, n_heads=model.n_heads, ffn_ratio=float(model.ffn_ratio),
                vocab_size=task.vocab_size, seq_len=task.seq_len, batch_size=task.batch_size, lr=sweep.lr,
                steps=sweep.steps, warmups=tuple(sweep.warmups), seeds=tuple(sweep.seeds),
                checkpoint_every=sweep.checkpoint_every, position=model.position)
    if profile == "quick":
        base.update(batch_size=16, steps=400, warmups=(0,), seeds=(0, 1), checkpoint_every=100)
    elif profile == "lr-sweep":
        base.update(batch_size=16, steps=300, warmups=(0,), seeds=(0, 1, 2), checkpoint_every=50)
    elif profile == "tiny":
        base.update(n_layers=2, d_model=16, n_heads=2, seq_len=8, batch_size=4, steps=12, warmups=(0, 4), seeds=(0,),
                    checkpoint_every=5)
    if seeds is not None:
        base["seeds"] = tuple(seeds)
    if warmups is not None:
        base["warmups"] = tuple(warmups)
    setup = Setup(**base)
    bad = [s for s in setup.seeds if not isinstance(s, int) or s < 0]
    if bad or not setup.seeds or len(set(setup.seeds)) != len(setup.seeds):
        raise ConfigError(f"--seeds {list(setup.seeds)}: give distinct integers >= 0")
    bad = [w for w in setup.warmups if not isinstance(w, int) or not 0 <= w <= setup.steps]
    if bad or not setup.warmups or len(set(setup.warmups)) != len(setup.warmups):
        raise ConfigError(f"--warmups {list(setup.warmups)}: give distinct integers in 0..{setup.steps} (the profile's"
                          " steps)")
    return setup


@dataclass
class Block:
    """Where the block comes from: ``kind`` builtin (a norm position's name), module (--module), hf (--hf-config)."""

    kind: str
    source: str
    kwargs: dict = field(default_factory=dict)
    search_path: str | None = None  # the folder a --module was named from: its jobs import it from there
    # a user's block or a transformers stack: the sha256 of its source (the file, what it imports from the user's
    # folder) and of its weights at init (``block_digest``); in every run's identity, so that an edited block retrains
    # and none of its checkpoints is resumed by another source. None for a built-in (the project's code version)
    digest: str | None = None

    def as_dict(self) -> dict:
        """The block as spec.json and the runs' identity hold it (a built-in's without the digest it has not)."""
        out = asdict(self)
        if out["digest"] is None:
            out.pop("digest")
        return out

    @property
    def label(self) -> str:
        return self.source.rpartition(":")[2] if self.kind == "module" else self.source


@dataclass
class Spec:
    block: Block
    profile: str
    setup: Setup
    params_sha256: str
    read: dict = field(default_factory=dict)  # what the reviewer read of the block, the final norm used

    def to_json(self) -> str:
        return json.dumps({"block": self.block.as_dict(), "profile": self.profile, "setup": asdict(self.setup),
                           "params_sha256": self.params_sha256, "read": self.read}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_file(cls, path) -> "Spec":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        setup = data["setup"]
        setup = Setup(**{**setup, "warmups": tuple(setup["warmups"]), "seeds": tuple(setup["seeds"])})
        return cls(Block(**data["block"]), data["profile"], setup, data["params_sha256"], data.get("read", {}))

    def run_name(self, warmup: int, seed: int) -> str:
        return f"w{warmup}-s{seed}"

    def runs(self) -> list[tuple[int, int]]:
        return [(w, s) for w in self.setup.warmups for s in self.setup.seeds]


def params_for(params: dict, setup: Setup) -> dict:
    """params.yaml with the profile's setup in its sections (what a built-in block's run trains: the sweep's own path)
    and the diagnostics off (an execution setting: the losses are the same with them)."""
    out = json.loads(json.dumps(params))
    out["copy_model"].update(n_layers=setup.n_layers, d_model=setup.d_model, n_heads=setup.n_heads,
                             ffn_ratio=setup.ffn_ratio, position=setup.position)
    out["copy_task"].update(vocab_size=setup.vocab_size, seq_len=setup.seq_len, batch_size=setup.batch_size)
    out["sweep"].update(steps=setup.steps, lr=setup.lr, warmups=list(setup.warmups), seeds=list(setup.seeds),
                        checkpoint_every=setup.checkpoint_every)
    out.setdefault("diagnostics", {})["enabled"] = False
    return out


def model_config(setup: Setup, norm: str = "pre") -> ModelConfig:
    return ModelConfig(d_model=setup.d_model, n_heads=setup.n_heads, n_layers=setup.n_layers, ffn_kind="gelu",
                       ffn_ratio=setup.ffn_ratio, norm_kind="layernorm", norm_position=norm, position=setup.position,
                       vocab_size=setup.vocab_size, max_len=2 * setup.seq_len)


# --- the stack around a user's block --------------------------------------------------------------------------------


class CallBlock(nn.Module):
    """A user's block called as the copy task needs it: (batch, time, d) in and out, with the caller-side causal mask
    its forward takes (the reviewer's finding), a tuple output's first element, torch's sequence-first layout."""

    def __init__(self, block: nn.Module, mask: str | None, seq_first: bool):
        super().__init__()
        self.block, self.mask, self.seq_first = block, mask, seq_first

    def forward(self, h):
        kwargs = {}
        if self.mask:
            t = h.shape[-2]
            causal = torch.triu(torch.full((t, t), float("-inf"), dtype=h.dtype, device=h.device), diagonal=1)
            kwargs = {self.mask: causal}
            if self.mask == "src_mask" and "is_causal" in _forward_params(self.block):
                kwargs["is_causal"] = True
        x = h.transpose(0, 1) if self.seq_first else h
        out = self.block(x, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.transpose(0, 1) if self.seq_first else out


def _forward_params(module) -> list[str]:
    import inspect

    try:
        return list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return []


class BlockStack(nn.Module):
    """The copy-task LM of document 000 around any block: token embedding and learned positions, ``n_layers`` copies
    of the block, a final norm where the block leaves the stream un-normalised (as read by the reviewer), the head."""

    def __init__(self, cfg: ModelConfig, make_block, final_norm: bool, norm_class: str | None = None):
        """``norm_class``: the class name of the block's own RMSNorm (``read_block``'s ``final_norm_class``), whose
        copy, as the block holds it at init, is the final norm (Llama's stack ends in its RMSNorm); else LayerNorm."""
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = LearnedPosition(cfg)
        self.blocks = nn.ModuleList(make_block() for _ in range(cfg.n_layers))
        own = next((m for m in self.blocks[0].modules() if type(m).__name__ == norm_class), None) if norm_class else None
        if final_norm and norm_class and own is None:
            raise ConfigError(f"the block holds no {norm_class} to end the stack with")
        self.norm = (copy.deepcopy(own) if own is not None else make_norm(cfg)) if final_norm else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.position(self.embed(tokens))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class HFStack(nn.Module):
    """A Hugging Face causal LM built from its config at the copy task's size: its own embeddings, position signal,
    decoder layers, final norm and head."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @property
    def blocks(self) -> nn.ModuleList:
        """The decoder layers (the model's longest ModuleList), not registered twice."""
        return _hf_layers(self.model)

    def forward(self, tokens):
        return self.model(input_ids=tokens, use_cache=False).logits


def _hf_layers(model) -> nn.ModuleList:
    stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return max(stacks, key=len) if stacks else nn.ModuleList()


def hf_config(model_type: str, setup: Setup):
    """A Hugging Face config of ``model_type`` at the copy task's size (width, heads, depth, FFN 4x, vocabulary)."""
    from ..review.hf import load_config

    config = load_config(model_type)
    values = {"hidden_size": setup.d_model, "num_attention_heads": setup.n_heads, "num_key_value_heads": setup.n_heads,
              "head_dim": setup.d_model // setup.n_heads, "intermediate_size": round(setup.ffn_ratio * setup.d_model),
              "num_hidden_layers": setup.n_layers, "vocab_size": setup.vocab_size,
              "max_position_embeddings": max(2 * setup.seq_len, 64), "n_positions": max(2 * setup.seq_len, 64),
              "tie_word_embeddings": False, "use_cache": False, "layer_types": None}
    for key, value in values.items():
        if key in ("head_dim", "n_positions", "layer_types") and not hasattr(config, key):
            continue
        setattr(config, key, value)
    if hasattr(config, "n_inner"):
        config.n_inner = round(setup.ffn_ratio * setup.d_model)
    for key in list(vars(config)):
        if any(w in key for w in ("dropout", "pdrop")) and isinstance(getattr(config, key), float):
            setattr(config, key, 0.0)
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"--hf-config {model_type}: an encoder-decoder; the copy task trains a decoder-only stack")
    return config


def build_model(spec: Spec, seed: int) -> nn.Module:
    """The run's model at initialization (the same seed always gives the same weights)."""
    setup, block = spec.setup, spec.block
    if block.kind == "builtin":
        from ..training.copy_model import build_copy_model

        return build_copy_model(model_config(setup, block.source), seed)
    torch.manual_seed(seed)
    if block.kind == "hf":
        from transformers import AutoModelForCausalLM

        config = hf_config(block.source, setup)
        return HFStack(AutoModelForCausalLM.from_config(config, attn_implementation="eager"))
    from ..review.build import Builder

    builder = Builder(load_target(block.source, block.search_path), block.kwargs)
    read = spec.read
    return BlockStack(model_config(setup), lambda: CallBlock(builder.build(setup.d_model), read.get("mask"),
                                                              bool(read.get("seq_first"))),
                      bool(read.get("final_norm")), read.get("final_norm_class"))


def params_sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def builtin_read(name: str) -> dict:
    position = NORM_POSITION_SPECS[name]
    return {"norm_placement": name, "final_norm": position.final_norm, "formula": position.formula,
            "paper": position.paper, "how": f"built-in norm position {name!r} (blocklab.model.blocks)"}


def make_spec(params_path, profile: str, builtin: str | None = None, module: str | None = None,
              hf: str | None = None, kwargs: dict | None = None, seeds=None, warmups=None) -> Spec:
    """Everything checked before any run: the profile, the block's source, and (``check_block``) that it builds and
    keeps the shape."""
    chosen = [x for x in (builtin, module, hf) if x]
    if len(chosen) != 1:
        raise ConfigError("give exactly one block: a built-in name (one of "
                          f"{list(NORM_POSITIONS)}), --module FILE.py:Class or package.module:Class, or --hf-config"
                          " MODEL_TYPE")
    params = load_params(params_path, studies=False)
    setup = profile_setup(params, profile, seeds, warmups)
    if builtin:
        if builtin not in NORM_POSITIONS:
            raise ConfigError(f"block {builtin!r} is not a built-in norm position; choose one of {list(NORM_POSITIONS)}"
                              ", or --module / --hf-config")
        block, read = Block("builtin", builtin), builtin_read(builtin)
    elif module:
        source, search = module_source(module)
        target = load_target(source, search)
        from ..review.architecture import hf_layer_class, model_type_of

        if hf_layer_class(target):  # built inside its own model from its config, as `blocklab review --module` does
            if kwargs:
                raise ConfigError(f"--kwargs: {module} is a transformers layer class, built from its model's config "
                                  "at the copy task's size (as --hf-config); it takes no constructor arguments here")
            model_type = model_type_of(target)
            block = Block("hf", model_type)
            read = {**read_hf(block, setup), "layer_class": target.__name__,
                    "how": f"{module}: a transformers layer class, built inside its own {model_type} causal LM from "
                           f"its config at the copy task's size (as `blocklab review --module` does; the same stack "
                           f"as --hf-config {model_type})"}
            return Spec(block, profile, setup, params_sha256(params_path), read)
        chosen = with_heads(target, dict(kwargs or {}), setup.n_heads)
        chosen, depth = with_depth(target, chosen, setup.n_layers)
        keeps_shape(target, chosen, setup, source)
        block = Block("module", source, chosen, search)
        read = read_block(block, setup)
        if depth:
            read["depth"] = (f"{depth}={chosen[depth]} passed to the constructor"
                             + (" (from --kwargs)" if depth in (kwargs or {}) else " (the stack's depth)"))
        unpassed = depth_not_passed(target, chosen)
        if unpassed:
            read["depth_not_passed"] = (
                f"{', '.join(unpassed)} not passed: the lab passes the stack's depth ({setup.n_layers}) only as one of"
                f" {', '.join(DEPTH_NAMES)}; if {'it is' if len(unpassed) == 1 else 'one is'} the depth, give it: "
                f"--kwargs '{json.dumps({unpassed[0]: setup.n_layers})}'")
    else:
        block = Block("hf", hf)
        read = read_hf(block, setup)
    return Spec(block, profile, setup, params_sha256(params_path), read)


# --- a user's block: where it is, what the reviewer reads of it -----------------------------------------------------


def _local_module(name: str, folder: Path) -> list[Path]:
    """The files of the user's folder that importing ``name`` (dotted) from ``folder`` reads: each package's
    __init__.py on the way and the module itself; [] when it is not there (an installed library's)."""
    found, here = [], folder
    for part in name.split("."):
        if (here / part / "__init__.py").is_file():
            here = here / part
            found.append(here / "__init__.py")
        elif (here / f"{part}.py").is_file():
            found.append(here / f"{part}.py")
            break
        else:
            break
    return found


def source_files(block: Block) -> list[Path]:
    """The block's source: the file its class is defined in and, read from the import statements (not from what this
    process happens to hold imported), every module it imports from the user's folder (``search_path``, or the file's
    own folder for a relative import), transitively. Sorted, each once."""
    import ast
    import inspect
    import sys

    target = load_target(block.source, block.search_path)
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    own = getattr(module, "__file__", None) or (inspect.getsourcefile(target) if inspect.isclass(target) else None)
    if not own:
        return []
    root = Path(block.search_path).resolve() if block.search_path else Path(own).resolve().parent
    todo, seen = [Path(own).resolve()], set()
    while todo:
        path = todo.pop()
        if path in seen or path.suffix != ".py" or not path.is_file():
            continue
        seen.add(path)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    todo += _local_module(alias.name, root)
            elif isinstance(node, ast.ImportFrom):
                base = root
                if node.level:
                    base = path.parent
                    for _ in range(node.level - 1):
                        base = base.parent
                names = [f"{node.module}.{a.name}" if node.module else a.name for a in node.names]
                todo += [f for n in ([node.module] if node.module else []) + names for f in _local_module(n, base)]
    return sorted(seen)


def weights_sha256(model: nn.Module) -> str:
    """The sha256 of a model's parameters and buffers (names, dtypes, shapes, bytes)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def source_sha256(block: Block) -> dict[str, str]:
    """Each source file of the block (``source_files``; named relative to the user's folder where it lies there) and
    its sha256; for a transformers stack, the transformers version (its weights at init say the rest)."""
    if block.kind == "hf":
        import transformers

        return {"transformers": transformers.__version__}
    root = Path(block.search_path).resolve() if block.search_path else None
    out = {}
    for path in source_files(block):
        name = path.relative_to(root).as_posix() if root and root in path.parents else str(path)
        out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def block_digest(block: Block, weights: str) -> str:
    """What keys a user's block's runs: its source (``source_sha256``) and its weights at init (``weights_sha256`` of
    the stack at seed 0)."""
    text = json.dumps({"source": source_sha256(block), "weights_at_init": weights}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def check_digest(spec: Spec) -> None:
    """A job's check that the block it imports is the one the lab planned: an edit since then is a ConfigError (run
    `blocklab lab` again: it replans and retrains the edited block from step 0)."""
    if spec.block.kind == "builtin" or spec.block.digest is None:
        return
    if block_digest(spec.block, weights_sha256(build_model(spec, 0))) != spec.block.digest:
        raise ConfigError(f"{spec.block.source}: the block's source or its weights at init changed since this lab was"
                          " planned; run `blocklab lab` again (it retrains the edited block from step 0)")



def module_source(target: str) -> tuple[str, str]:
    """--module as given (``FILE.py:Class``, ``./dir/file.py:Class``, ``package.module:Class``) -> the importable
    'module:Class' and the folder it is imported from (absolute: the jobs run in the lab's output folder)."""
    name, sep, attr = target.partition(":")
    if not sep or not name or not attr:
        raise ConfigError(f"--module must look like FILE.py:Class or package.module:Class, got {target!r}")
    if name.endswith(".py") or "/" in name:
        path = Path(name).expanduser().resolve()
        if path.suffix != ".py":
            path = path.with_suffix(".py")
        if not path.is_file():
            raise ConfigError(f"--module {target!r}: no such file {path}")
        return f"{path.stem}:{attr}", str(path.parent)
    return f"{name}:{attr}", str(Path.cwd().resolve())


def load_target(source: str, search_path: str | None):
    """The class or factory ``source`` names, importing its module from ``search_path`` first."""
    import sys

    from ..review.build import resolve

    if search_path and search_path not in sys.path:
        sys.path.insert(0, search_path)
    return resolve(source)


def with_heads(obj, kwargs: dict, n_heads: int) -> dict:
    """The constructor arguments with the lab's head count, where the block takes one and the user gave none."""
    import inspect

    from ..review.build import HEAD_NAMES, TORCH_LAYERS, Builder, _first, _parameters

    builder = Builder(obj, kwargs)
    if inspect.isclass(obj) and issubclass(obj, TORCH_LAYERS):
        name = "nhead"
    elif builder.width_arg == "cfg":
        name = builder.config_heads
    elif builder.width_arg:
        name = _first(HEAD_NAMES, _parameters(obj))
    else:
        name = None
    return {name: n_heads, **kwargs} if name else kwargs


def keeps_shape(obj, kwargs: dict, setup: Setup, source: str) -> None:
    """One block, built at the lab's width and called once: a block that changes the stream's shape is named by its
    own output, before the reviewer stacks it (a second block would fail on the first one's output instead). A call
    that fails is left to the reviewer, which tries the block's mask arguments and says why."""
    from ..review.build import Builder

    module = Builder(obj, kwargs).build(setup.d_model)
    not_finite = _not_finite(module.state_dict())
    if not_finite:  # NaN reaches every position: the reviewer's causality probe would call it not causal
        raise ConfigError(f"{source}: NaN/inf in the weights at init (one block built at width {setup.d_model}): "
                          f"{not_finite}; the stack cannot train (check the block's initialisation)")
    stream = (2, 2 * setup.seq_len - 1, setup.d_model)
    try:
        with torch.no_grad():
            out = module(torch.randn(stream, generator=torch.Generator().manual_seed(0)))
    except Exception:  # noqa: BLE001 - the reviewer's calls say why
        return
    out = out[0] if isinstance(out, (tuple, list)) and out else out
    shape = tuple(getattr(out, "shape", ()))
    if shape != stream:
        raise ConfigError(f"{source} changes the stream's shape: one block maps {stream} to "
                          f"{shape or type(out).__name__} (each block must map (batch, time, d) to the same shape; "
                          f"d = {setup.d_model} here)")


# a depth-aware block (DeepNorm, Admin, B2T) takes the stack's depth under one of these names (GPT-2's n_layer,
# Hugging Face's num_hidden_layers, ...); the first the block takes is passed
DEPTH_NAMES = ("n_layers", "num_layers", "n_layer", "num_hidden_layers", "depth")
# an argument named like a depth that is none of DEPTH_NAMES: not passed, and the user is told so
DEPTH_LIKE = re.compile(r"^(n|num|number_of|total|max|stack)?_?(hidden_|transformer_|decoder_)?(layers?|blocks?|depth)$")


def with_depth(obj, kwargs: dict, n_layers: int) -> tuple[dict, str | None]:
    """The constructor arguments with the stack's depth, where the block (or its config class) takes one of
    ``DEPTH_NAMES`` and the user gave none; and that argument's name (None: it takes none)."""
    import inspect

    from ..review.build import TORCH_LAYERS, Builder, _fields, _first, _parameters

    if isinstance(obj, nn.Module) or (inspect.isclass(obj) and issubclass(obj, TORCH_LAYERS)):
        return kwargs, None
    builder = Builder(obj, kwargs)
    name = _first(DEPTH_NAMES, _fields(builder.config_class) if builder.width_arg == "cfg" else _parameters(obj))
    return ({name: n_layers, **kwargs} if name else kwargs), name


def depth_not_passed(obj, kwargs: dict) -> list[str]:
    """The block's (or its config class's) arguments named like a depth (``DEPTH_LIKE``: n_blocks, num_layer, ...)
    that are none of ``DEPTH_NAMES`` and not in ``kwargs``: the lab does not pass them (it cannot tell them from
    another count), and says so."""
    import inspect

    from ..review.build import TORCH_LAYERS, Builder, _fields, _parameters

    if isinstance(obj, nn.Module) or (inspect.isclass(obj) and issubclass(obj, TORCH_LAYERS)):
        return []
    builder = Builder(obj, kwargs)
    names = _fields(builder.config_class) if builder.width_arg == "cfg" else _parameters(obj)
    return [n for n in names if n not in DEPTH_NAMES and n not in kwargs and DEPTH_LIKE.search(n)]


def read_block(block: Block, setup: Setup) -> dict:
    """What the reviewer reads of the block at the lab's width: its norm placement (hence the stack's final norm),
    whether it needs a caller-side causal mask, whether it leaks the future with it. A block that cannot be built or
    called is a ConfigError here, before any run."""
    from ..review.build import TORCH_LAYERS, Builder
    from ..review.judge import review_module
    from ..review.probe import GENERIC_MASKS

    obj = load_target(block.source, block.search_path)
    review = review_module(obj, "decoder", d_model=setup.d_model, kwargs=block.kwargs, subject=block.source)
    structure = review.facts.get("structure", {})
    causal = review.facts.get("causal", {})
    plain, masked = causal.get("without_caller_mask", {}), causal.get("with_caller_mask")
    mask = None
    if plain.get("leaks"):
        if not masked or masked.get("leaks"):
            raise ConfigError(f"{block.source}: the block lets a position read later positions (not causal, even with"
                              " a caller-side mask): on the copy task it would read the answer")
        module = Builder(obj, block.kwargs).build(setup.d_model)
        params = _forward_params(module)
        # the argument the reviewer passed its mask in (a block's own `mask` too); CallBlock passes torch's additive
        # float mask, so a block causal only with a boolean one cannot be trained here
        mask = next((m for m in ("tgt_mask", "src_mask", "is_causal", *GENERIC_MASKS) if m in params), None)
        if masked.get("style", "additive") != "additive":
            raise ConfigError(f"{block.source}: the block is causal only with a boolean mask in {mask!r}; the lab "
                              "passes an additive float mask (0 / -inf): take one in the block")
    built = Builder(obj, block.kwargs).build(setup.d_model)
    seq_first = isinstance(built, TORCH_LAYERS) and not getattr(built.self_attn, "batch_first", True)
    # the reviewer's reading (as `blocklab review` says it): post-norm of any sum of the stream and a sub-layer
    # (DeepNorm's alpha h + F(h) included) ends normalised, so the stack gets no final norm; the residual findings
    read_rest = structure.get("reviewable") or structure.get("rest_read")
    placement = structure.get("norm_placement") if read_rest else None
    # a block whose stream leaves it just normalised needs no final norm (model_config.NormPosition.ends_normalised, for the
    # placements the reviewer names: post, pre, sandwich)
    ends_normalised = placement in NORM_POSITION_SPECS and NORM_POSITION_SPECS[placement].ends_normalised
    residual = [f.message for f in review.findings if f.check == "residual" and f.severity in ("flag", "warn")]
    norm = own_rmsnorm(built) if not ends_normalised else None
    kind = ({"final_norm_class": norm, "final_norm_kind": f"{norm}, the block's own RMSNorm (a copy as the block holds it "
             "at init), as a Llama-style stack ends"} if norm else {})
    return {**kind, "norm_placement": placement, "final_norm": not ends_normalised, "mask": mask, "seq_first": seq_first,
            "how": Builder(obj, block.kwargs).how, "reviewable": bool(structure.get("reviewable")),
            "reason": structure.get("reason"), "residual": residual,
            "post_norm": next((f.message.split("; 2026 default")[0] for f in review.findings
                               if f.check == "norm position" and f.value == "post"), None)}


def own_rmsnorm(block: nn.Module) -> str | None:
    """The class name of the RMSNorm a block normalises with (torch's nn.RMSNorm, transformers' LlamaRMSNorm, a
    hand-written RMSNorm: a class named so), where it uses no LayerNorm; None otherwise (the stack's final norm is then
    a LayerNorm, document 000's)."""
    names = [type(m).__name__ for m in block.modules() if m is not block]
    if any(isinstance(m, nn.LayerNorm) or "layernorm" in type(m).__name__.lower() for m in block.modules()):
        return None
    return next((n for n in names if "rmsnorm" in n.lower()), None)


def read_hf(block: Block, setup: Setup) -> dict:
    """A Hugging Face architecture: built at the copy task's size, its own final norm (the model's)."""
    from ..review.hf import model_types

    if block.source not in model_types():
        raise ConfigError(f"--hf-config {block.source!r} is not a model type of transformers (e.g. llama, qwen2, "
                          "gpt2)")
    return {"norm_placement": None, "final_norm": "the model's own", "how": f"transformers {block.source} config at"
            f" the copy task's size, AutoModelForCausalLM.from_config (eager attention)"}


def check_model(spec: Spec) -> dict:
    """Build the stack once and run one batch forward: it must give (batch, time, vocab) logits, and a later token must
    not change an earlier position's logits. Raises ConfigError (before any run) otherwise. Returns its size."""
    setup = spec.setup
    try:
        model = build_model(spec, 0)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's constructor or transformers: one line
        raise ConfigError(f"building the stack of {spec.block.source} failed: {type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]}") from None
    layer = spec.read.get("layer_class")
    if layer and not any(type(m).__name__ == layer for m in model.modules()):
        raise ConfigError(f"{layer}: the {spec.block.source} causal LM built from its config has no {layer} layer "
                          f"(another stack's, an encoder's?); name the architecture instead: --hf-config MODEL_TYPE")
    not_finite = _not_finite(model.state_dict())
    if not_finite:
        raise ConfigError(f"{spec.block.source}: NaN/inf in the weights at init (seed 0): {not_finite}; the stack "
                          "cannot train (check the block's initialisation)")
    tokens = torch.randint(0, setup.vocab_size, (2, 2 * setup.seq_len - 1), generator=torch.Generator().manual_seed(0))
    outputs = []
    hooks = [block.register_forward_hook(lambda module, args, out, i=i: outputs.append((i, out)))
             for i, block in enumerate(getattr(model, "blocks", []), start=1)]
    try:
        with torch.no_grad():
            logits = model(tokens)
            changed = tokens.clone()
            changed[:, -1] = (changed[:, -1] + 1) % setup.vocab_size
            later = model(changed)
    except Exception as err:  # noqa: BLE001
        raise ConfigError(f"calling the stack of {spec.block.source} on a (batch, time, {setup.d_model}) stream failed:"
                          f" {type(err).__name__}: {' '.join(str(err).split())[:200]}") from None
    finally:
        for hook in hooks:
            hook.remove()
    if not torch.isfinite(logits).all():
        first = next((i for i, out in outputs if not torch.isfinite(out[0] if isinstance(out, (tuple, list)) else out)
                      .all()), None)
        where = f"first in block {first}'s output" if first else "after the blocks (the final norm or head)"
        raise ConfigError(f"{spec.block.source}: NaN/inf in the stack's output at init on a copy batch "
                          f"({int((~torch.isfinite(logits)).sum())} of {logits.numel()} logits), {where}, with finite "
                          "weights: the block's forward makes it (a division by zero, a log of 0?)")
    expected = (2, tokens.shape[1], setup.vocab_size)
    if tuple(logits.shape) != expected:
        raise ConfigError(f"{spec.block.source} changes the stream's shape: the stack gives {tuple(logits.shape)}, the "
                          f"copy task needs {expected} (each block must map (batch, time, d) to the same shape)")
    if not torch.allclose(logits[:, :-1], later[:, :-1]):
        raise ConfigError(f"{spec.block.source}: a later token changes earlier positions' outputs (not causal): on the"
                          " copy task it would read the answer")
    return {"parameters": sum(p.numel() for p in model.parameters()), "weights_sha256": weights_sha256(model)}


def _not_finite(state: dict, shown: int = 3) -> str:
    """Where a state dict holds NaN or inf: 'blocks.0.block.proj.weight (12 of 256 NaN, 0 inf), ...' ('' if none)."""
    found = []
    for name, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
            found.append(f"{name} ({nan} NaN, {inf} inf of {tensor.numel()})")
    more = f" and {len(found) - shown} more tensors" if len(found) > shown else ""
    return ", ".join(found[:shown]) + more
