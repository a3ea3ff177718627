"""Hugging Face architectures, built tiny from their own config class and driven whole.

    config      a config.json path, a shipped name (llama3-8b) or a model_type transformers knows (gpt2, t5, ...):
                the architecture's own config class, at its full size
    tiny        the same config shrunk consistently (width 32, 4 query heads of 8, K/V heads 4, 2 or 1 as in the full
                config, FFN ratio kept, the full depth, vocabulary 128; linear-attention, latent and state widths,
                windows, experts too), float64, eager attention unless asked otherwise
    driver      runs the whole tiny model on token ids, replaces one layer's input by the probe's x and stops at that
                layer's output: RoPE tables, position ids, causal and sliding-window masks, relative biases come from
                the model itself
    full count  the model with its language-model head, built at full size on the meta device (no memory)

No table of architectures: a few generic config keys say where the widths live (hidden_size through the config's own
attribute_map, an FFN width key, a head_dim key); everything else is read off the live model.
"""
from __future__ import annotations

import contextlib

import copy
import difflib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..model_config import ConfigError
from ..model import hf_config

WIDTH, HEADS, HEAD_DIM, VOCAB = 32, 4, 8, 128
SEQ, MEMORY_SEQ = 6, 9
MAX_LAYERS = 128  # the tiny model keeps the full depth (every layer reviewed) up to this many layers
WINDOW = 4  # sliding windows, local and chunked attention shrink to 4 positions: visible within SEQ
MAX_EXPERTS = 8  # routed experts: at most this many at the tiny size (and more than the experts per token)
ATTENTION_BACKENDS = ("eager", "sdpa")
FFN_KEYS = ("intermediate_size", "n_inner", "d_ff", "dff", "ffn_dim", "ffn_hidden_size", "encoder_ffn_dim",
            "decoder_ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size", "intermediate_size_mlp",
            "block_ff_dim")
HEAD_DIM_KEYS = ("head_dim", "d_kv", "kv_channels")
# widths that are not the model width's multiples: head widths of linear attention and multi-head latent attention,
# SSM states; each set to the tiny head width (MLA's query-key width is its two parts together)
OTHER_HEAD_DIMS = ("linear_key_head_dim", "linear_value_head_dim", "qk_rope_head_dim", "qk_nope_head_dim",
                   "v_head_dim", "mamba_d_head", "mamba_d_state", "state_size", "ssm_state_size", "d_state")
SSM_STATE_KEYS = ("mamba_d_state", "ssm_state_size", "state_size", "d_state")  # a state-space layer's state width
RANK_KEYS = ("kv_lora_rank", "q_lora_rank", "laurel_rank", "embedding_size")  # low-rank bottlenecks (MLA's,
# Gemma 3n's LAuReL, a factorised embedding's): scaled with the width, at least 4
BOTTLENECK_KEYS = ("intra_bottleneck_size", "true_hidden_size")  # MobileBERT's attention and FFN run at this width,
# with the heads: HEADS heads of HEAD_DIM at the tiny size (scaled with the width, its heads would be 2 wide)
PER_LAYER_KEYS = ("hidden_size_per_layer_input",)  # Gemma 3n's per-layer input width: scaled with the width
VOCAB_KEYS = ("vocab_size_per_layer_input",)  # a second embedding table's vocabulary (Gemma 3n): to VOCAB
HEAD_COUNT_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "mamba_n_heads")  # scaled with the heads
CHUNK_KEYS = ("mamba_chunk_size", "chunk_size")  # a Mamba-2 scan's chunk: the same recurrence computed in blocks,
# padded to a whole chunk (256 positions for 6 tokens made one probe of Bamba take minutes): to CHUNK
CHUNK = 8
WINDOW_KEYS = ("sliding_window", "attention_window_size", "local_attention", "attention_chunk_size")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "moe_k")
KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
HEAD_KEYS = ("encoder_attention_heads", "decoder_attention_heads")  # besides num_attention_heads (BART)
LAYER_KEYS = ("num_hidden_layers", "num_decoder_layers", "decoder_layers", "encoder_layers")
TOKEN_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")


