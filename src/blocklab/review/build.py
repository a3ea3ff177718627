"""Building a user's block at a chosen width: `--module package.module:ClassOrFactory`."""
from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
import typing
from pathlib import Path

from torch import nn

from ..model_config import ConfigError, ModelConfig

DEFAULT_WIDTH, SECOND_WIDTH_STEP, DEFAULT_HEADS = 64, 32, 4
WIDTH_NAMES = ("d_model", "dim", "embed_dim", "hidden_size", "n_embd")
HEAD_NAMES = ("nhead", "n_heads", "num_heads", "num_attention_heads", "n_head")
CONFIG_NAMES = ("cfg", "config", "model_config", "args", "params")
DROPOUT_WORDS = ("dropout", "pdrop", "drop_rate")
TORCH_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def _import_file(path: str):
    """A module from a file path (./block.py): imported under its file name, its folder first on sys.path so that
    its own imports of files beside it work."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(f"--module {path!r}: no such file")
    folder = str(file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = file.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(file):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--module {path!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and config_class_of look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's file: one line, not a traceback
        del sys.modules[name]
        raise ConfigError(f"importing {path!r} failed: {type(err).__name__}: {err}") from None
    return module


def resolve(target: str):
    """'package.module:Name' or 'path/to/file.py:Name' (Name may be dotted) -> the object. Importing runs the
    module's code. A module is looked up in the current folder too, as `python -m` does (the `blocklab` script
    alone would not)."""
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise ConfigError(f"--module must look like package.module:ClassOrFactory or path/to/file.py:Class, "
                          f"got {target!r}")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        obj = _import_file(module_name)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            obj = importlib.import_module(module_name)
        except ImportError as err:
            raise ConfigError(f"cannot import module {module_name!r}: {err}") from None
        except Exception as err:  # the module's own code failed while importing
            raise ConfigError(f"importing {module_name!r} failed: {type(err).__name__}: {err}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _parameters(obj) -> dict:
    try:
        return dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return {}


def _first(names, params) -> str | None:
    return next((n for n in names if n in params), None)


def _fields(config_class) -> dict:
    """Field name -> default of a config class: a dataclass's fields, else its constructor's keyword arguments."""
    if dataclasses.is_dataclass(config_class):
        return {f.name: (f.default if f.default is not dataclasses.MISSING else None)
                for f in dataclasses.fields(config_class) if f.init}
    return {n: (p.default if p.default is not inspect.Parameter.empty else None)
            for n, p in _parameters(config_class).items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def config_class_of(cls) -> type | None:
    """The config class a block's constructor takes: its first argument's annotation, else the one config class
    (a dataclass with a width field) defined in the block's own module, else blocklab's ModelConfig."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to the module's classes
        hints = {}
    first = next(iter(_parameters(cls)), None)
    hinted = hints.get(first)
    if inspect.isclass(hinted) and _first(WIDTH_NAMES, _fields(hinted)):
        return hinted
    module = sys.modules.get(cls.__module__)
    found = [v for v in vars(module).values() if inspect.isclass(v) and dataclasses.is_dataclass(v)
             and v.__module__ == cls.__module__ and _first(WIDTH_NAMES, _fields(v))] if module else []
    if len(found) == 1:
        return found[0]
    return ModelConfig


class Builder:
    """Builds the block at a chosen width when its constructor lets us, and says how it did so."""

    def __init__(self, obj, kwargs: dict | None = None):
        if not (isinstance(obj, nn.Module) or callable(obj)):
            raise ConfigError(f"{obj!r} is neither an nn.Module, a class nor a factory")
        self.obj, self.kwargs = obj, dict(kwargs or {})
        self.config_fields = {}  # the fields of a config class the reviewer set (the rest keep their defaults)
        params = _parameters(obj)
        first = next(iter(params), None)
        if isinstance(obj, nn.Module):
            self.how, self.width_arg = "the given module instance", None
        elif inspect.isclass(obj) and issubclass(obj, TORCH_LAYERS):
            self.width_arg = "d_model"
            self.how = (f"cls(d_model, nhead={self.kwargs.get('nhead', DEFAULT_HEADS)}, dim_feedforward=4*d_model, "
                        "dropout=0, batch_first=True)")
        elif inspect.isclass(obj) and first in CONFIG_NAMES:
            self.config_class, self.width_arg = config_class_of(obj), "cfg"
            fields = _fields(self.config_class)
            self.config_width = _first(WIDTH_NAMES, fields)
            self.config_heads = _first(HEAD_NAMES, fields)
            unknown = sorted(set(self.kwargs) - set(fields))
            if unknown:
                raise ConfigError(f"--kwargs {unknown} are not fields of {self.config_class.__name__}; allowed: "
                                  f"{sorted(fields)}")
            self.config_fields = self._config_fields(DEFAULT_WIDTH, fields)
            self.how = self._config_how()
        elif _first(WIDTH_NAMES, params):
            self.width_arg = _first(WIDTH_NAMES, params)
            heads = _first(HEAD_NAMES, params)
            given = f", {heads}={self.kwargs.get(heads, DEFAULT_HEADS)}" if heads else ""
            self.how = f"{getattr(obj, '__name__', obj)}({self.width_arg}=...{given})"
        elif all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                 for p in params.values()):
            self.how, self.width_arg = f"{getattr(obj, '__name__', obj)}() (no width argument)", None
        else:
            raise ConfigError(f"cannot construct {obj!r}: its signature {list(params)} is none of the supported ones "
                              "(see `blocklab review --help`)")

    def _config_how(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.config_fields.items())
        return f"{self.obj.__name__}({self.config_class.__name__}({shown}))"

    @property
    def declared_heads(self) -> int | None:
        """The query heads the block was asked for, when its constructor takes a head count."""
        if isinstance(self.obj, nn.Module):
            return None
        if inspect.isclass(self.obj) and issubclass(self.obj, TORCH_LAYERS):
            return self.kwargs.get("nhead", DEFAULT_HEADS)
        if self.width_arg == "cfg":
            return self.config_fields.get(self.config_heads) if self.config_heads else None
        heads = _first(HEAD_NAMES, _parameters(self.obj)) if self.width_arg else None
        return self.kwargs.get(heads, DEFAULT_HEADS) if heads else None

    @property
    def follows_width(self) -> bool:
        return self.width_arg is not None

    def build(self, d_model: int) -> nn.Module:
        try:
            module = self._build(d_model)
        except ConfigError:
            raise
        except Exception as err:  # the user's constructor: report it as one line
            how = self._config_how() if self.width_arg == "cfg" else self.how  # at the width it was built
            raise ConfigError(f"building the block as {how} failed: {type(err).__name__}: {err}") from None
        if not isinstance(module, nn.Module):
            raise ConfigError(f"the factory returned {type(module).__name__}, not an nn.Module")
        return module

    def _config_fields(self, d: int, fields: dict) -> dict:
        """The width, the head count (4), every dropout field at 0, and --kwargs; everything else its default."""
        if not self.config_width:
            raise ConfigError(f"{self.config_class.__name__} has none of the width fields {list(WIDTH_NAMES)}: cannot "
                              f"build {getattr(self.obj, '__name__', self.obj)} at a chosen width")
        chosen = {self.config_width: d}
        if self.config_heads:
            chosen[self.config_heads] = DEFAULT_HEADS
        for name, default in fields.items():
            if any(w in name for w in DROPOUT_WORDS) and isinstance(default, float) and default:
                chosen[name] = 0.0
        return {**chosen, **self.kwargs, self.config_width: d}

    def _build(self, d: int) -> nn.Module:
        obj, kw = self.obj, self.kwargs
        if isinstance(obj, nn.Module):
            return copy.deepcopy(obj)
        if inspect.isclass(obj) and issubclass(obj, TORCH_LAYERS):
            base = {"d_model": d, "nhead": DEFAULT_HEADS, "dim_feedforward": 4 * d, "dropout": 0.0, "batch_first": True}
            return obj(**{**base, **kw})
        if self.width_arg == "cfg":
            self.config_fields = self._config_fields(d, _fields(self.config_class))
            return obj(self.config_class(**self.config_fields))
        if self.width_arg:
            heads = _first(HEAD_NAMES, _parameters(obj))
            extra = {heads: DEFAULT_HEADS} if heads else {}
            return obj(**{**extra, **kw, self.width_arg: d})
        return obj(**kw)