def _transformers():
    import transformers  # on first use: its import takes seconds, and only the Hugging Face paths need it

    return transformers


# --- the config at full size ---------------------------------------------------------------------


def model_types() -> list[str]:
    return sorted(_transformers().CONFIG_MAPPING.keys())


def load_config(source):
    """The architecture's own config class, at full size, from a path, a shipped name or a model_type."""
    mapping = _transformers().CONFIG_MAPPING
    if isinstance(source, dict) or str(source) in hf_config.SHIPPED or str(source).endswith(".json") \
            or Path(str(source)).is_file():
        try:
            raw = hf_config.text_config(hf_config.load_config_dict(source))
        except ConfigError as err:
            raise ConfigError(f"--hf-config: {err}; or give a model_type transformers knows, e.g. llama, gpt2, "
                              "t5") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"--hf-config {source}: a config.json holds a JSON object, got {type(raw).__name__}")
        model_type = raw.get("model_type")
        if model_type not in mapping:
            raise ConfigError(f"--hf-config {source}: model_type={model_type!r} is not one transformers knows; "
                              f"allowed: {_allowed_hint(model_type)}")
        try:
            config = mapping[model_type].from_dict({k: v for k, v in raw.items() if not k.startswith("_")})
        except Exception as err:  # noqa: BLE001 - the config class's own validation: an invalid value, exit 3
            raise ConfigError(f"--hf-config {source}: transformers rejects the config: {type(err).__name__}: "
                              + " ".join(str(err).split())) from None
        return validate(config, str(source))
    if str(source) in mapping:
        return validate(mapping[str(source)](), str(source))
    raise ConfigError(f"--hf-config {source!r} is neither a config.json file, a shipped config "
                      f"({sorted(hf_config.SHIPPED)}) nor a model_type transformers knows; allowed model_types: "
                      f"{_allowed_hint(str(source))}")


SIZE_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", *FFN_KEYS, *HEAD_DIM_KEYS,
             *KV_KEYS)


def validate(config, source: str):
    """Values no architecture can have: a size that is not a positive integer, K/V heads that do not divide the
    query heads."""
    for key in SIZE_KEYS:
        value = getattr(config, key, None)
        if value is None or isinstance(value, (list, tuple)):  # absent, or one value per layer (OpenELM)
            continue
        least = 1 if key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size") else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"--hf-config {source}: {key} must be an integer >= {least}, got {value!r}")
    # query heads that do not divide the width are the config class's to refuse (Llama's does): GLM-4-MoE's own
    # default, 96 heads at 4096, builds with head_dim 4096 // 96 = 42
    heads = _int_attr(config, "num_attention_heads")
    kv = next((_int_attr(config, k) for k in KV_KEYS if _int_attr(config, k)), None)
    if heads and kv and heads % kv:
        raise ConfigError(f"--hf-config {source}: num_key_value_heads={kv} does not divide "
                          f"num_attention_heads={heads}")
    d = _int_attr(config, "hidden_size")
    if "head_dim" in vars(config) and config.head_dim is None and d and heads and not isinstance(
            getattr(type(config), "head_dim", None), property):
        # a config whose class defaults head_dim to None (HunYuan dense) and whose attention reads it as it is:
        # the width each head has when the heads tile the model width, as most modelling code defaults it
        config.head_dim = d // heads
    return config


def _allowed_hint(name) -> str:
    known = model_types()
    close = difflib.get_close_matches(str(name), known, n=5)
    near = f"did you mean {', '.join(close)}? " if close else ""
    return f"{near}({len(known)} in all, e.g. llama, mistral, qwen3, gemma2, gpt_neox, gpt2, falcon, phi, bert, t5)"


def _int_attr(config, key):
    value = getattr(config, key, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def shrink(config, attention: str = "eager"):
    """The same architecture at a tiny size: every width scaled together, head structure (MHA/GQA/MQA) kept."""
    tiny = copy.deepcopy(config)
    d, heads = _int_attr(config, "hidden_size"), _int_attr(config, "num_attention_heads")
    if not d or not heads:
        raise ConfigError(f"{type(config).__name__} has no hidden_size / num_attention_heads: not a transformer config "
                          "this reviewer can shrink")
    head_dim = next((_int_attr(config, k) for k in HEAD_DIM_KEYS if _int_attr(config, k)), d // heads)
    for key in FFN_KEYS:
        value = getattr(config, key, None)
        if _int_attr(config, key):
            setattr(tiny, key, round(value * WIDTH / d))
        elif isinstance(value, list) and value and all(isinstance(v, int) and v > 0 for v in value):
            setattr(tiny, key, [max(1, round(v * WIDTH / d)) for v in value])  # one width per layer (Gemma 3n)
    for key, value in vars(config).items():  # another stream as wide as the model (RecurrentGemma's lru_width)
        if key.endswith("_width") and _int_attr(config, key) == d:
            setattr(tiny, key, WIDTH)
    for key in PER_LAYER_KEYS:
        if _int_attr(config, key):
            setattr(tiny, key, max(HEAD_DIM // 2, round(getattr(config, key) * WIDTH / d)))
    for key in VOCAB_KEYS:
        if (_int_attr(config, key) or 0) > VOCAB:
            setattr(tiny, key, VOCAB)
    for key in KV_KEYS:
        kv = _int_attr(config, key)
        if kv:
            setattr(tiny, key, HEADS if kv == heads else 1 if kv == 1 else 2)
    for key in HEAD_DIM_KEYS:
        if _int_attr(config, key) and not isinstance(getattr(type(config), key, None), property):
            setattr(tiny, key, HEAD_DIM)  # a property (Falcon's head_dim) follows hidden_size / heads by itself
    if _int_attr(config, "rotary_dim"):  # absolute rotary width (GPT-J): keep its fraction of the head
        tiny.rotary_dim = max(2, 2 * round(config.rotary_dim * HEAD_DIM / head_dim / 2))
    tiny.hidden_size, tiny.num_attention_heads, tiny.vocab_size = WIDTH, HEADS, VOCAB
    for key in HEAD_KEYS:
        if _int_attr(config, key):
            setattr(tiny, key, HEADS)
    for key in OTHER_HEAD_DIMS:
        if _int_attr(config, key):
            setattr(tiny, key, HEAD_DIM)
    if _int_attr(config, "qk_rope_head_dim") and _int_attr(config, "qk_nope_head_dim"):
        # a decoupled rotary key beside the unrotated ones (DeepSeek's MLA): keep its share of the query-key product
        tiny.qk_rope_head_dim = max(2, 2 * round(config.qk_rope_head_dim * HEAD_DIM / config.qk_nope_head_dim / 2))
        if getattr(config, "head_dim", None) == config.qk_rope_head_dim:  # the rotary embedding's width (DeepSeek-V3)
            tiny.head_dim = tiny.qk_rope_head_dim
    if _int_attr(config, "qk_head_dim") and _int_attr(config, "qk_rope_head_dim"):
        tiny.qk_head_dim = tiny.qk_rope_head_dim + (getattr(tiny, "qk_nope_head_dim", 0) or 0)
    for key in RANK_KEYS:
        if _int_attr(config, key):
            setattr(tiny, key, max(4, round(getattr(config, key) * WIDTH / d)))
    for key in BOTTLENECK_KEYS:
        if _int_attr(config, key):
            setattr(tiny, key, HEADS * HEAD_DIM)
    for key in HEAD_COUNT_KEYS:
        if _int_attr(config, key):
            setattr(tiny, key, max(1, round(getattr(config, key) * HEADS / heads)))
    if _int_attr(config, "mamba_n_heads") and _int_attr(config, "mamba_d_head"):
        # Mamba-2 heads tile its inner width (mamba_d_ssm, else mamba_expand x width): the head count follows the
        # tiny inner width and head width, not the attention heads
        if _int_attr(config, "mamba_d_ssm"):
            tiny.mamba_d_ssm = max(HEAD_DIM, HEAD_DIM * round(config.mamba_d_ssm * WIDTH / d / HEAD_DIM))
        inner = getattr(tiny, "mamba_d_ssm", None) or int(getattr(tiny, "mamba_expand", 1) * WIDTH)
        tiny.mamba_n_heads = max(1, inner // HEAD_DIM)
    for key in CHUNK_KEYS:
        if (_int_attr(config, key) or 0) > CHUNK:
            setattr(tiny, key, CHUNK)
    for key in WINDOW_KEYS:
        if (_int_attr(config, key) or 0) > WINDOW:
            setattr(tiny, key, WINDOW)
    for key in ("n_group", "topk_group"):  # DeepSeek's grouped routing: one group of the few tiny experts
        if _int_attr(config, key):
            setattr(tiny, key, 1)
    top_k = max([_int_attr(config, k) or 0 for k in TOP_K_KEYS])
    for key in EXPERT_KEYS:
        if _int_attr(config, key):
            setattr(tiny, key, min(getattr(config, key), max(MAX_EXPERTS, top_k + 1)))
    depth = next((_int_attr(config, k) for k in LAYER_KEYS if _int_attr(config, k)), None)
    for key in LAYER_KEYS:
        if _int_attr(config, key):
            setattr(tiny, key, min(getattr(config, key), MAX_LAYERS))
    if depth and depth > MAX_LAYERS and isinstance(getattr(config, "layer_types", None), list):
        tiny.layer_types = list(config.layer_types[:MAX_LAYERS])
    for key in TOKEN_KEYS:
        if (_int_attr(config, key) or 0) >= VOCAB:
            setattr(tiny, key, 0)
    tiny.use_cache = False
    tiny._attn_implementation = attention
    if hasattr(config, "_experts_implementation"):
        tiny._experts_implementation = "eager"  # the grouped kernels take no float64
    return tiny


# --- building ------------------------------------------------------------------------------------


def model_class(config, prefer_head: bool):
    """The model class: with its language-model head (seq2seq, masked, causal, in that order) or the bare model."""
    t = _transformers()
    autos = (t.AutoModelForSeq2SeqLM, t.AutoModelForMaskedLM, t.AutoModelForCausalLM, t.AutoModel) if prefer_head \
        else (t.AutoModel,)
    for auto in autos:
        if type(config) in auto._model_mapping:
            return auto._model_mapping[type(config)], auto.__name__
    raise ConfigError(f"transformers has no model class for {type(config).__name__}")


KV_MODULES = ("k_proj", "v_proj", "k_norm", "v_norm")


def kv_source(layers, index: int, config) -> int | None:
    """The layer whose keys and values layer `index` reuses (a KV cache shared across layers: Gemma 3n's last
    num_kv_shared_layers layers read those of the last earlier layer of their type, config.kv_sharing_modes 'store');
    None for a layer that computes its own."""
    attn = getattr(layers[index], "self_attn", None)
    try:
        modes, types = getattr(config, "kv_sharing_modes", None), getattr(config, "layer_types", None)
    except Exception:  # noqa: BLE001 - a config whose property cannot be computed shares nothing we can follow
        return None
    if not getattr(attn, "is_kv_shared_layer", False) or not modes or not types:
        return None
    stored = [i for i in range(index) if modes[i] == "store" and types[i] == types[index]]
    return stored[-1] if stored else None


@contextlib.contextmanager
def kv_computed_here(consumer: nn.Module, producer: nn.Module):
    """For the duration, a KV-sharing layer computes its keys and values itself, from its own input, with the
    modules of the layer it shares them with (borrowed, not copied: the same weights); restored after. Yields the
    names borrowed. The only change to what the layer computes is which input those modules read."""
    attn, source = consumer.self_attn, producer.self_attn
    borrowed = [n for n in KV_MODULES if hasattr(source, n) and not hasattr(attn, n)]
    for n in borrowed:
        setattr(attn, n, getattr(source, n))
    attn.is_kv_shared_layer = False
    try:
        yield borrowed
    finally:
        attn.is_kv_shared_layer = True
        for n in borrowed:
            delattr(attn, n)


@contextlib.contextmanager
def short_chunks(model: nn.Module):
    """While it lasts, the functions of ``model``'s modeling module that scan the sequence in chunks of a default
    size over CHUNK (Qwen3-Next's gated delta rule: 64 positions a chunk) get chunks of CHUNK, as the tiny config
    gives Mamba's chunk (CHUNK_KEYS): chunking is an exact reformulation of the scan, and the probes' few tokens
    were padded to 64 on every call (qwen3_next's review: 18.6 s on 2 idle cores, most of it in that scan). Only
    module-level functions with a ``chunk_size`` parameter; restored after."""
    import functools
    import inspect
    import sys as _sys

    module = _sys.modules.get(type(model).__module__)
    swapped = {}
    for name, fn in (vars(module).items() if module is not None else ()):
        if not inspect.isfunction(fn) or getattr(fn, "__module__", None) != module.__name__:
            continue
        try:
            default = inspect.signature(fn).parameters.get("chunk_size")
        except (TypeError, ValueError):
            continue
        if default is None or not isinstance(default.default, int) or default.default <= CHUNK:
            continue

        @functools.wraps(fn)
        def shorter(*args, _fn=fn, **kwargs):
            kwargs.setdefault("chunk_size", CHUNK)
            return _fn(*args, **kwargs)

        swapped[name] = fn
        setattr(module, name, shorter)
    try:
        yield sorted(swapped)
    finally:
        for name, fn in swapped.items():
            setattr(module, name, fn)


def build_tiny(config, seed: int = 0, cap: int | None = None) -> nn.Module:
    """The tiny model in float64; refused (MemoryCapExceeded) before allocating when its weights alone would take
    more than the cap (counted on the meta device)."""
    cls, _ = model_class(config, prefer_head=False)
    if cap is not None:
        with torch.device("meta"):
            numel = sum(p.numel() for p in cls(config).parameters())
        if 8 * numel > cap:
            from .dataflow import MemoryCapExceeded, gib

            raise MemoryCapExceeded(f"the tiny {cls.__name__} would hold {numel:,} float64 weights "
                                    f"({gib(8 * numel)}), over the cap of {gib(cap)} "
                                    "(--max-memory-gb): some width of this config is not shrunk")
    torch.manual_seed(seed)
    try:
        model = cls(config)
    except Exception as err:  # transformers' own constructor on a valid config: report, not a traceback
        raise ConfigError(f"transformers could not build {cls.__name__} at the tiny size: {type(err).__name__}: "
                          f"{err}") from None
    return model.double().eval()


def count_full(config) -> dict:
    """Exact parameter count of the model with its head, at full size, on the meta device; tied tensors count once."""
    cls, auto = model_class(config, prefer_head=True)
    with torch.device("meta"):
        model = cls(config)
    return {"parameters": sum(p.numel() for p in model.parameters()), "class": cls.__name__, "auto": auto,
            "model": model}


def count_tiny_both_ways(config) -> tuple[int, int]:
    """The tiny model's count on the meta device and with real tensors: the meta count is the same arithmetic."""
    cls, _ = model_class(config, prefer_head=True)
    with torch.device("meta"):
        meta = sum(p.numel() for p in cls(config).parameters())
    torch.manual_seed(0)
    return meta, sum(p.numel() for p in cls(config).parameters())


# --- finding the layers --------------------------------------------------------------------------


def stacks(model: nn.Module) -> dict[str, nn.ModuleList]:
    """The outermost ModuleLists of two or more modules of one class, or of as many modules as the config has layers
    (a hybrid's layers differ in class: Jamba's attention and Mamba layers): the model's stacks of layers."""
    config = getattr(model, "config", None)
    depths = {_int_attr(config, k) for k in LAYER_KEYS} - {None} if config is not None else set()
    found = {}
    for name, sub in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in found):
            continue
        # layers have parts of their own: a list of bare projections (Gemma 3n's altup_projections) is no stack
        if isinstance(sub, nn.ModuleList) and len(sub) >= 2 and all(list(m.children()) for m in sub) \
                and (len({type(m) for m in sub}) == 1 or len(sub) in depths):
            found[name] = sub
    return found


# --- driving the whole model ---------------------------------------------------------------------


class _Stop(Exception):
    """Raised by the probed layer's output hook: nothing after it is needed."""


class ModelDriver:
    """x -> the probed layer's output, computed inside the whole model (which supplies masks and positions)."""

    def __init__(self, model: nn.Module, layer: nn.Module, config, seed: int = 0, decoder_side: bool = False):
        self.model, self.layer, self.config = model, layer, config
        self.width, self.seq = config.hidden_size, SEQ
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self.decoder_side = decoder_side
        self.memory_seq = MEMORY_SEQ if self.encoder_decoder and decoder_side else None
        generator = torch.Generator().manual_seed(seed + 1)
        self.ids = torch.randint(3, VOCAB, (1, max(SEQ, MEMORY_SEQ)), generator=generator)
        self._memory = None

    def memory(self) -> torch.Tensor:
        """The encoder's output for the probe's tokens, computed once: the decoder's probes all read the same one."""
        if self._memory is None:
            with torch.no_grad():
                out = self.model.get_encoder()(input_ids=self.ids[:, :MEMORY_SEQ])
            self._memory = out[0]
        return self._memory

    def inputs(self, batch: int, ids=None) -> dict:
        if not self.encoder_decoder:
            return {"input_ids": (self.ids if ids is None else ids)[:, :SEQ].expand(batch, -1)}
        decoder_ids = (self.ids if ids is None else ids)[:, :SEQ].expand(batch, -1)
        if self.decoder_side and ids is None and hasattr(self.model, "get_encoder"):
            return {"encoder_outputs": (self.memory().expand(batch, -1, -1),), "decoder_input_ids": decoder_ids}
        enc = MEMORY_SEQ if self.decoder_side else SEQ
        return {"input_ids": (self.ids if ids is None else ids)[:, :enc].expand(batch, -1),
                "decoder_input_ids": decoder_ids}

    def __call__(self, x: torch.Tensor, ids=None) -> torch.Tensor:
        """The layer's output when its input is x (batch, SEQ, width); x None: the model's own input to the layer."""
        captured = {}

        def swap(module, args, kwargs):
            if x is None:
                captured["input"] = (args[0] if args else kwargs["hidden_states"]).detach()
                raise _Stop
            return _swap_input(x, args, kwargs, captured)

        def grab(module, args, output):
            captured["output"] = _layer_output(output, captured)
            raise _Stop

        handles = [self.layer.register_forward_pre_hook(swap, with_kwargs=True),
                   self.layer.register_forward_hook(grab)]
        batch = 1 if x is None else x.shape[0]
        try:
            with torch.no_grad():
                self.model(**self.inputs(batch, ids), use_cache=False)
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        return captured["input" if x is None else "output"]

    def layer_input(self, ids) -> torch.Tensor:
        return self(None, ids)


def _swap_input(x, args, kwargs, captured: dict):
    """A layer's forward pre-hook result: its input replaced by x."""
    given = args[0] if args and torch.is_tensor(args[0]) else kwargs.get("hidden_states")
    new = x
    if torch.is_tensor(given) and given.dim() == x.dim() + 1 and given.shape[1:] == x.shape:
        # the layer reads several parallel streams, (streams, batch, time, width) (Gemma 3n's AltUp): each gets x,
        # and the first stream of its output is read
        new = x.unsqueeze(0).expand(given.shape[0], *x.shape).contiguous()
        captured["streams"] = True
    if args and torch.is_tensor(args[0]):
        return (new, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": new}


def _layer_output(output, captured: dict) -> torch.Tensor:
    out = output[0] if isinstance(output, (tuple, list)) else output
    return (out[0] if captured.get("streams") else out).detach()


class StackDriver(ModelDriver):
    """Every layer of a stack on the same x in ONE run of the whole model: each layer's input is replaced by x, its
    output kept (``outputs``, by layer index). For the cheap probes of every layer (architecture._fingerprint):
    one run instead of one run up to each layer. Its ``layer`` is the stack (hooks see 'i.module' names)."""

    def __init__(self, model: nn.Module, layers, config, seed: int = 0, decoder_side: bool = False):
        super().__init__(model, layers, config, seed, decoder_side)
        self.layers, self.outputs = list(layers), {}

    def __call__(self, x: torch.Tensor, ids=None) -> torch.Tensor:
        self.outputs, handles = {}, []
        for i, layer in enumerate(self.layers):
            captured = {}
            handles.append(layer.register_forward_pre_hook(
                lambda m, a, k, captured=captured: _swap_input(x, a, k, captured), with_kwargs=True))
            handles.append(layer.register_forward_hook(
                lambda m, a, o, i=i, captured=captured: self.outputs.__setitem__(i, _layer_output(o, captured))))
        try:
            with torch.no_grad():
                self.model(**self.inputs(x.shape[0], ids), use_cache=False)
        finally:
            for h in handles:
                h.remove()
        return self.outputs[len(self.layers) - 1]


class _Lookups(TorchFunctionMode):
    """Every embedding lookup (F.embedding), also those a subclass makes by calling nn.Embedding.forward itself
    (OPT's and BART's learned positions), with the table it reads."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.embedding:
            self.seen.append((args[0], args[1]))
        return func(*args, **(kwargs or {}))


def absolute_position(driver: ModelDriver) -> dict:
    """Same token at every position: if the layer's input rows differ, the embedding added a position signal.

    Learned: the signal comes from a trainable table looked up by an index that runs along the sequence;
    sinusoidal: from a fixed table or a formula.
    """
    same = torch.full((1, max(SEQ, MEMORY_SEQ)), int(driver.ids[0, 0]))
    with _Lookups() as lookups:
        rows = driver.layer_input(same)[0]
    spread = (rows - rows[:1]).abs().max().item() / max(rows.abs().max().item(), 1e-30)
    names = {id(t): n for n, t in [*driver.model.named_parameters(), *driver.model.named_buffers()]}
    tables = [(names.get(id(w), "a computed table"), w) for idx, w in lookups.seen
              if idx.dim() >= 1 and idx.shape[-1] > 1 and (idx[..., 1:] != idx[..., :1]).any()]
    kind = None
    if spread > 1e-9:
        kind = "learned" if any(isinstance(w, nn.Parameter) and w.requires_grad for _, w in tables) else "sinusoidal"
    return {"input_rows_differ": spread > 1e-9, "row_spread": spread, "kind": kind,
            "position_tables": [n for n, _ in tables] if kind else []}


def describe_source(source, config) -> str:
    """Which config was reviewed, in words, and its shape: "blocklab's shipped llama3-8b (config.json of
    meta-llama/Meta-Llama-3-8B): hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads, ...";
    transformers' defaults for a model_type; or the file named."""
    if isinstance(source, dict):
        where = "the config given as a dict"
    elif str(source) in hf_config.SHIPPED:
        origin = str(hf_config.load_config_dict(source).get("_source", "")).split(" (")[0].split(",")[0]
        where = f"blocklab's shipped {source}" + (f" ({origin})" if origin else "")
    elif str(source) in _transformers().CONFIG_MAPPING and not Path(str(source)).is_file():
        where = f"transformers' {type(config).__name__} defaults (model_type {source})"
    else:
        where = f"the config file {source}"
    sizes = config_summary(config)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta if theta is not None else getattr(config, "rope_theta", None)
    eps = next((getattr(config, k) for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
                if isinstance(getattr(config, k, None), float)), None)
    words = [(("hidden", "hidden_size")), ("intermediate", "intermediate_size"), ("layers", "num_hidden_layers"),
             ("heads", "num_attention_heads"), ("KV heads", "num_key_value_heads"), ("vocab", "vocab_size")]
    shape = [f"{label} {sizes[key]}" if label in ("hidden", "intermediate", "vocab") else f"{sizes[key]} {label}"
             for label, key in words if key in sizes]
    if theta is not None:
        shape.append(f"rope_theta {theta:g}")
    if eps is not None:
        shape.append(f"norm eps {eps:g}")
    return f"{where}: {', '.join(shape)}"


def config_summary(config) -> dict:
    keys = ("model_type", "hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
            *KV_KEYS, *FFN_KEYS, *HEAD_DIM_KEYS)
    values = {key: getattr(config, key, None) for key in keys}
    return {k: v for k, v in values.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
