"""The structure of one layer, read from its live data flow: forward hooks on its leaf modules, a few batched runs.

A driver maps the layer's input x (batch, time, width) to its output; every batch element of one run is the same x
with one edit, so one forward pass answers many questions at once. In call order:

    projections   leaf modules with a 2-D weight applied to a float input (Linear, GPT-2's Conv1D, fused QKV), and
                  the layer's own parameters applied token by token by torch.einsum, matmul or F.linear (attention
                  written with einsum on nn.Parameters): each application is a call like a layer's
    sub-layers    in-projections up to the first projection back to the model width that depends on one of them
                  (perturbing an in-projection's output changes its input): that one writes the sub-layer's output
    attention     a sub-layer that mixes tokens (an edit of its in-projections at position 0 reaches its writer's
                  input at other positions); the other sub-layers are feed-forward networks
    heads         one edit per in-projection feature: a query feature moves one head's slice of the writer's input
                  (head_dim wide), a key feature the slices of its group of heads, a value feature one column per
                  head of its group; so head_dim = the narrowest block, kv group = the widest. Edited at position 0
                  only, a query moves its own row, a key later rows too
    cross         an in-projection reading a tensor with the memory's length
    norms         other leaf modules that are LayerNorm or RMSNorm by what they do (structure.norm_kind); placement
                  by identity of tensors: a norm's output is a sub-layer's input (pre), a norm's input is the writer's
                  output (output norm; both: sandwich), or the sub-layer input plus its output (post)
    parallel      the FFN's input does not depend on the attention's output
    position      with queries and keys zeroed and each value a one-hot of its position, the writer's input is the
                  attention matrix: uniform (no bias), linear in distance (ALiBi), anything else (relative bias);
                  a position-aware layer without such a bias rotates queries and keys (RoPE)
"""
from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .structure import ACTIVATIONS, GATED, PLAIN, norm_kind

TOL = 1e-9  # relative, float64: tensors that are the same tensor, or exact masks, agree to round-off
ACT_TOL = 1e-6  # erf and tanh GELU differ by ~1e-3 relative; one formula recomputed outside the model, by ~1e-15
SLOPE_TOL = 1e-6  # ALiBi's log-attention is linear in distance to round-off (~1e-7: a float32 softmax); a learned
# bias is not
VISIBLE = 0.0  # attention weights of masked keys are exactly 0 (exp of -inf or of float64's minimum)
ROTARY_PROBE = 10.0  # logits up to ~35 (below Gemma 2's softcap of 50); the slowest RoPE pair at theta 1e7 and
# head_dim 8 turns by ~3e-5 rad over 6 positions: logits move by ~1e-3
ROTARY_TOL = 1e-10  # an unrotated offset meets only zero keys: its logits are exactly 0 and its weights exactly
# uniform, in any precision; a rotated one moves them: Apertus's slowest pair (theta 1.2e7, Llama 3 scaling by 8, head
# width 8) turns by ~6e-7 rad a position, which moves the weights by ~1e-5, float32 softmax or not
SUM_TOL = 1e-5  # a softmax's rows sum to one to float32 round-off (~1e-7) in many eager kernels
GATE_VALUE = 1.0  # a per-token gate on the attention output, held at one value everywhere: sigmoid, SiLU > 0 there
FIT_BATCH = 4  # independent inputs for a linear fit: 4 x 6 tokens per feature for a handful of coefficients
FIT_TOL = 1e-8  # relative: an exact linear combination fits to round-off (~1e-14); a near miss does not
COEF_TOL, COEF_DIGITS = 1e-6, 6  # a coefficient below COEF_TOL is no term of the sum
CURVATURE_TOL = 1e-2  # spread of log-weight sums along a row: softmax ~1e-12, under Gemma 2's tanh softcap at 50 (unit
# RMS queries and keys: logits ~1) ~1e-4, elu + 1 linear attention ~1e-1
SCALE_NUDGE = 0.3  # added to every parameter but the projections' weights: a temperature moves the scale
SCALE_PROBE = 2.0  # logit of the scale probe: 4 / scale (1 at head_dim 16 under 1/sqrt(d)), far below a softcap
CAP_LOGITS = (5.0, 20.0, 60.0)  # logits the soft-cap probe sets: Gemma 2's cap of 50 shows at 5 as 4.98
CAP_LINEAR_TOL = 1e-6  # without a cap the logit shows as set to round-off (a float32 softmax: ~1e-7 on the weights)
CAP_TOL = 1e-3  # one tanh cap fits the three logits to round-off (~1e-9); a saturation of another form does not
FUNCTIONAL_TOL = 1e-4  # a norm recomputed with another eps (1e-5, 1e-6, float eps) inside agrees to ~1e-5
FUNCTIONAL_NORMS = {"rms_norm()": lambda t: torch.nn.functional.rms_norm(t, (t.shape[-1],)),
                    "layer_norm()": lambda t: torch.nn.functional.layer_norm(t, (t.shape[-1],)),
                    "l2_normalize()": lambda t: torch.nn.functional.normalize(t, dim=-1)}  # nGPT's x / ||x||
UNIT_TOL = 1e-9  # rows of an L2-normalised tensor have length 1 to round-off
MEMORY_CAP = 4 * 2**30  # bytes of hooked tensors one batched run may hold (see Tracer.run); --max-memory-gb


def gib(n: float) -> str:
    """Bytes as GiB with three significant digits: a cap of 0.01 GiB reads 0.01, not 0.0."""
    return f"{n / 2**30:.3g} GiB"


class one_thread(contextlib.ContextDecorator):
    """Every probe runs tensors of a few hundred numbers: torch's intra-op threads only contend (on a busy 2-core
    machine one tiny forward took 2.1 s of CPU with 2 threads, 0.05 s with 1). Restores the setting on exit."""

    def __enter__(self):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.threads)


_CAP = [MEMORY_CAP]


@contextlib.contextmanager
def memory_cap(cap: int | None):
    """Within the block, every Tracer refuses runs over ``cap`` bytes (None: keep the current cap)."""
    previous = _CAP[0]
    _CAP[0] = cap or previous
    try:
        yield _CAP[0]
    finally:
        _CAP[0] = previous


class MemoryCapExceeded(RuntimeError):
    """A batched run (or a tiny build) would need more memory than the cap allows: refused before allocating."""


@dataclass
class Call:
    index: int
    name: str
    module: nn.Module
    inp: torch.Tensor
    out: torch.Tensor
    key: tuple = ()  # (name, how many times this module was called before): the same call in every run
    args: tuple = ()  # the call's positional arguments (the routing an experts module is handed)


@dataclass
class SubLayer:
    ins: list[Call]
    out: Call
    mixes: bool = False
    cross: bool = False
    unprojected: list = None  # in-projections whose input already holds this sub-layer's mixed values: the mixing
    # reaches another projection without a projection back to the width of its own (an attention without W_O)
    read: Call | None = None  # where the mixed values are read: the first call after the in-projections whose input
    # an edit at position 0 moves at later positions (a norm on the heads' output before the output projection:
    # DIFF attention's, NormFormer's, BitNet's sub-norm), else the writer
    experts: bool = False  # routed experts, applied by one module with 3-D weights (its inside has no layer)
    reach: list = None  # positions of the writer's input an edit of the in-projections at position 0 moves
    value_pairs: list = None  # values rotated by position (RoPE on v): the (offset, partner) planes each position's
    # one-hot code is read from (see LayerAnalysis.heads and read_input)
    hand: dict | None = None  # routed experts written by hand (a ModuleList of FFNs called on token subsets): this
    # sub-layer is the one expert every token is routed to while the router's output is held (LayerAnalysis)
    feeders: list = None  # projections before the attention's own in-projections whose outputs only it reads
    # (MobileBERT's bottleneck: a projection of the layer's input, then the query reads it): see _merge_feeders
    after: list = None  # parameters applied per head to the mixed values before the writer (DeepSeek-V3's absorbed
    # MLA brings each head's value up from the shared latent after the softmax, einsum('bshc,hdc->bshd')): the value
    # path, not an in-projection; the mixed values are read at the first one's input (see _mixing)


def _rel(a, b) -> float:
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)


def _same(a, b) -> bool:
    return a.shape == b.shape and _rel(a, b) < TOL


def _tokens(t: torch.Tensor, batch: int, lengths) -> tuple[torch.Tensor, object]:
    """(batch, time, ...) whatever the module saw, and how to put an edited copy back in the module's layout:
    OPT's FFN runs on (batch * time, features), Gemma 3's per-head norms on (batch, heads, time, head_dim)."""
    if t.dim() == 2 and t.shape[0] % batch == 0:
        return t.reshape(batch, -1, t.shape[-1]), lambda e: e.reshape(t.shape)
    if t.dim() >= 4 and t.shape[1] not in lengths:
        time = next((i for i in range(2, t.dim()) if t.shape[i] in lengths), None)
        if time is not None:
            return t.movedim(time, 1).contiguous(), lambda e: e.movedim(1, time)
    return t, lambda e: e


def _features(t: torch.Tensor) -> int:
    """Features per token: everything after (batch, time); a per-head norm sees (batch, time, heads, head_dim)."""
    return t[0, 0].numel()


def _is_projection(module: nn.Module, inp) -> bool:
    weight = getattr(module, "weight", None)
    return (isinstance(weight, torch.Tensor) and weight.dim() == 2 and not isinstance(module, nn.Embedding)
            and torch.is_tensor(inp) and inp.is_floating_point() and inp.shape[-1] in weight.shape)


def experts_weights(module: nn.Module) -> list[torch.Tensor]:
    """A module's own weights of 3 dimensions (experts, out, in): routed experts applied without a layer each (not a
    per-head gain or temperature shaped (heads, 1, 1) for broadcasting)."""
    return [p for p in module.parameters(recurse=False) if p.dim() == 3 and min(p.shape[1:]) > 1]


def _is_experts(module: nn.Module, inp, out, width: int, args: tuple = ()) -> bool:
    """Routed experts: 3-D weights, width in and out, and handed one routing row per token (an integer tensor with as
    many rows as tokens, when it is handed integers at all: not a recurrence's position ids, as RecurrentGemma's
    block-diagonal gates are)."""
    tokens = inp.numel() // max(inp.shape[-1], 1) if torch.is_tensor(inp) else None
    integers = [a for a in args[1:] if torch.is_tensor(a) and not a.is_floating_point() and a.dim() >= 1]
    routed = not integers or any(a.numel() // max(a.shape[-1], 1) == tokens for a in integers)
    return (bool(experts_weights(module)) and torch.is_tensor(inp) and inp.is_floating_point()
            and inp.shape[-1] == width and out.shape[-1] == width and routed)


def out_width(module: nn.Module) -> int:
    """Output features of a projection: Linear's out_features, GPT-2 Conv1D's nf, else a Linear-like (out, in)."""
    return next((getattr(module, a) for a in ("out_features", "nf") if isinstance(getattr(module, a, None), int)),
                module.weight.shape[0])


def in_width(module: nn.Module) -> int:
    return next((getattr(module, a) for a in ("in_features", "nx") if isinstance(getattr(module, a, None), int)),
                module.weight.shape[1])


APPLYING = {torch.einsum, torch.matmul, torch.Tensor.matmul, torch._C.TensorBase.matmul, torch.Tensor.__matmul__,
            F.linear}  # the functions a parameter is applied with, outside a layer


class Applied(nn.Module):
    """A parameter of the layer applied by a function outside any layer (torch.einsum, matmul, F.linear), seen as a
    projection from in_features to out_features: the features of its input it contracts, the features it adds."""

    def __init__(self, name: str, in_features: int, out_features: int):
        super().__init__()
        self.name, self.in_features, self.out_features = name, in_features, out_features
        self.weight = torch.empty(out_features, in_features, device="meta")  # the shape only, as a Linear's


def _free_parameters(layer: nn.Module) -> dict:
    """id -> name of the layer's parameters of 2 or more dimensions that no hook sees as a layer's weight: not the
    2-D weight of a module without children (Linear, Conv1D, Embedding), not a convolution's kernel."""
    out = {}
    for mod_name, m in layer.named_modules():
        weight = getattr(m, "weight", None)
        layer_weight = not list(m.children()) and torch.is_tensor(weight) and weight.dim() == 2
        if isinstance(m, nn.modules.conv._ConvNd):
            continue
        for p_name, p in m.named_parameters(recurse=False):
            if p.dim() >= 2 and not (layer_weight and p_name == "weight"):
                out[id(p)] = f"{mod_name}.{p_name}" if mod_name else p_name
    return out


def _einsum_letters(func, args, kwargs, params: dict):
    """(parameter name, data operand, data letters, parameter letters, output letters, parameter) when ``func``
    applies one of ``params`` to one other tensor; matmul(x, W) and F.linear(x, W) read as the einsums they are (W
    second: W @ x projects no feature of x). Else None."""
    if func is torch.einsum:
        eq = args[0] if args and isinstance(args[0], str) else None
        ops = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
        if eq is None or "..." in eq or len(ops) != 2:
            return None
        eq = eq.replace(" ", "")
        lhs, _, rhs = eq.partition("->")
        ins = lhs.split(",")
        if "->" not in eq:
            rhs = "".join(sorted(c for c in set(lhs) if lhs.count(c) == 1 and c != ","))
    elif func is F.linear or func in APPLYING:
        ops = [args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("weight")]
        x, w = ops
        if not (torch.is_tensor(x) and torch.is_tensor(w)) or w.dim() != 2 or x.dim() < 2 or x.dim() > 20:
            return None
        lead = "abcdefghjklmnpqrstuvwxyz"[:x.dim() - 1]
        ins, rhs = [lead + "i", "oi" if func is F.linear else "io"], lead + "o"
    else:
        return None
    if func is not torch.einsum and id(ops[1]) not in params:
        return None
    which = [i for i, t in enumerate(ops) if torch.is_tensor(t) and id(t) in params]
    if len(which) != 1 or not torch.is_tensor(ops[1 - which[0]]) or id(ops[1 - which[0]]) in params:
        return None
    p, d = which[0], 1 - which[0]
    if len(ins) != 2 or len(ins[d]) != ops[d].dim() or len(ins[p]) != ops[p].dim():
        return None
    return params[id(ops[p])], ops[d], ins[d], ins[p], rhs, ops[p]


_SLICING = {torch.Tensor.__getitem__, torch._C.TensorBase.__getitem__}
_DERIVING = _SLICING | {torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.transpose,
                        torch.transpose, torch.Tensor.permute, torch.permute, torch.Tensor.t, torch.t,
                        torch.Tensor.unflatten, torch.Tensor.contiguous, torch.Tensor.split, torch.split,
                        torch.Tensor.chunk, torch.chunk, torch.Tensor.unbind, torch.unbind, torch.Tensor.narrow}


def _index_text(index) -> str:
    """w[:, :16] as ':, :16'."""
    def one(i):
        if isinstance(i, slice):
            text = f"{'' if i.start is None else i.start}:{'' if i.stop is None else i.stop}"
            return text + (f":{i.step}" if i.step is not None else "")
        return "..." if i is Ellipsis else str(i) if isinstance(i, int) else "?"
    return ", ".join(one(i) for i in (index if isinstance(index, tuple) else (index,)))


def base_name(name: str) -> str:
    """The parameter a derived application's name comes from: 'w_qkv' for 'w_qkv[:, 0:64]'."""
    return name.split("[")[0]


class _Applications(TorchFunctionMode):
    """While active, every application of one of ``params`` (see _einsum_letters) is handed to
    ``seen(name, data, data_letters, param_letters, out_letters, param, output)``, which returns the output to use."""

    def __init__(self, params: dict, seen):
        super().__init__()
        self.params, self.seen = dict(params), seen
        self.alive = []  # the derived tensors, kept so that their ids stay theirs during the run

    def _derive(self, func, args, out) -> None:
        """A parameter viewed, reshaped or sliced (a fused w_qkv's columns, DeepSeek-V3's wkv_b.weight viewed per
        head and split): the result is applied as the parameter is, named after it and the slice."""
        name = self.params[id(args[0])]
        if func in _SLICING:
            outs, names = [out], [f"{name}[{_index_text(args[1] if len(args) > 1 else None)}]"]
        elif isinstance(out, (tuple, list)):
            outs, names = list(out), [f"{name}[{i}]" for i in range(len(out))]
        else:
            outs, names = [out], [name]
        for t, n in zip(outs, names):
            if torch.is_tensor(t):
                self.params[id(t)] = n
                self.alive.append(t)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _DERIVING and args and torch.is_tensor(args[0]) and id(args[0]) in self.params:
            self._derive(func, args, out)
            return out
        if func in APPLYING and torch.is_tensor(out):
            found = _einsum_letters(func, args, kwargs, self.params)
            if found is not None:
                out = self.seen(*found, out)
        return out


_DIVIDES = {torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.div_, torch.Tensor.__truediv__,
            torch.Tensor.__itruediv__, torch._C.TensorBase.div, torch._C.TensorBase.__truediv__}
_MULTIPLIES = {torch.mul, torch.Tensor.mul, torch.Tensor.mul_, torch.Tensor.__mul__, torch.Tensor.__rmul__,
               torch.Tensor.__imul__, torch._C.TensorBase.mul, torch._C.TensorBase.__mul__}


def _zero(t) -> torch.Tensor:
    return t == 0 if torch.is_tensor(t) else torch.tensor(t == 0)


def _inf(t) -> torch.Tensor:
    return t.isinf() if torch.is_tensor(t) else torch.tensor(math.isinf(t))


class ZeroOverZero(TorchFunctionMode):
    """A norm written by hand without an epsilon (nGPT's ``x / x.norm(dim=-1, keepdim=True)``, ``x * rsqrt(mean(x^2))``)
    turns the reviewer's zeroed tensors (a silenced sub-layer, queries and keys held at zero) into NaN: 0 / 0, or
    0 * inf. While active, such an element is 0, as F.normalize's clamped norm gives; nothing else changes. Used
    only for a layer whose probed output was NaN (Tracer.guarded)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func in _DIVIDES or func in _MULTIPLIES) and len(args) >= 2 and torch.is_tensor(out) \
                and out.is_floating_point():
            nan = out.isnan()
            if nan.any():
                a, b = args[0], args[1]
                hole = _zero(a) & _zero(b) if func in _DIVIDES else (_zero(a) & _inf(b)) | (_inf(a) & _zero(b))
                out = out.masked_fill_(nan & hole.to(nan.device), 0.0) if func.__name__.endswith("_") \
                    else out.masked_fill(nan & hole.to(nan.device), 0.0)
        return out


def _token_layout(data: torch.Tensor, data_letters: str, out_letters: str, batch: int, lengths) -> tuple | None:
    """(batch letter, time letter) of an application's data operand: the first dimension of the batch's size, then
    the first later one of a sequence's length; both must reach the output. None for anything else (experts applied
    to (experts, tokens, d))."""
    b = next((i for i, n in enumerate(data.shape[:2]) if n == batch), None)
    if b is None:
        return None
    t = next((i for i, n in enumerate(data.shape) if i != b and n in lengths), None)
    if t is None or data_letters[b] not in out_letters or data_letters[t] not in out_letters:
        return None
    return data_letters[b], data_letters[t]


def _to_tokens(t: torch.Tensor, letters: str, b: str, time: str) -> tuple[torch.Tensor, object]:
    """(batch, time, features) of a tensor laid out as ``letters``, and the map back from that."""
    perm = [letters.index(b), letters.index(time)] + [i for i, c in enumerate(letters) if c not in (b, time)]
    moved = t.permute(perm)
    rest, inverse = tuple(moved.shape[2:]), [perm.index(i) for i in range(len(perm))]
    flat = moved.reshape(moved.shape[0], moved.shape[1], -1)
    return flat, lambda e: e.reshape(e.shape[0], e.shape[1], *rest).permute(inverse)


class Tracer:
    """Runs the driver with hooks on every leaf module of the layer; ``edit(call_key, output)`` may change a copy of
    an output, seen as (batch, time, ...), and return it. ``standing`` edits (call key -> f(output)) apply in every
    run, after the run's own edit (the router's output held, see LayerAnalysis._route_to_one_expert).

    The layer's own parameters applied by a function on its tokens (torch.einsum, matmul, F.linear: an attention
    written with einsum on nn.Parameters) are calls too, named after the parameter, found in a first run."""

    def __init__(self, driver, cap: int | None = None):
        self.driver, self.layer = driver, driver.layer
        self.standing = {}
        self.params = {**_free_parameters(self.layer), **self._uncalled_weights()}
        self.modules = {}  # name -> Applied
        self.applied = self._applications() if self.params else set()
        # leaf modules, and modules with 3-D weights (routed experts) as a whole: what runs inside them sees a
        # routing-dependent subset of the tokens, differently in every batch. Not the layer itself, nor a module
        # whose 3-D weights are applied token by token (an einsum attention's)
        experts = [n for n, m in self.layer.named_modules() if n and experts_weights(m)
                   and not all(f"{n}.{k}" in self.applied for k, p in m.named_parameters(recurse=False)
                               if p.dim() == 3)]
        self.leaves = [(n, m) for n, m in self.layer.named_modules() if n  # the layer itself is no call in it
                       and (not list(m.children()) or n in experts) and not any(n.startswith(e + ".") for e in experts)]
        self.cap = cap or _CAP[0]
        self.per_element = None  # bytes the hooked tensors of one batch element take, from the first run
        self.seq_first = self._seq_first_calls() if getattr(driver, "seq_first", False) else set()
        self.guarded = False  # 0/0 read as 0 in every run (ZeroOverZero): set by the first run whose output is NaN

    def drive(self, x) -> torch.Tensor:
        """The driver on x, without hooks, under the zero-norm guard once a run needed it (see run)."""
        with ZeroOverZero() if self.guarded else contextlib.nullcontext():
            y = self.driver(x)
        if not self.guarded and torch.is_tensor(y) and y.is_floating_point() and y.isnan().any():
            self.guarded = True
            return self.drive(x)
        return y

    def _lengths(self) -> set:
        return {self.driver.seq, getattr(self.driver, "memory_seq", None)} - {None}

    def _applications(self) -> set:
        """Names of the free parameters applied to the tokens (a batch of 2 independent inputs, so neither the batch
        nor the time dimension can be mistaken for the other); only those are traced from then on."""
        found, lengths = set(), self._lengths()

        def seen(name, data, dl, pl, ol, param, out):
            if _token_layout(data, dl, ol, 2, lengths) is not None:
                found.add(base_name(name))
            return out

        x = torch.randn(2, self.driver.seq, self.driver.width, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(7))
        try:
            with _Applications(self.params, seen):
                self.driver(x)
        except Exception:  # noqa: BLE001 - read without them: the hooks alone, as before
            return set()
        self.params = {i: n for i, n in self.params.items() if n in found}
        return found

    def _uncalled_weights(self) -> dict:
        """id -> name of the 2-D weights of layers the layer never calls (DeepSeek-V3's absorbed MLA applies
        wkv_b.weight by einsum, the Linear itself never runs): they may be applied as free parameters are."""
        called, handles = set(), []
        for name, m in self.layer.named_modules():
            if name and not list(m.children()) and torch.is_tensor(getattr(m, "weight", None)) \
                    and m.weight.dim() == 2 and not isinstance(m, nn.Embedding):
                handles.append(m.register_forward_hook(lambda mod, a, o, name=name: called.add(name)))
        names = [h for h in handles]
        try:
            self.driver(torch.randn(2, self.driver.seq, self.driver.width, dtype=torch.float64,
                                    generator=torch.Generator().manual_seed(7)))
        except Exception:  # noqa: BLE001 - the first traced run reports the failure
            return {}
        finally:
            for h in names:
                h.remove()
        return {id(m.weight): f"{n}.weight" for n, m in self.layer.named_modules()
                if n and not list(m.children()) and torch.is_tensor(getattr(m, "weight", None))
                and m.weight.dim() == 2 and not isinstance(m, nn.Embedding) and n not in called}

    def _seq_first_calls(self) -> set:
        """(module name, 'in' or 'out') of the hooked tensors laid out (time, batch, ...), read from one run of a
        single batch element, where the layouts cannot be confused: a block driven in torch's default layout keeps
        it in its norms and FFN, while the Q/K/V layers of nn.MultiheadAttention see (batch, time, ...)."""
        found, handles = set(), []
        seq = self.driver.seq

        def hook(module, args, output, name):
            for side, t in (("in", args[0] if args else None), ("out", output)):
                if torch.is_tensor(t) and t.dim() >= 3 and t.shape[0] == seq and t.shape[1] == 1:
                    found.add((name, side))

        for name, module in self.leaves:
            handles.append(module.register_forward_hook(lambda m, a, o, name=name: hook(m, a, o, name)))
        try:
            self.driver(torch.zeros(1, seq, self.driver.width, dtype=torch.float64))
        finally:
            for h in handles:
                h.remove()
        return found

    def run(self, x, edit=None, clone: bool = False) -> tuple[list[Call], torch.Tensor]:
        """``clone``: keep copies of the hooked outputs, not the tensors themselves, which the model may change in
        place after the call (Falcon adds the attention's output into the MLP's: mlp_output += attention_output)."""
        calls, seen, handles, batch = [], {}, [], x.shape[0]
        # the calls keep every hooked input and output; the model's own intermediates take about as much again
        if self.per_element is not None and 2 * batch * self.per_element > self.cap:
            raise MemoryCapExceeded(f"a batched run of {batch} inputs would hold about "
                                    f"{gib(2 * batch * self.per_element)} of activations, over the cap "
                                    f"of {gib(self.cap)} (--max-memory-gb)")
        lengths = self._lengths()
        standing = self.standing

        def edited(key, copy):
            changed = edit(key, copy) if edit is not None else None
            if key in standing:
                changed = standing[key](copy if changed is None else changed)
            return changed

        editing = edit is not None or bool(standing)

        def hook(module, args, output, name):
            if not args or not torch.is_tensor(args[0]) or not torch.is_tensor(output):
                return None
            seen[name] = seen.get(name, -1) + 1
            key = (name, seen[name])
            flip_in, flip_out = (name, "in") in self.seq_first, (name, "out") in self.seq_first
            canon = lambda t, flip: t.transpose(0, 1) if flip else t  # noqa: E731 - (batch, time, ...) for all
            if editing:
                copy, back = _tokens(canon(output.clone(), flip_out), batch, lengths)
                try:
                    changed = edited(key, copy.contiguous())
                except (RuntimeError, IndexError):  # a call on a token subset routed by content (a hand-written
                    changed = None  # MoE's experts): its layout differs from run to run, it is left as it is
                output = output if changed is None else canon(back(changed), flip_out).reshape(output.shape)
            kept = output.detach().clone() if clone else output
            calls.append(Call(len(calls), name, module, _tokens(canon(args[0], flip_in), batch, lengths)[0].detach(),
                              _tokens(canon(kept, flip_out), batch, lengths)[0].detach(), key, tuple(args)))
            return output

        def applied(name, data, dl, pl, ol, param, output):
            layout = _token_layout(data, dl, ol, batch, lengths)
            if layout is None:
                return output
            seen[name] = seen.get(name, -1) + 1
            key = (name, seen[name])
            if name not in self.modules:
                contracted = math.prod(n for c, n in zip(pl, param.shape) if c in dl)
                added = math.prod(n for c, n in zip(pl, param.shape) if c in ol and c not in dl)
                self.modules[name] = Applied(name, contracted, added)
            out_tokens, back = _to_tokens(output, ol, *layout)
            if editing:
                changed = edited(key, out_tokens.clone().contiguous())
                if changed is not None:
                    output = back(changed).contiguous()
                    out_tokens = _to_tokens(output, ol, *layout)[0]
            kept = out_tokens.detach().clone() if clone else out_tokens.detach()
            calls.append(Call(len(calls), name, self.modules[name], _to_tokens(data, dl, *layout)[0].detach(), kept,
                              key, (data,)))
            return output

        for name, module in self.leaves:
            handles.append(module.register_forward_hook(lambda m, a, o, name=name: hook(m, a, o, name)))
        try:
            with ZeroOverZero() if self.guarded else contextlib.nullcontext(), \
                    _Applications(self.params, applied) if self.params else contextlib.nullcontext():
                y = self.driver(x)
        finally:
            for h in handles:
                h.remove()
        if not self.guarded and torch.is_tensor(y) and y.is_floating_point() and y.isnan().any():
            # a norm written without an epsilon met a zeroed tensor: run again with 0/0 read as 0, from now on
            self.guarded = True
            return self.run(x, edit, clone)
        if self.per_element is None:
            self.per_element = sum(c.inp.numel() + c.out.numel() for c in calls) * 8 // max(batch, 1)
        return calls, y

    def inputs_of(self, x, edit=None, clone: bool = False) -> tuple[dict, torch.Tensor]:
        calls, y = self.run(x, edit, clone)
        return {c.key: c for c in calls}, y


def _combination(goal: torch.Tensor, terms: dict) -> dict | None:
    """goal = sum_k c_k terms[k] to round-off: one coefficient per term if that fits, else one per feature (the
    last dimension); None if neither fits. Coefficients are rounded to COEF_DIGITS."""
    if not terms:
        return None
    names = list(terms)
    X = torch.stack([terms[k].reshape(-1, goal.shape[-1]) for k in names], -1)  # (tokens, features, terms)
    t = goal.reshape(-1, goal.shape[-1])
    scale = t.abs().max().clamp_min(1e-30)
    c = torch.linalg.lstsq(X.reshape(-1, len(names)), t.reshape(-1, 1)).solution[:, 0]
    if ((X @ c - t).abs().max() / scale).item() < FIT_TOL:
        return {"per_feature": False, "coefficients": {k: round(v, COEF_DIGITS) for k, v in zip(names, c.tolist())}}
    if X.shape[0] <= len(names):
        return None
    per = torch.linalg.lstsq(X.transpose(0, 1), t.transpose(0, 1)[..., None]).solution[..., 0]  # (features, terms)
    if ((torch.einsum("nfk,fk->nf", X, per) - t).abs().max() / scale).item() >= FIT_TOL:
        return None
    per = per.T  # (terms, features)
    return {"per_feature": True,
            "coefficients": {k: round(v.mean().item(), COEF_DIGITS) for k, v in zip(names, per)},
            "range": {k: [round(v.min().item(), COEF_DIGITS), round(v.max().item(), COEF_DIGITS)]
                      for k, v in zip(names, per)}}


def _scaled_activation(outs: list, target: torch.Tensor, name: str) -> dict | None:
    """target = c_up * act(c * gate) * up (gated; either output the gate) or c_up * act(c * h) (plain), with scalars
    c and c_up: c by a search over its logarithm (a grid, then golden section on the misfit), c_up by least squares.
    {'activation_input': c, 'output': c_up} when the fit is exact to ACT_TOL, else None."""
    act = ACTIVATIONS[name]
    if name == "identity":
        return None
    orders = [(outs[0], None)] if len(outs) == 1 else [(outs[0], outs[1]), (outs[1], outs[0])]
    t = target.reshape(-1)
    for gate, up in orders:
        def misfit(logc, gate=gate, up=up):
            f = act(math.exp(logc) * gate)
            f = (f if up is None else f * up).reshape(-1)
            c_up = (f @ t / (f @ f).clamp_min(1e-300)).item()
            return (t - c_up * f).abs().max().item() / max(t.abs().max().item(), 1e-30), c_up
        grid = [math.log(10) * (i / 20 - 3) for i in range(121)]  # c from 1e-3 to 1e3
        values = [misfit(v)[0] for v in grid]
        i = min(range(len(grid)), key=values.__getitem__)
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
        r = (math.sqrt(5) - 1) / 2
        for _ in range(80):
            m1, m2 = hi - r * (hi - lo), lo + r * (hi - lo)
            if misfit(m1)[0] < misfit(m2)[0]:
                hi = m2
            else:
                lo = m1
        best = (lo + hi) / 2
        err, c_up = misfit(best)
        if err < ACT_TOL and abs(best) > 1e-6:  # c = 1 is the plain reading, tried before
            return {"activation_input": round(math.exp(best), 6), "output": round(c_up, 6)}
    return None


def _value_or_gate(flat: torch.Tensor, f: int, role: str, offset: int | None) -> None:
    """Feature f of a (batch, time, features) edit: a value becomes the one-hot code of its offset's position (the
    writer then reads the attention weights), a per-token gate is held at GATE_VALUE; anything else is left."""
    if role in ("v", "kv"):
        flat[..., f] = (torch.arange(flat.shape[1]) == offset).to(flat.dtype) if offset is not None else 0.0
    elif role == "gate":
        flat[..., f] = GATE_VALUE


def _role_edit(roles: dict, offsets: dict, query, key_):
    """A Tracer edit for the attention probes: each query feature set by query(flat, key, f), each key feature by
    key_(flat, key, f), values and gates by _value_or_gate; calls with no roles left as they are."""
    def edit(key, out):
        if key not in roles:
            return None
        flat = out.view(out.shape[0], out.shape[1], -1)
        for f, role in enumerate(roles[key]):
            if role == "q":
                query(flat, key, f)
            elif role == "k":
                key_(flat, key, f)
            else:
                _value_or_gate(flat, f, role, offsets.get((key, f)))
        return out
    return edit


def _look_alike(patterns: torch.Tensor) -> str | None:
    """Weights that are no softmax's, with queries and keys silenced, each row the same weight on every visible key:
    'sigmoid' (one weight for every key of every row: each weight stands alone, sigmoid attention), 'sinks' (row i
    with n_i visible keys weighs each 1 / (n_i + c) with one c > 0 per head: a softmax with an extra logit per head,
    the attention sinks of gpt-oss, whose weights are dropped); None for anything else."""
    kinds = set()
    for head in patterns:
        rows = []
        for row in head:
            seen = row[row > VISIBLE]
            if not len(seen):
                continue
            if (seen.max() - seen.min()).item() > SUM_TOL * seen.max().item():
                return None  # not one weight per row
            rows.append((len(seen), seen.mean().item()))
        if len({n for n, _ in rows}) < 2:
            return None
        weights = [w for _, w in rows]
        extra = [1 / w - n for n, w in rows]
        if max(weights) - min(weights) <= SUM_TOL * max(weights):
            kinds.add("sigmoid")
        elif max(extra) - min(extra) <= SUM_TOL * max(1.0, max(abs(e) for e in extra)) and min(extra) > SUM_TOL:
            kinds.add("sinks")
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


def _distributions(patterns: torch.Tensor) -> bool:
    """(heads, T, S) read-off weights: some visible, none negative, every row with weight summing to the same value."""
    visible = patterns.abs() > VISIBLE
    if not visible.any() or (patterns < -SUM_TOL).any():
        return False
    sums = patterns.sum(-1)[visible.any(-1)]
    return bool(((sums - sums.mean()).abs() <= SUM_TOL * sums.mean().abs()).all() and sums.mean() > 0)


ROUTE_LOGIT = 1000.0  # the held router output: +1000 for expert 0, -1000 for the others; softmax, sigmoid, top-k
# before or after either, renormalised or not: weight 1 on expert 0 and exactly 0 elsewhere (exp(-2000) is 0)


def hand_written_experts(a: LayerAnalysis) -> dict | None:
    """Modules of one container (a ModuleList 'experts.0', 'experts.1', ...) called on subsets of the tokens chosen
    by content: routed experts written by hand. How many (the container's length), and how many per token when every
    token is routed alike (the rows the experts' first calls read, over the tokens)."""
    memory = getattr(a.driver, "memory_seq", None)
    tokens = a.x.shape[0] * a.seq

    def member(c: Call) -> tuple | None:
        parts = c.name.split(".")
        at = next((i for i, p in enumerate(parts) if p.isdigit()), None)
        return (".".join(parts[:at]), parts[at]) if at else None

    subsets = {}
    for c in a.calls:
        if c.inp.dim() >= 2 and c.inp.shape[-2] not in (a.seq, memory) and member(c):
            subsets.setdefault(member(c), c)
    if not subsets:
        return None
    container = max({k for k, _ in subsets}, key=lambda k: sum(1 for c, _ in subsets if c == k))
    # every expert's first call, those that happened to get as many rows as a sequence has too
    firsts = {}
    for c in a.calls:
        if member(c) and member(c)[0] == container:
            firsts.setdefault(member(c), c)
    rows = sum(c.inp[..., 0].numel() for c in firsts.values())
    module = dict(a.driver.layer.named_modules()).get(container)
    return {"container": container, "experts": len(module) if hasattr(module, "__len__") else
            len({i for k, i in firsts if k == container}),
            "per_token": rows // tokens if rows % tokens == 0 else None}


class _OtherTokens:
    """A model driver that runs the model on other token ids (the layer's input still replaced by x)."""

    def __init__(self, driver, ids):
        self._driver, self._ids = driver, ids

    def __getattr__(self, name):
        return getattr(self._driver, name)

    def __call__(self, x):
        return self._driver(x, ids=self._ids)


class LayerAnalysis:
    """Everything the data flow says about one layer (see the module docstring)."""

    def __init__(self, driver, seed: int = 0, cap: int | None = None):
        self._start(driver, seed, cap)
        # routed experts written by hand: read from the natural run, then every token routed to one expert
        self.hand_experts = hand_written_experts(self)
        self.unrouted = None  # why the hand-written experts could not be read through one expert
        self.routing = self._route_to_one_expert() if self.hand_experts else None
        self.projections = [c for c in self.calls if _is_projection(c.module, c.inp)
                            or _is_experts(c.module, c.inp, c.out, self.width, c.args)]
        self.norm_calls = [c for c in self.calls if c not in self.projections and c.out.shape == c.inp.shape
                           and c.inp.shape[-1] > 1 and self._is_norm(c)]
        self.depends = self._dependencies()
        self.sublayers = self._sublayers()
        if self.routing:
            self._keep_routed_expert()
        self._mixing()
        if self._merge_feeders():
            self._mixing()

    def _router(self) -> Call | None:
        """The projection that routes the hand-written experts: called before the first of them on every token, with
        one output per expert, and reading the very rows the experts are handed (each expert's input is a subset of
        its input's rows)."""
        container, n = self.hand_experts["container"], self.hand_experts["experts"]
        inside = [c for c in self.calls if c.name.startswith(container + ".")]
        if not inside:
            return None
        first = inside[0].index
        firsts = {}
        for c in inside:
            firsts.setdefault(c.name[len(container) + 1:].split(".")[0], c)
        for c in reversed(self.calls[:first]):
            if not (_is_projection(c.module, c.inp) and c.inp.shape[:2] == (self.x.shape[0], self.seq)
                    and c.out.shape[-1] == n):
                continue
            rows = c.inp.reshape(-1, c.inp.shape[-1])
            scale = rows.abs().max().clamp_min(1e-30)
            if all(e.inp.shape[-1] == rows.shape[-1] and (e.inp.reshape(-1, rows.shape[-1])[:, None, :] - rows[None])
                   .abs().amax(-1).min(-1).values.max().item() <= TOL * scale for e in firsts.values()):
                return c
        return None

    def _route_to_one_expert(self) -> dict | None:
        """Hand-written experts are called on the tokens routed to them, a different subset in every run: nothing
        can be compared from run to run. With the router's output held at ROUTE_LOGIT for expert 0 and -ROUTE_LOGIT
        for the others (a standing edit, in every run from here on), every token goes to the same experts with weight
        1 on one of them: that expert is called on every token, in order, and is the FFN to read. Kept only if
        exactly one expert then moves the output when silenced and every expert call reads every token; else the
        natural run stays (the FFN is then not read, and the review says why)."""
        router = self._router()
        if router is None:
            self.unrouted = ("no router found: no projection before them, on every token, with one output per expert "
                             "and the rows the experts are handed")
            return None

        def hold(out):
            out = torch.full_like(out, -ROUTE_LOGIT)
            out[..., 0] = ROUTE_LOGIT
            return out

        self.tracer.standing = {router.key: hold}
        container = self.hand_experts["container"]
        calls, y = self.tracer.run(self.x)
        inside = [c for c in calls if c.name.startswith(container + ".")]
        called = list(dict.fromkeys(c.name[len(container) + 1:].split(".")[0] for c in inside))
        experts = dict(dict(self.driver.layer.named_modules())[container].named_children())
        live = []
        for e in called:
            handle = experts[e].register_forward_hook(
                lambda m, a, o: torch.zeros_like(o) if torch.is_tensor(o) else None)
            try:
                _, silenced = self.tracer.run(self.x)
            finally:
                handle.remove()
            if _rel(silenced, y) > TOL:
                live.append(e)
        partial = [c.name for c in inside if c.inp.shape[:2] != (self.x.shape[0], self.seq)]
        if len(live) != 1 or partial:
            self.unrouted = (f"with the output of '{router.name}' held for one expert, "
                             + (f"'{partial[0]}' was still handed a subset of the tokens (experts that choose their "
                                "tokens, or a capacity)" if partial else
                                f"{len(live)} experts moved the output when silenced, not one"))
            self.tracer.standing = {}
            return None
        self.calls, self.y = calls, y
        return {"router": router.name, "expert": f"{container}.{live[0]}", "held_logit": ROUTE_LOGIT,
                "experts_called": [f"{container}.{e}" for e in called]}

    def _keep_routed_expert(self) -> None:
        """The sub-layer of the expert every token is routed to stands for the experts (SubLayer.hand); the other
        experts called, at weight exactly 0, are dropped: they add nothing to the output."""
        container, live = self.hand_experts["container"], self.routing["expert"]
        kept = []
        for g in self.sublayers:
            # the router's output is held: it feeds nothing now, and is no input of a sub-layer
            g.ins = [c for c in g.ins if c.name != self.routing["router"]] or g.ins
            if g.out.name.startswith(live + "."):
                g.hand = {**self.hand_experts, **self.routing}
            elif g.out.name.startswith(container + "."):
                continue
            kept.append(g)
        self.sublayers = kept

    def _start(self, driver, seed: int, cap: int | None) -> None:
        self.driver, self.width, self.seq, self.seed = driver, driver.width, driver.seq, seed
        self.generator = torch.Generator().manual_seed(seed)
        self.tracer = Tracer(driver, cap)
        self.x = self.randn(1, self.seq, self.width)
        self.calls, self.y = self.tracer.run(self.x)

    @classmethod
    def light(cls, driver, seed: int = 0, cap: int | None = None) -> LayerAnalysis:
        """One traced run and nothing else: for the cheap probes (reach, position_aware) on every layer."""
        a = cls.__new__(cls)
        a._start(driver, seed, cap)
        return a

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.float64, generator=self.generator)

    def _is_norm(self, call: Call) -> bool:
        try:
            return norm_kind(call.module, call.inp.shape[-1], self.generator) in ("layernorm", "rmsnorm")
        except (TypeError, RuntimeError):  # needs more than one tensor (a rotary table, an attention kernel)
            return False

    def batch(self, n: int) -> torch.Tensor:
        return self.x.expand(n, -1, -1).clone()

    # --- which call feeds which ------------------------------------------------------------------

    def _dependencies(self) -> dict:
        """depends[(i, j)]: perturbing projection i's output changes call j's input (j later than i)."""
        keys = [c.key for c in self.projections]
        noise = {k: self.randn(*c.out.shape[1:]) * c.out.abs().max().clamp_min(1) for k, c in
                 zip(keys, self.projections)}

        def edit(key, out):
            if key in noise:
                out[keys.index(key) + 1] += noise[key]
                return out
            return None

        traced, _ = self.tracer.inputs_of(self.batch(len(keys) + 1), edit)
        out = {}
        for i, source in enumerate(self.projections):
            for c in self.calls[source.index + 1:]:
                inp = traced[c.key].inp if c.key in traced else None
                if inp is not None and inp.shape[0] == len(keys) + 1:  # routed calls see a token subset: skipped
                    out[(source.key, c.key)] = _rel(inp[i + 1], inp[0]) > TOL
        return out

    def _sublayers(self) -> list[SubLayer]:
        groups, current = [], []
        for call in self.projections:
            if _is_experts(call.module, call.inp, call.out, self.width, call.args):  # the whole sub-layer in one call
                groups.append(SubLayer(ins=[call], out=call, experts=True))
                continue
            feeds = [c for c in current if self.depends.get((c.key, call.key))]
            # a parameter applied per head (DeepSeek-V3's wkv_b slices, 'bshd,hdc->bshc') writes no token of the
            # model's width even where heads x its output fill it: only what it adds to each token counts
            per_head = isinstance(call.module, Applied) and call.module.out_features != self.width
            if feeds and call.out.shape[-1] == self.width and not per_head:
                groups.append(SubLayer(ins=current, out=call))
                current = []
            else:
                current.append(call)
        memory = getattr(self.driver, "memory_seq", None)
        for g in groups:
            g.cross = memory is not None and any(c.inp.shape[-2] == memory != self.seq for c in g.ins)
        return groups

    def _mixing(self) -> None:
        """An edit of the in-projections' outputs at position 0 reaches the writer's input at later positions."""
        if not self.sublayers:
            return
        owner = {c.key: i for i, g in enumerate(self.sublayers) for c in g.ins}

        def edit(key, out):
            if key not in owner:
                return None
            out[owner[key] + 1, 0] += self.randn(out.shape[-1]) * out.abs().max().clamp_min(1)
            return out

        traced, _ = self.tracer.inputs_of(self.batch(len(self.sublayers) + 1), edit)
        for i, g in enumerate(self.sublayers):
            inp = traced[g.out.key].inp
            g.mixes = _rel(inp[i + 1, 1:], inp[0, 1:]) > TOL
            if g.mixes and not g.after:
                # a parameter applied per head (it adds fewer features than the width) to values the mixing already
                # moved at later positions: each head's value brought up after the weighted sum (absorbed MLA)
                g.after = [c for c in g.ins[1:] if isinstance(c.module, Applied) and c.module.out_features != self.width
                           and _rel(traced[c.key].inp[i + 1, 1:], traced[c.key].inp[0, 1:]) > TOL]
                g.ins = [c for c in g.ins if c not in g.after]
            # how far its own mixing carries position 0 (the layer's reach adds what the sub-layers after it mix)
            scale = inp[0].abs().max().clamp_min(1e-30)
            g.reach = [t for t in range(inp.shape[1]) if ((inp[i + 1, t] - inp[0, t]).abs().max() / scale) > TOL]
            # an in-projection reading a model-width tensor that the mixing already moved: the next sub-layer reads
            # the stream with the unprojected values in it (a Mamba scan's x_proj reads its convolution's inner
            # width: that is the mixer's own work)
            g.unprojected = [c.name for c in g.ins[1:] if traced[c.key].inp.shape[-1] == self.width
                             and _rel(traced[c.key].inp[i + 1, 1:], traced[c.key].inp[0, 1:]) > TOL] if g.mixes else []
            # a call that carries the mixed values on to the writer: as many features as the writer reads, and
            # dependent on every in-projection (not the attention weights a dropout reads)
            # (a per-token gate that joins after it, RetNet's swish(W_g x) after its GroupNorm, need not feed it)
            between = [c for c in self.calls if g.ins[-1].index < c.index < g.out.index and c.key in traced
                       and traced[c.key].inp.dim() >= 2 and traced[c.key].inp.shape[:2] == inp.shape[:2]
                       and _features(traced[c.key].inp) == inp.shape[-1]
                       and any(self.depends.get((p.key, c.key)) for p in g.ins)
                       and self._own_position_only(g, [p for p in g.ins if not self.depends.get((p.key, c.key))])]
            g.read = g.after[0] if g.after else next(
                (c for c in between if _rel(traced[c.key].inp[i + 1, 1:], traced[c.key].inp[0, 1:]) > TOL),
                g.out) if g.mixes else g.out

    def _own_position_only(self, g: SubLayer, ins: list) -> bool:
        """Each of these in-projections, edited at position 0 alone, moves the writer's input at position 0 only:
        a per-token gate on the mixed values, no part of the mixing (True for none)."""
        if not ins:
            return True
        rows = {c.key: b for b, c in enumerate(ins, start=1)}

        def edit(key, out):
            if key not in rows:
                return None
            out[rows[key], 0] += self.randn(out.shape[-1]) * out.abs().max().clamp_min(1)
            return out

        traced, _ = self.tracer.inputs_of(self.batch(len(ins) + 1), edit)
        inp = traced[g.out.key].inp
        return all(_rel(inp[b, 1:], inp[0, 1:]) <= TOL for b in rows.values())

    def streams(self) -> dict | None:
        """Several residual streams side by side in the layer's input (hyper-connections: x holds n streams of width
        / n, each sub-layer reads a learned mix of them and each stream gets a learned mix back): with every
        projection's output zeroed the output is x M, M = A kron I (one weight per pair of streams). The smallest
        n >= 2 whose stream width some projection reads, with A not a multiple of the identity; else None."""
        keys = {c.key for c in self.projections}
        w = self.width
        x = torch.randn(max(FIT_BATCH, 2 * w // self.seq + 1), self.seq, w, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(self.seed + 3))
        _, y = self.tracer.run(x, lambda key, out: torch.zeros_like(out) if key in keys else None)
        X, Y = x.reshape(-1, w), y.reshape(-1, w)
        M = torch.linalg.lstsq(X, Y).solution
        if _rel(X @ M, Y) > FIT_TOL:
            return None
        reads = {in_width(c.module) for c in self.projections}
        for n in range(2, w + 1):
            size = w // n
            if w % n or size not in reads:
                continue
            blocks = M.reshape(n, size, n, size).permute(0, 2, 1, 3)  # (i, j, size, size)
            A = blocks.diagonal(dim1=-2, dim2=-1).mean(-1)
            eye = torch.eye(size, dtype=M.dtype)
            if _rel(blocks, A[..., None, None] * eye, ) > FIT_TOL * 10 or _rel(A, A[0, 0] * torch.eye(n, dtype=M.dtype)) \
                    <= FIT_TOL:
                continue
            return {"streams": n, "width": size,
                    "mixing": [[round(v, COEF_DIGITS) for v in row] for row in A.tolist()]}
        return None

    def reads_outside(self) -> list[SubLayer]:
        """The sub-layers whose writer reads, besides what their in-projections make of the layer's input, something
        the model computed from its tokens elsewhere: with the layer's input held and the model's tokens changed, the
        in-projections' outputs hold still and the writer's input moves (keys and values an earlier layer stored:
        Gemma 3n's shared KV). Only for a driver that runs a whole model on its token ids."""
        ids = getattr(self.driver, "ids", None)
        if not torch.is_tensor(ids) or "ids" not in inspect.signature(self.driver.__call__).parameters:
            return []
        driver = self.tracer.driver
        try:
            self.tracer.driver = _OtherTokens(driver, torch.flip(ids, dims=[-1]))
            changed, _ = self.tracer.inputs_of(self.x)
        finally:
            self.tracer.driver = driver
        plain, _ = self.tracer.inputs_of(self.x)

        def held(c):
            return c.key in changed and c.key in plain and _same(changed[c.key].out, plain[c.key].out)

        return [g for g in self.sublayers if all(held(c) for c in g.ins) and g.out.key in changed
                and not _same(changed[g.out.key].inp, plain[g.out.key].inp)]

    def _merge_feeders(self) -> bool:
        """A per-token sub-layer just before a token-mixing one is the mixing one's input side when its writer's
        output feeds the mixing writer's input and reaches nothing else: with the mixing writer silenced, an edit of
        it moves no output. MobileBERT's layer projects its input through a bottleneck ('bottleneck.attention.dense')
        that its query projection reads: query, key and value are then all the width of the layer, and the query
        would read as the writer of a sub-layer of its own. A sub-layer whose output is on the residual stream
        (Macaron's first FFN, a convolution before the attention) still moves the output: it stays. Returns whether
        any was merged; the merged projections are the sub-layer's ``feeders``."""
        merged = False
        for i in range(len(self.sublayers) - 1, 0, -1):
            g, p = self.sublayers[i], self.sublayers[i - 1]
            if not g.mixes or g.cross or p.mixes or p.experts or p.hand \
                    or not self.depends.get((p.out.key, g.out.key)):
                continue
            noise = self.randn(*p.out.out.shape[1:]) * p.out.out.abs().max().clamp_min(1)

            def edit(key, out, g=g, p=p, noise=noise):
                if key == g.out.key:
                    return torch.zeros_like(out)
                if key == p.out.key:
                    out[1] += noise
                    return out
                return None

            _, y = self.tracer.run(self.batch(2), edit)
            if _rel(y[1], y[0]) <= TOL:
                g.feeders = [*p.ins, p.out, *(g.feeders or [])]
                g.ins = [*p.ins, p.out, *g.ins]
                del self.sublayers[i - 1]
                merged = True
        return merged

    def read_input(self, traced: dict, g: SubLayer) -> torch.Tensor:
        """The mixed values as the attention hands them on, (batch, time, features): the read point's input. Where the
        values are rotated by position (g.value_pairs), each position's one-hot code sits in one rotary plane: its
        weight is the length of the plane's output, put back at the column of that position."""
        o = traced[g.read.key].inp.flatten(2)
        if not g.value_pairs:
            return o
        hd = g.value_pairs[0][2]
        out = torch.zeros_like(o)
        for h in range(o.shape[-1] // hd):
            for j, (a, b, _) in enumerate(g.value_pairs):
                out[..., h * hd + j] = torch.hypot(o[..., h * hd + a], o[..., h * hd + b])
        return out

    @property
    def attentions(self) -> list[SubLayer]:
        return [g for g in self.sublayers if g.mixes]

    @property
    def ffns(self) -> list[SubLayer]:
        return [g for g in self.sublayers if not g.mixes]

    # --- attention heads -------------------------------------------------------------------------

    def beside_values(self, g: SubLayer) -> list[Call]:
        """Convolutions inside the attention, between its in-projections and where its mixed values are read, that
        read an in-projection's output: a path beside the attention weights (Nystromformer's depthwise convolution
        over the values, added to the heads' output). The heads are read with their output zeroed (silenced)."""
        if not g.mixes:
            return []
        end = (g.read or g.out).index
        return [c for c in self.calls if g.ins[0].index < c.index < end
                and isinstance(c.module, nn.modules.conv._ConvNd) and c not in self.projections
                and any(self.depends.get((p.key, c.key)) for p in g.ins)]

    @contextlib.contextmanager
    def silenced(self, calls: list[Call]):
        """Within the block every run zeroes these calls' outputs (a standing edit, see Tracer)."""
        kept = dict(self.tracer.standing)
        for c in calls:
            self.tracer.standing[c.key] = torch.zeros_like
        try:
            yield
        finally:
            self.tracer.standing = kept

    def mixing_inputs(self, g: SubLayer) -> tuple[list[Call], dict]:
        """Where the per-token work of an attention ends: the in-projections, and the QK-norms that read them (a norm
        over all heads at once, OLMo 2's, ties every query feature before it to every head). Also, per in-projection,
        the norms its features may feed."""
        inner = [n for n in self.norm_calls if g.ins[0].index < n.index < (g.read or g.out).index]
        latent = {c.key for c in self.latents(g, absorbed=False) + self.bottleneck(g)}
        feeds = {c.key: [n for n in inner if self.depends.get((c.key, n.key))] for c in g.ins if c.key not in latent}
        return [*[c for c in g.ins if c.key not in latent],
                *[n for n in inner if n.key not in latent and any(n in f for f in feeds.values())]], feeds

    def bottleneck(self, g: SubLayer) -> list[Call]:
        """The feeders (see _merge_feeders) whose output another in-projection of the attention reads: they project
        the layer's input for it (a bottleneck), their features are no head's."""
        return [c for c in g.feeders or [] if any(self.depends.get((c.key, d.key)) for d in g.ins if d.index > c.index)]

    def latents(self, g: SubLayer, absorbed: bool = True) -> list[Call]:
        """Multi-head latent attention's down-projections (narrower out than in) whose output another in-projection
        of the sub-layer reads, and the norms on them: each token's shared latent, from which every head's keys and
        values come up. Their features are no head's: left out of the head count, and no QK-norm. ``absorbed``: also
        those the value path after the mixing reads (g.after, absorbed MLA): there the latent is read as the keys
        and values themselves, so the head probes keep it (absorbed=False)."""
        after = (g.after or []) if absorbed else []
        down = [c for c in g.ins if not g.experts and getattr(c.module, "weight", None) is not None
                and c.module.weight.dim() == 2 and out_width(c.module) < in_width(c.module)
                and not (isinstance(c.module, Applied) and c.module.out_features != self.width)  # per head: no share
                and any(self.depends.get((c.key, d.key)) for d in [*g.ins, *after] if d.index > c.index)]
        norms = [n for n in self.norm_calls if any(self.depends.get((c.key, n.key)) for c in down)
                 and (any(_same(n.out.flatten(2), d.inp.flatten(2)) for d in g.ins)  # (B, T, 1, r): DeepSeek's
                      or (after and n.index < (g.read or g.out).index))]
        return down + norms

    def heads(self, g: SubLayer) -> dict:
        """Per feature entering the attention, the writer-input features it moves; head_dim, heads and K/V heads from
        them. A projection feature that feeds a QK-norm is read after that norm instead."""
        points, feeds = self.mixing_inputs(g)
        features = [(c.key, f) for c in points for f in range(_features(c.out))]
        n = len(features)
        where = {}
        for b, (key, f) in enumerate(features, start=1):
            where.setdefault(key, []).append((b, f))

        def edit(key, out):
            if key not in where:
                return None
            flat, scale = out.view(out.shape[0], out.shape[1], -1), out.abs().max().clamp_min(1)
            for b, f in where[key]:
                flat[b, :, f] += self.randn(out.shape[1]) * scale
                flat[b + n, 0, f] += scale  # position 0 only: a query moves its own row, a key later rows too
            return out

        traced, _ = self.tracer.inputs_of(self.batch(2 * n + 1), edit)
        g.value_pairs = None
        o_in = self.read_input(traced, g)
        base, scale = o_in[0], o_in[0].abs().max().clamp_min(1e-30)
        moved = ((o_in[1:n + 1] - base).abs().amax(dim=1) / scale) > TOL  # (features, o_width)
        later = ((o_in[n + 1:, 1:] - base[1:]).abs().amax(dim=(1, 2)) / scale) > TOL  # (features,)
        blocks, roles = [], []
        for b, ((key, f), row) in enumerate(zip(features, moved), start=1):
            normed = any(_rel(traced[c.key].inp[b], traced[c.key].inp[0]) > TOL for c in feeds.get(key, []))
            idx = row.nonzero().flatten().tolist()
            contiguous = len(idx) > 1 and idx == list(range(idx[0], idx[-1] + 1))
            # a value feature at position 0 reaches later rows; a feature that moves only its own row's column is
            # a per-token gate on the attention output (Qwen3-Next's, Gemma 3n's)
            roles.append("normed" if normed else ("k" if later[b - 1] else "q") if contiguous else
                         ("v" if later[b - 1] else "gate") if idx else "none")
            if contiguous and not normed:
                blocks.append(len(idx))
        o_width = o_in.shape[-1]
        if not blocks:
            return {"measured": False, "o_width": o_width}
        head_dim, widest = min(blocks), max(blocks)
        heads = o_width // head_dim
        kv_heads = max(1, heads // (widest // head_dim))
        v_offsets, queries = {}, {}
        for (key, f), row, role in zip(features, moved, roles):
            if role == "v":
                v_offsets[(key, f)] = row.nonzero().flatten()[0].item() % head_dim
            if role == "q":
                queries.setdefault(row.nonzero().flatten()[0].item() // head_dim, []).append((key, f))
        out = {"measured": True, "head_dim": head_dim, "heads": heads, "kv_heads": kv_heads, "o_width": o_width,
               "in_width": sum(c.out.shape[-1] for c in g.ins), "probed_at": [c.name for c in points],
               "roles": {key: [r for (k, _), r in zip(features, roles) if k == key] for key in where},
               "v_offsets": v_offsets}
        if queries and not any(r == "v" for r in roles) and "k" in roles:
            # keys that are values too (one tensor both: absorbed MLA's latent, shared by every head)
            for b, cols in self._shared_key_values(g, features, roles).items():
                offsets = {c % head_dim for c in cols}
                if len(offsets) == 1 and len(cols) == heads:
                    key, f = features[b]
                    out["roles"][key][f] = "kv"
                    v_offsets[(key, f)] = offsets.pop()
            shared = sum(r == "kv" for rs in out["roles"].values() for r in rs)
            if shared and g.after:
                # each head's keys are the latent seen through its own query-side slice, each head's values the
                # latent brought up by its own slice after the mixing: as many K/V heads as query heads (MLA's
                # count); in the latent itself, one shared by all
                out["absorbed_latent"] = {"width": shared, "kv_heads_in_latent": kv_heads,
                                          "values_brought_up_by": [c.name for c in g.after]}
                out["kv_heads"] = heads
        gates = self._logit_bias_features(g, out)
        if gates:
            # features that move a head's weights with every key zero: no query, a bias on the logits computed
            # from the tokens (FoX's forget gate, sum of log sigmoid(w_f . x) between key and query): left as
            # computed in every probe, named in the evidence
            for key, f in gates:
                out["roles"][key][f] = "bias"
            queries = {h: [q for q in qs if q not in gates] for h, qs in queries.items()}
            queries = {h: qs for h, qs in queries.items() if qs}
            out["logit_bias_from"] = sorted({c.name for c in points for key, _ in gates if c.key == key})
        self._rotated_values(g, out, features, moved, roles, head_dim)
        out["maps_per_head"] = self._maps_per_head(g, queries)
        if not {"v", "kv"} & {r for rs in out["roles"].values() for r in rs} and queries:
            # no value projection: the heads average the in-projections' input itself; read through the norm that
            # makes it (its features are the values, head by head), when there is one of the heads' width
            stream_in = self.stream_input(g)
            source = next((n for n in self.norm_calls if n.index < stream_in.index and _same(n.out, stream_in.inp)
                           and _features(n.out) == o_width), None)
            out["no_value_projection"] = True
            if source is not None:
                out["values_from"] = source.name
                out["roles"][source.key] = ["v"] * o_width
                out["v_offsets"].update({(source.key, f): f % head_dim for f in range(o_width)})
        return out

    def _shared_key_values(self, g: SubLayer, features: list, roles: list) -> dict:
        """Key features that still move the heads' output with every query feature zero (q.k is then 0 whatever the
        key, and the weights uniform): they are read as values too. Feature index -> the read-off columns it moves."""
        ks = [b for b, r in enumerate(roles) if r == "k"]
        zero, where = {}, {}
        for (key, f), r in zip(features, roles):
            if r == "q":
                zero.setdefault(key, []).append(f)
        for j, b in enumerate(ks, start=1):
            where.setdefault(features[b][0], []).append((j, features[b][1]))

        def edit(key, out):
            if key not in zero and key not in where:
                return None
            flat, scale = out.view(out.shape[0], out.shape[1], -1), out.abs().max().clamp_min(1)
            for f in zero.get(key, []):
                flat[..., f] = 0.0
            for j, f in where.get(key, []):
                flat[j, :, f] += self.randn(out.shape[1]) * scale
            return out

        traced, _ = self.tracer.inputs_of(self.batch(len(ks) + 1), edit)
        o = self.read_input(traced, g)
        base, scale = o[0], o[0].abs().max().clamp_min(1e-30)
        found = {}
        for j, b in enumerate(ks, start=1):
            cols = (((o[j] - base).abs().amax(0) / scale) > TOL).nonzero().flatten().tolist()
            if cols:
                found[b] = cols
        return found

    def _logit_bias_features(self, g: SubLayer, heads: dict) -> list:
        """(key, feature) of the query-like features that still move the heads' output with every key feature
        zero (q.k is then 0 whatever the query): a bias on the logits, not a query. Each in-projection's query
        features are moved together first; only one that moves anything is tried feature by feature."""
        roles = heads["roles"]
        if not any("k" in rs for rs in roles.values()) or any("kv" in rs for rs in roles.values()):
            return []  # keys that are values too cannot be zeroed alone
        qkeys = [k for k, rs in roles.items() if "q" in rs]
        # a latent's keys are keys too (DeepSeek's RoPE key k_pe leaves the latent's down-projection unprobed): the
        # latent is zeroed with them, and the values are set as one-hot codes of their positions
        latent = {c.key for c in self.latents(g, absorbed=False)}

        def probe(groups):  # groups: list of [(key, f)], one batch element each after the base
            def edit(key, out):
                if key in latent:
                    return torch.zeros_like(out)
                if key not in roles:
                    return None
                flat, scale = out.view(out.shape[0], out.shape[1], -1), out.abs().max().clamp_min(1)
                for f, role in enumerate(roles[key]):
                    if role == "k":
                        flat[..., f] = 0.0
                    elif role == "v" and latent:
                        _value_or_gate(flat, f, role, heads["v_offsets"].get((key, f)))
                for b, group in enumerate(groups, start=1):
                    for k, f in group:
                        if k == key:
                            flat[b, :, f] += scale
                return out
            traced, _ = self.tracer.inputs_of(self.batch(len(groups) + 1), edit)
            o_in = self.read_input(traced, g)
            return [_rel(o_in[b], o_in[0]) > TOL for b in range(1, len(groups) + 1)]

        whole = [[(k, f) for f, r in enumerate(roles[k]) if r == "q"] for k in qkeys]
        found = []
        for group, moves in zip(whole, probe(whole)):
            if moves:
                found += [q for q, m in zip(group, probe([[q] for q in group])) if m]
        return found if len(found) < sum(len(gr) for gr in whole) else []

    def _rotated_values(self, g: SubLayer, out: dict, features, moved, roles, head_dim: int) -> None:
        """Values rotated by position (RoPE applied to v): every value feature moves two offsets of its head, its
        own and its rotary partner's, the offsets paired one to one. Each position's one-hot code then goes to the
        first feature of one plane (the other feature of the plane is held at zero) and is read back as the length
        of that plane's output (read_input), so the weights read as they would without the rotation."""
        planes = {}
        for (key, f), row, role in zip(features, moved, roles):
            if role != "v":
                continue
            moves = row.nonzero().flatten().tolist()
            cols = tuple(sorted({c % head_dim for c in moves}))
            if len(cols) != 2:
                return
            planes.setdefault((tuple(sorted({c // head_dim for c in moves})), cols), []).append((key, f))
        pairs = sorted({cols for _, cols in planes})
        offsets = [c for cols in pairs for c in cols]
        if not planes or len(offsets) != len(set(offsets)) or any(len(v) != 2 for v in planes.values()):
            return
        for (_, cols), feats in planes.items():
            for i, (key, f) in enumerate(sorted(feats)):
                out["v_offsets"][(key, f)] = pairs.index(cols) if i == 0 else None
        g.value_pairs = [(a, b, head_dim) for a, b in pairs]
        out["values_rotated"] = {"planes": [[a, b] for a, b in pairs]}

    def keys_rotated(self, g: SubLayer, heads: dict) -> bool | None:
        """With one query feature and the same key feature at ROTARY_PROBE at every position (all others zero), a
        logit moves along a row only if the keys turn with their position: rotated queries alone change every logit
        of a row alike, which the softmax does not see."""
        pairs = g.value_pairs
        if not pairs:
            return None
        a = pairs[0][0]
        qs = [(k, f) for k, rs in heads["roles"].items() for f, r in enumerate(rs) if r == "q" and f % pairs[0][2] == a]
        ks = [(k, f) for k, rs in heads["roles"].items() for f, r in enumerate(rs) if r == "k" and f % pairs[0][2] == a]
        if not qs or not ks:
            return None

        def query(flat, key, f):
            flat[..., f] = ROTARY_PROBE if (key, f) == qs[0] else 0.0

        def key_(flat, key, f):
            flat[..., f] = ROTARY_PROBE if (key, f) in ks else 0.0

        traced, _ = self.tracer.inputs_of(self.batch(1), _role_edit(heads["roles"], heads["v_offsets"], query, key_))
        hd, length = heads["head_dim"], max(c.inp.shape[-2] for c in g.ins)
        w = self.read_input(traced, g)[0, :, :length]  # head 0: (T, S)
        spread = 0.0
        for row in w:
            seen = row[row > VISIBLE]
            if len(seen) > 1:
                spread = max(spread, (seen.log() - seen.log().max()).abs().max().item())
        return spread > ROTARY_TOL

    def _maps_per_head(self, g: SubLayer, queries: dict) -> int:
        """2 when each head's output is the sum of two separate softmax readings (differential attention: each half
        of a head's query features has a softmax of its own), else 1. With the keys and values as they are, queries
        zero (element 0), only the first half of each head's query features (1), only the second half (2), all (3):
        two separate softmaxes add, O3 - O1 - O2 + O0 = 0; one softmax over the summed logits does not."""
        halves = {}
        for feats in queries.values():
            if len(feats) < 2:
                return 1
            for part, half in enumerate((feats[:len(feats) // 2], feats[len(feats) // 2:]), start=1):
                for key, f in half:
                    halves.setdefault(key, {})[f] = part
        if not halves:
            return 1

        def edit(key, out):
            if key not in halves:
                return None
            flat = out.view(out.shape[0], out.shape[1], -1)
            for f, part in halves[key].items():
                flat[0, :, f] = 0.0
                flat[3 - part, :, f] = 0.0  # element 1 keeps part 1, element 2 part 2
            return out

        traced, _ = self.tracer.inputs_of(self.batch(4), edit)
        o = self.read_input(traced, g)
        rest = o[3] - o[1] - o[2] + o[0]
        scale = (o[3] - o[0]).abs().max().clamp_min(1e-30)
        return 2 if (rest.abs().max() / scale).item() < SUM_TOL else 1

    # --- attention pattern with queries and keys silenced ----------------------------------------

    def position_bias(self, g: SubLayer, heads: dict) -> dict:
        """softmax(bias + mask) per head, read off the writer's input when values are one-hot position codes."""
        if not heads.get("measured") or heads["head_dim"] < max(c.inp.shape[-2] for c in g.ins):
            return {"measured": False}
        roles, offsets = heads["roles"], heads["v_offsets"]

        def edit(key, out):  # batch row b: values of amplitude b + 1
            if key not in roles:
                return None
            flat = out.view(out.shape[0], out.shape[1], -1)
            amplitude = torch.arange(1, out.shape[0] + 1, dtype=out.dtype)[:, None]
            for f, role in enumerate(roles[key]):
                if role in ("q", "k"):
                    flat[..., f] = 0.0
                elif role in ("v", "kv"):
                    offset = offsets[(key, f)]
                    flat[..., f] = 0.0 if offset is None else \
                        amplitude * (torch.arange(out.shape[1]) == offset).to(out.dtype)
                elif role == "gate":
                    flat[..., f] = GATE_VALUE
            return out

        traced, _ = self.tracer.inputs_of(self.batch(2), edit)
        hd, length = heads["head_dim"], max(c.inp.shape[-2] for c in g.ins)
        both = [torch.stack([o_in[:, h * hd:h * hd + length] for h in range(heads["heads"])])  # (H, T, S)
                for o_in in self.read_input(traced, g)[:2]]
        patterns = both[0]
        # softmax attention with queries and keys silenced averages the visible values: each row is a distribution
        # (non-negative, the same sum on every row: one, or the output gate's value); linear attention reads its
        # state through the (silenced) queries: nothing; a state-space scan (Mamba) only its skip term D x after its
        # short convolution: weights of either sign
        # and the weights apply to the values linearly: doubled values, doubled output (a norm after a scan, as in
        # Mamba-2's gated RMSNorm, undoes the doubling)
        linear_in_values = bool((both[1] - 2 * both[0]).abs().max() <= SUM_TOL * both[0].abs().max())
        softmax = _distributions(patterns) and linear_in_values
        uniform = True
        for row in patterns.flatten(0, 1):
            seen = row[row > VISIBLE]
            if len(seen) > 1 and (seen.log() - seen.log().max()).abs().max().item() > TOL:
                uniform = False
        linear = not uniform and not g.cross and self._per_head_linear(patterns)
        kind = "none" if uniform else "alibi" if linear else "relative-bias"
        weights = "softmax" if softmax else _look_alike(patterns) if linear_in_values else None
        if weights == "softmax" and heads.get("maps_per_head", 1) == 1:
            curvature = self._log_curvature(g, heads)
            if curvature is not None and curvature > CURVATURE_TOL:
                weights = "normalised-linear"  # rows of a distribution at q = 0, but not exp(q.k) (elu + 1 ...)
            softmax = weights == "softmax"
        return {"measured": True, "kind": kind, "uniform": uniform, "linear_in_distance": linear, "softmax": softmax,
                "weights": weights}

    def query_axis(self, g: SubLayer, heads: dict) -> bool:
        """The weights normalised over the queries, softmax(dim=-2), not over the keys. Heads whose query features
        move every later row when edited at position 0 (no feature reads as a query) are read with queries and keys
        as the block computes them and each value a one-hot code of its position: the writer then reads each head's
        weights, and under such a softmax every column (a key, over the queries that see it) is a distribution and
        the rows are not."""
        length = max(c.inp.shape[-2] for c in g.ins)
        roles = heads.get("roles") or {}
        if not heads.get("measured") or heads["head_dim"] < length or not any("v" in r or "kv" in r for r in roles.values()):
            return False

        def keep(flat, key, f):
            return None

        traced, _ = self.tracer.inputs_of(self.batch(1), _role_edit(roles, heads["v_offsets"], keep, keep))
        hd, o = heads["head_dim"], self.read_input(traced, g)[0]
        w = torch.stack([o[:, h * hd:h * hd + length] for h in range(heads["heads"])])  # (H, T, S)
        return _distributions(w.transpose(-1, -2)) and not _distributions(w)

    def logit_scale(self, g: SubLayer, heads: dict) -> float | None:
        """What q.k is divided by: one query feature of head 0 set to SCALE_PROBE everywhere, every key feature set to
        SCALE_PROBE at the last position only (the same position: a rotation cancels), values one-hot position
        codes; the last row's log-weight of the last key over the first's, against the same with keys zero (any
        bias cancels), is SCALE_PROBE**2 / scale. sqrt(head_dim) is the usual scale, head_dim muP's, 1 T5's."""
        queries = [(key, f) for key, rs in heads["roles"].items() for f, r in enumerate(rs) if r == "q"]
        if not queries or heads.get("maps_per_head", 1) != 1:
            return None
        first = queries[0]

        def query(flat, key, f):
            flat[..., f] = SCALE_PROBE if (key, f) == first else 0.0

        def key_(flat, key, f):
            flat[..., f] = 0.0
            flat[1, -1, f] = SCALE_PROBE

        traced, _ = self.tracer.inputs_of(self.batch(2), _role_edit(heads["roles"], heads["v_offsets"], query, key_))
        hd = heads["head_dim"]
        row = self.read_input(traced, g)[:, -1, :hd]  # head 0 (the first query feature's, in the usual layouts)
        last = min(row.shape[-1], max(c.inp.shape[-2] for c in g.ins)) - 1
        if (row[:, [0, last]] <= 0).any():
            return None
        shift = (row[1, last] / row[1, 0]).log() - (row[0, last] / row[0, 0]).log()
        return SCALE_PROBE ** 2 / shift.item() if shift.item() > 0 else None

    def _logit_shift(self, g: SubLayer, heads: dict, amplitude: float) -> float | None:
        """The logit_scale probe at another amplitude: the last row's log-weight of the last key over the first's,
        against the same with keys zero, with one query feature and every key feature at ``amplitude``."""
        queries = [(key, f) for key, rs in heads["roles"].items() for f, r in enumerate(rs) if r == "q"]
        if not queries or heads.get("maps_per_head", 1) != 1:
            return None
        first = queries[0]

        def query(flat, key, f):
            flat[..., f] = amplitude if (key, f) == first else 0.0

        def key_(flat, key, f):
            flat[..., f] = 0.0
            flat[1, -1, f] = amplitude

        traced, _ = self.tracer.inputs_of(self.batch(2), _role_edit(heads["roles"], heads["v_offsets"], query, key_))
        row = self.read_input(traced, g)[:, -1, :heads["head_dim"]]
        last = min(row.shape[-1], max(c.inp.shape[-2] for c in g.ins)) - 1
        if (row[:, [0, last]] <= 0).any():
            return None
        return ((row[1, last] / row[1, 0]).log() - (row[0, last] / row[0, 0]).log()).item()

    def logit_cap(self, g: SubLayer, heads: dict, scale: float) -> dict | None:
        """A soft cap on the scores (Gemma 2's c * tanh(s / c)): the logit the scale probe makes, s = q.k / scale, set
        to each of CAP_LOGITS; without a cap the weights show s itself, under a tanh cap c * tanh(s / c). The scale
        itself was read at a logit of about 1, where a cap bends it a little: the divisor and c are fitted together
        (a few rounds, each c from the divisor before it). None when every logit shows as set (no cap); the cap and
        the divisor when one c fits all three to CAP_TOL; else what was seen."""
        amplitudes = [math.sqrt(s * scale) for s in CAP_LOGITS]
        largest = self._logit_shift(g, heads, amplitudes[-1])  # a tanh cap bends the largest logit most: first
        if largest is None or abs(largest / CAP_LOGITS[-1] - 1) < CAP_LINEAR_TOL:
            return None
        seen = [self._logit_shift(g, heads, a) for a in amplitudes[:-1]] + [largest]
        if any(v is None for v in seen):
            return None
        raw = {"logits_set": list(CAP_LOGITS), "logits_seen": [round(v, 6) for v in seen]}
        if any(b <= a * (1 + CAP_TOL) for a, b in zip(seen, seen[1:])):
            return None  # the logit does not follow the queries' and keys' size (a QK-norm without a module): no cap
        shift0, divisor, caps = SCALE_PROBE ** 2 / scale, scale, []
        for _ in range(20):
            caps = []
            for a, shift in zip(amplitudes, seen):
                s = a * a / divisor
                if not 0 < shift < s:
                    return {"cap": None, **raw}
                lo, hi = shift, 1e9  # c * tanh(s / c) grows with c towards s
                for _ in range(200):
                    mid = math.sqrt(lo * hi)
                    lo, hi = (mid, hi) if mid * math.tanh(s / mid) < shift else (lo, mid)
                caps.append(math.sqrt(lo * hi))
            c = sum(caps) / len(caps)
            if not shift0 < c:
                return {"cap": None, **raw}
            divisor = SCALE_PROBE ** 2 / (c * math.atanh(shift0 / c))
        if max(caps) - min(caps) > CAP_TOL * max(caps):
            return {"cap": None, **raw}
        return {"cap": round(c, 3), "form": "tanh", "divisor": round(divisor, COEF_DIGITS), **raw}

    def scale_is_learned(self, g: SubLayer, heads: dict, scale: float) -> bool:
        """Whether a parameter of the layer sets the logit scale (a learned temperature, Swin v2's logit_scale): the
        scale measured again with every parameter but the projections' weights moved by SCALE_NUDGE."""
        weights = {id(c.module.weight) for c in self.projections if isinstance(getattr(c.module, "weight", None),
                                                                                  torch.Tensor)}
        moved = [p for p in self.driver.layer.parameters() if id(p) not in weights and p.is_floating_point()]
        if not moved:
            return False
        kept = [p.detach().clone() for p in moved]
        try:
            with torch.no_grad():
                for p in moved:
                    p.add_(SCALE_NUDGE)
            again = self.logit_scale(g, heads)
        finally:
            with torch.no_grad():
                for p, k in zip(moved, kept):
                    p.copy_(k)
        return again is None or abs(again / scale - 1) > 1e-3

    def _log_curvature(self, g: SubLayer, heads: dict) -> float | None:
        """Softmax weights are exp(q.k + bias) / Z(q): log w(u) + log w(-u) - log w(v) - log w(-v) is the same for
        every key of a row (q.k and the bias cancel, only the Z terms are left), whatever the bias, mask, rotation
        or temperature. Every query and key head-slice has zero mean and unit RMS (u, -u, v, -v alike), so a
        QK-norm without a module of its own (nanochat's F.rms_norm after RoPE) leaves them as they are; values are
        one-hot position codes. The largest spread of that sum along a row: a normalised linear attention (elu + 1
        feature maps) spreads by ~1e-1; None where a weight is not positive (nothing to take the log of)."""
        gen = torch.Generator().manual_seed(self.seed + 2)
        hd, drawn = heads["head_dim"], {}

        def unit(rows: int, key, role: str) -> torch.Tensor:
            """(rows, features) draws for the key's features of this role: each head_dim chunk zero-mean, RMS 1."""
            if (key, role) not in drawn:
                idx = [f for f, r in enumerate(heads["roles"][key]) if r == role]
                t = torch.zeros(rows, len(heads["roles"][key]), dtype=torch.float64)
                for start in range(0, len(idx), hd):
                    chunk = idx[start:start + hd]
                    z = torch.randn(rows, len(chunk), dtype=torch.float64, generator=gen)
                    z = z - z.mean(-1, keepdim=True) if len(chunk) > 1 else z
                    t[:, chunk] = z / z.square().mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
                drawn[(key, role)] = t
            return drawn[(key, role)]

        def query(flat, key, f):
            u, v = unit(2, key, "q")[:, f].to(flat.dtype)
            flat[..., f] = torch.stack([u, -u, v, -v])[:, None]

        def key_(flat, key, f):
            flat[..., f] = unit(flat.shape[1], key, "k")[:, f].to(flat.dtype)

        traced, _ = self.tracer.inputs_of(self.batch(4), _role_edit(heads["roles"], heads["v_offsets"], query, key_))
        hd, length = heads["head_dim"], max(c.inp.shape[-2] for c in g.ins)
        w = torch.stack([self.read_input(traced, g)[:, :, h * hd:h * hd + length] for h in range(heads["heads"])])
        visible = w[:, 0] > VISIBLE  # (H, T, S)
        if (w.transpose(0, 1)[:, visible] <= 0).any():
            return None
        logs = w.clamp_min(1e-300).log()
        d = logs[:, 0] + logs[:, 1] - logs[:, 2] - logs[:, 3]  # (H, T, S)
        spread = 0.0
        for row, seen in zip(d.flatten(0, 1), visible.flatten(0, 1)):
            if seen.sum() > 1:
                spread = max(spread, (row[seen].max() - row[seen].min()).item())
        return spread

    def offsets_apart(self, g: SubLayer, heads: dict) -> bool:
        """The rotary probe's premise, for a mixer without a softmax: query features pair with key features offset
        by offset. A query at one offset moves nothing (against every query zero) while every key is zero, and moves
        the output once every key is set: at each offset. Not so in a Mamba-2 scan read through its heads (its
        state's features are no query-key pairs): the probe cannot be read there."""
        hd = heads["head_dim"]

        def moved(keys: float) -> list[bool]:
            def query(flat, key, f):
                flat[..., f] = 0.0
                flat[1 + f % hd, :, f] = ROTARY_PROBE

            def key_(flat, key, f):
                flat[..., f] = keys

            traced, _ = self.tracer.inputs_of(self.batch(hd + 1), _role_edit(heads["roles"], heads["v_offsets"],
                                                                              query, key_))
            o_in = self.read_input(traced, g)
            return [(o_in[1 + a] - o_in[0]).abs().max().item() > ROTARY_TOL for a in range(hd)]

        return not any(moved(0.0)) and all(moved(ROTARY_PROBE)) and self._bilinear(g, heads)

    def _bilinear(self, g: SubLayer, heads: dict) -> bool:
        """The output moves with q.k, linearly in the queries and in the keys (RetNet's (q k^T * D) v): with queries
        Q and keys K drawn at random, doubling either doubles the change from queries zero. A feature map or a norm
        on them (a gated DeltaNet's L2-normalised q and k, a scan's SiLU after its convolution) breaks it, and with it
        the rotary probe's reading of a query at one offset meeting keys at the others."""
        draws = {}

        def drawn(key, f, role, n):
            if (key, f) not in draws:
                draws[(key, f)] = self.randn(n)
            return draws[(key, f)]

        def query(flat, key, f):
            q = drawn(key, f, "q", flat.shape[1])
            flat[..., f] = torch.stack([0 * q, q, q, 2 * q])[:, :]

        def key_(flat, key, f):
            k = drawn(key, f, "k", flat.shape[1])
            flat[..., f] = torch.stack([k, k, 2 * k, k])

        traced, _ = self.tracer.inputs_of(self.batch(4), _role_edit(heads["roles"], heads["v_offsets"], query, key_))
        o = self.read_input(traced, g)
        base = o[1] - o[0]
        scale = base.abs().max().clamp_min(1e-30)
        return bool(scale > 1e-12) and all(((o[b] - o[0]) - 2 * base).abs().max() <= 1e-6 * scale for b in (2, 3))

    def rotary_fraction(self, g: SubLayer, heads: dict) -> float | None:
        """Which offsets of a head are rotated by position. Per offset a: queries ROTARY_PROBE at a and 0 elsewhere,
        keys ROTARY_PROBE everywhere but a. Unrotated, the query meets only zeros (uniform attention); rotated,
        RoPE turns a towards its partner offset, and the logits become ROTARY_PROBE**2 sin(theta_i - theta_j):
        first order in the angle, so even the slowest pair shows through a float32 softmax."""
        if not heads.get("measured") or heads["head_dim"] < max(c.inp.shape[-2] for c in g.ins):
            return None
        fraction = self._rotary_probe(g, heads, heads["roles"])
        before_norm = self._roles_before_qk_norm(g, heads["roles"])
        if not fraction and before_norm is not None:
            # a QK-norm after the rotation (HunYuan, nanochat: rope, then norm) hides it from edits after the norm:
            # the same probe on the projections' outputs, before both (a norm keeps a zero feature zero)
            fraction = self._rotary_probe(g, heads, before_norm)
        n = {r: sum(x == r for rs in heads["roles"].values() for x in rs) for r in ("k", "kv")}
        if fraction and n["kv"]:
            # keys that are values too (absorbed MLA's latent) carry no rotation the probe can set: the rotated part
            # is of the keys alone (DeepSeek's decoupled RoPE key), a share of every key feature
            fraction *= n["k"] / (n["k"] + n["kv"])
        return fraction

    def _roles_before_qk_norm(self, g: SubLayer, roles: dict) -> dict | None:
        """The query/key roles of the QK-norms' features moved to the projection features that feed them one to
        one (the same count, in the same order); None where there is no such QK-norm."""
        _, feeds = self.mixing_inputs(g)
        moved = {k: list(r) for k, r in roles.items()}
        changed = False
        for key, norms in feeds.items():
            for n in norms:
                if n.key not in moved or key not in moved:
                    continue
                normed = [f for f, r in enumerate(moved[key]) if r == "normed"]
                if len(normed) == len(moved[n.key]):
                    for f, role in zip(normed, moved[n.key]):
                        moved[key][f] = role
                    moved[n.key] = ["none"] * len(moved[n.key])
                    changed = True
        return moved if changed else None

    def _latent_queries(self, heads: dict, roles: dict, g: SubLayer) -> set:
        """(key, feature) of the query features whose logits are made with keys that are values too (absorbed MLA's
        latent, held at one-hot position codes in the probes): with every other key zero, each alone at
        ROTARY_PROBE still moves the weights. The rotary probe leaves them at zero: their partner keys cannot be set."""
        qs = [(k, f) for k, rs in roles.items() for f, r in enumerate(rs) if r == "q"]
        if not any("kv" in rs for rs in roles.values()) or not qs:
            return set()
        row = {q: b for b, q in enumerate(qs, start=1)}

        def query(flat, key, f):
            flat[..., f] = 0.0
            flat[row[(key, f)], :, f] = ROTARY_PROBE

        def key_(flat, key, f):
            flat[..., f] = 0.0

        traced, _ = self.tracer.inputs_of(self.batch(len(qs) + 1), _role_edit(roles, heads["v_offsets"], query, key_))
        o_in = self.read_input(traced, g)
        return {q for q, b in row.items() if (o_in[b] - o_in[0]).abs().max().item() > ROTARY_TOL}

    def _rotary_probe(self, g: SubLayer, heads: dict, roles: dict) -> float:
        hd = heads["head_dim"]
        queries = sum(r == "q" for rs in roles.values() for r in rs)
        latent_keys = any(r == "kv" for rs in roles.values() for r in rs)  # absorbed MLA: the probe below, as is
        if not latent_keys and queries % heads["heads"] == 0 and queries // heads["heads"] > hd:
            return self._rotary_probe_wide(g, heads, roles, queries // heads["heads"])
        latent = self._latent_queries(heads, roles, g)

        def query(flat, key, f):  # element 0 keeps every query zero: the uniform attention the mask allows
            flat[..., f] = 0.0
            if (key, f) not in latent:
                flat[1 + f % hd, :, f] = ROTARY_PROBE

        def key_(flat, key, f):
            flat[..., f] = ROTARY_PROBE
            flat[1 + f % hd, :, f] = 0.0

        traced, _ = self.tracer.inputs_of(self.batch(hd + 1), _role_edit(roles, heads["v_offsets"], query, key_))
        o_in = self.read_input(traced, g)
        rotated = [a for a in range(hd) if (o_in[1 + a] - o_in[0]).abs().max().item() > ROTARY_TOL]
        return len(rotated) / hd

    def _rotary_probe_wide(self, g: SubLayer, heads: dict, roles: dict, width: int) -> float:
        """A query head wider than a value head (DeepSeek's MLA: 128 query features meet the keys from the latent, 64
        a rotated key of its own, computed from the layer's input, that no probed feature sets): the share of each
        query head's features that is rotated. Per query offset a: that query feature at ROTARY_PROBE, every other
        query zero, every probed key feature ROTARY_PROBE at every position, and the layer's input the same token at
        every position, so that every key, set or computed, is the same vector at every position before any rotation.
        Unrotated, the logits are then the same for every key (uniform attention); rotated, they depend on the
        positions' offset, and the weights move."""
        def query(flat, key, f):
            flat[..., f] = 0.0
            flat[1 + f % width, :, f] = ROTARY_PROBE

        def key_(flat, key, f):
            flat[..., f] = ROTARY_PROBE

        x = self.batch(width + 1)
        x[:] = x[:, :1]
        traced, _ = self.tracer.inputs_of(x, _role_edit(roles, heads["v_offsets"], query, key_))
        o_in = self.read_input(traced, g)
        rotated = [a for a in range(width) if (o_in[1 + a] - o_in[0]).abs().max().item() > ROTARY_TOL]
        return len(rotated) / width

    @staticmethod
    def _per_head_linear(patterns) -> bool:
        """log A(i, j) - log A(i, i) = -m_h |i - j| with one slope per head (ALiBi)."""
        for pattern in patterns:
            slopes = []
            for i in range(pattern.shape[0]):
                for j in range(pattern.shape[1]):
                    if i != j and i < pattern.shape[1] and min(pattern[i, j], pattern[i, i]) > VISIBLE:
                        slopes.append(((pattern[i, j].log() - pattern[i, i].log()) / abs(i - j)).item())
            if slopes and max(slopes) - min(slopes) > SLOPE_TOL * max(1.0, max(abs(s) for s in slopes)):
                return False
        return True

    # --- in-layer position, causality ------------------------------------------------------------

    def position_aware(self, causal: bool) -> bool:
        """Tokens rotated by one place (never the identity): a layer without positions permutes its output alike."""
        if causal:  # the last token sees a set of earlier tokens; without positions their order cannot matter
            perm = torch.cat([torch.arange(self.seq - 1).roll(1), torch.tensor([self.seq - 1])])
            moved = self.tracer.drive(self.x[:, perm])[:, -1]
            return _rel(moved, self.y[:, -1]) > TOL
        perm = torch.arange(self.seq).roll(1)
        return _rel(self.tracer.drive(self.x[:, perm]), self.y[:, perm]) > TOL

    def reach(self) -> list[int]:
        """The positions whose output moves when only position 0's input does: all of them for full attention
        (or a recurrence), the first few for a sliding window or a short convolution."""
        x = self.batch(2)
        x[1, 0] += self.randn(self.width)
        y = self.tracer.drive(x)
        scale = y[0].abs().max().clamp_min(1e-30)
        return [t for t in range(self.seq) if ((y[1, t] - y[0, t]).abs().max() / scale).item() > TOL]

    def causal(self) -> dict:
        cuts = (self.seq - 1, self.seq // 2, 1)
        x = self.batch(len(cuts) + 1)
        for b, cut in enumerate(cuts, start=1):
            x[b, cut:] += self.randn(self.seq - cut, self.width)
        y = self.tracer.drive(x)
        leak = max(_rel(y[b, :cut], y[0, :cut]) for b, cut in enumerate(cuts, start=1))
        return {"causal": leak <= TOL, "max_leak": leak}

    def leak_reach(self) -> dict:
        """How far ahead the output reads: one input per position t, changed at t alone; the earliest earlier output
        position that moves gives t's reach back (reach = the most positions ahead any output reads)."""
        T = self.seq
        x = self.batch(T + 1)
        for t in range(T):
            x[t + 1, t] += self.randn(self.width) * x[0].abs().max().clamp_min(1)
        y = self.tracer.drive(x)
        scale = y[0].abs().max().clamp_min(1e-30)
        reach, rows = 0, {}
        for t in range(1, T):
            moved = [s for s in range(t) if ((y[t + 1, s] - y[0, s]).abs().max() / scale).item() > TOL]
            if moved:
                rows[t] = moved
                reach = max(reach, t - moved[0])
        return {"positions_ahead": reach, "read_by": {t: rows[t] for t in sorted(rows)}}

    def locate_leak(self, heads: dict | None = None) -> dict:
        """Where a future leak starts: later positions of the input changed, the earliest hooked tensor whose earlier
        positions move. A module whose input holds still while its output moves reads later positions itself (a
        convolution padded on both sides, a norm over time); a call whose input moves while every earlier output
        held still is preceded by code outside any module that does (a mask, a softmax, a reshape). Inside the
        attention (``heads`` measured): whether later queries or later keys and values reach earlier rows, and
        with values one-hot codes of their positions whether the weights give later keys weight (a mask off by r)
        or not (the normalisation reads every key before the mask zeroes them), and whether the rows sum alike."""
        T, cut = self.seq, self.seq // 2
        x = self.batch(2)
        x[1, cut:] += self.randn(T - cut, self.width) * x[0].abs().max().clamp_min(1)
        calls, y = self.tracer.run(x)

        def moves(t):
            if t.dim() == 3 and t.shape[0] == 2 and t.shape[1] != T and t.shape[2] == T:
                t = t.transpose(1, 2)  # (batch, channels, time): a Conv1d's layout
            if t.dim() < 2 or t.shape[0] != 2 or t.shape[1] != T:
                return False
            return _rel(t[1, :cut], t[0, :cut]) > TOL

        out = {**self.leak_reach()}
        origin = None
        for c in calls:
            if moves(c.inp):
                origin = {"kind": "code", "before": c.name, "index": c.index}
                break
            if moves(c.out):
                origin = {"kind": "module", "module": c.name, "index": c.index,
                          "type": type(c.module).__name__}
                break
        if origin is None:
            origin = {"kind": "code", "before": None, "index": len(calls)}  # after the last hooked call
        where = next((g for g in self.sublayers if g.ins[0].index <= origin["index"] <= g.out.index), None)
        if where is not None:
            origin["sublayer"] = where.out.name
            origin["mixes_tokens"] = where.mixes
        out["origin"] = origin
        if where is not None and where.mixes and heads and heads.get("measured") and origin["kind"] == "code":
            out["attention"] = self._attention_leak(where, heads)
        return out

    def _attention_leak(self, g: SubLayer, heads: dict) -> dict:
        """Which of the attention's inputs carries the leak, and what its weights do with later keys."""
        T, cut = self.seq, self.seq // 2
        roles = heads["roles"]
        noise = {key: self.randn(3, T, len(r)) for key, r in roles.items()}

        def edit(key, out):
            if key not in roles:
                return None
            flat = out.view(out.shape[0], out.shape[1], -1)
            for f, role in enumerate(roles[key]):
                b = 1 if role == "q" else 2 if role in ("k", "v", "kv") else None
                if b is not None:
                    flat[b, cut:, f] += noise[key][b, cut:, f] * flat[0].abs().max().clamp_min(1)
            return out

        traced, _ = self.tracer.inputs_of(self.batch(3), edit)
        o = traced[g.read.key].inp.flatten(2)
        found = {"later_queries_move_earlier_rows": _rel(o[1, :cut], o[0, :cut]) > TOL,
                 "later_keys_or_values_move_earlier_rows": _rel(o[2, :cut], o[0, :cut]) > TOL}
        length = max(c.inp.shape[-2] for c in g.ins)
        if heads["head_dim"] >= length:
            def keep(flat, key, f):  # queries and keys as computed: silenced, a norm over the scores divides 0 by 0
                return None

            traced, _ = self.tracer.inputs_of(self.batch(1), _role_edit(roles, heads["v_offsets"], keep, keep))
            hd, o = heads["head_dim"], self.read_input(traced, g)[0]
            w = torch.stack([o[:, h * hd:h * hd + length] for h in range(heads["heads"])])  # (H, T, S)
            ahead = [s - t for t in range(min(T, w.shape[1])) for s in range(t + 1, w.shape[2])
                     if (w[:, t, s].abs() > SUM_TOL * w[:, t].abs().max().clamp_min(1e-30)).any()]
            found["weights_on_later_keys"] = max(ahead) if ahead else 0
            sums = w.sum(-1)
            found["rows_sum_alike"] = bool((sums - sums[:, -1:]).abs().max() <= SUM_TOL * sums.abs().max())
        return found

    # --- residuals, norms, FFN -------------------------------------------------------------------

    def residual_kept(self, g: SubLayer) -> bool:
        """Its writer silenced, does the layer's output still depend on the input?"""
        x = self.batch(2)
        x[1] += self.randn(self.seq, self.width)
        y = self.driver_with_zero(g.out.key, x)
        return _rel(y[1], y[0]) > TOL

    def normalised_residual(self, g: SubLayer) -> str | None:
        """The input norm N whose output the residual carries, h = N(h) + F(N(h)): a later tensor (a call's input or
        the layer's output) is N's output plus the sub-layer's. Not a post-norm block's second sub-layer, whose input
        norm is the norm of the sum before it (norm(h + F(h)) feeds the FFN and its residual): only a norm of the
        raw stream counts. None when the residual carries the raw stream.
        A norm of an earlier sum counts as a post-norm only when that sum adds the earlier sub-layer's output to what
        the sub-layer itself read (norm(h + F(h)), DeepNorm's norm(alpha h + F(h)), or h = N(h) + F(N(h)) before):
        after a pre-norm sub-layer, x + F(norm(x)), the stream is x, and a norm of that sum is the next sub-layer's
        input norm, whose output added back is the normalised stream."""
        stream_in = self.stream_input(g)
        sums = {n.key for o in self.sublayers if o.out.index < g.out.index for n in self._sum_norms(o)
                if self._sums_own_input(n, o)}
        later = [c.inp for c in self.calls if c.index > g.out.index] + [self.y]
        for n in self.norm_calls:
            if n.index < stream_in.index and n.key not in sums and _same(n.out, stream_in.inp) \
                    and n.out.shape == g.out.out.shape:
                total = n.out + g.out.out
                if any(_same(t, total) for t in later):
                    return n.name
        return None

    def driver_with_zero(self, key, x):
        _, y = self.tracer.run(x, lambda k, out: torch.zeros_like(out) if k == key else None)
        return y

    def _sum_norms(self, g: SubLayer) -> list[Call]:
        """Norms (outside the sub-layers) of an affine combination of the stream and the sub-layer's output:
        norm(h + F(h)), DeepNorm's norm(alpha h + F(h)), Admin's norm(omega * h + F(h)), B2T's norm(h + F(h) + x)."""
        return [n for n in self.norm_calls if n.index > g.out.index and n.inp.shape == g.out.out.shape
                and not self._inside(n) and self.stream_sum(n.key, g) is not None]

    def _sums_own_input(self, n: Call, g: SubLayer) -> bool:
        """The sum norm ``n`` reads (see _sum_norms) has, besides g's output, a term that is g's own input (the
        stream a post-norm sub-layer reads as it is), not only the input of a pre-norm before it."""
        fit = self.stream_sum(n.key, g)
        if fit is None:
            return False
        traced = self._fit_run()[0]
        stream = self.stream_input(g)
        if stream.key not in traced:
            return False
        own = traced[stream.key].inp
        terms = {"x": self._fit_run()[1],
                 **{(c.name if c.key[1] == 0 else f"{c.name}#{c.key[1]}"): traced[c.key].out
                    for c in self.calls if c.key in traced}}
        return any(k in terms and terms[k].shape == own.shape and _same(terms[k], own)
                   for k in fit["coefficients"] if k != fit["branch"])

    def _inside(self, c: Call) -> bool:
        return any(self.stream_input(o).index < c.index < o.out.index for o in self.sublayers)

    def _fit_run(self) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """One run on FIT_BATCH independent inputs (not copies of x, with a generator of its own, so the other
        probes draw what they drew before): enough tokens to fit one coefficient per feature."""
        if getattr(self, "_fit", None) is None:
            x = torch.randn(FIT_BATCH, self.seq, self.width, dtype=torch.float64,
                            generator=torch.Generator().manual_seed(self.seed + 1))
            traced, y = self.tracer.inputs_of(x, clone=True)
            self._fit = (traced, x, y)
        return self._fit

    def stream_sum(self, target, g: SubLayer) -> dict | None:
        memo = self.__dict__.setdefault("_sums", {})
        if (target, g.out.key) not in memo:
            memo[(target, g.out.key)] = self._stream_sum(target, g)
        return memo[(target, g.out.key)]

    def _stream_sum(self, target, g: SubLayer) -> dict | None:
        """``target`` (a call's key: its input; or 'output': the layer's output) as an exact linear combination of
        what the stream can carry up to sub-layer g: the layer's input x, the outputs of the sub-layers' writers up
        to g's, and the outputs of the norms outside the sub-layers before g's writer. A sum of g's writer and at
        least one other term, or None. Coefficients by least squares on FIT_BATCH independent inputs: one number
        per term, else one per feature (Admin's omega); a fit that is not exact to round-off is no sum."""
        try:
            traced, x, y = self._fit_run()
            terms = {"x": x}
            for c in self.calls:
                if c.index > g.out.index and target != "output":
                    break
                if any(c is o.out for o in self.sublayers) or (c in self.norm_calls and not self._inside(c)):
                    terms[c.name if c.key[1] == 0 else f"{c.name}#{c.key[1]}"] = traced[c.key].out
            goal = y if target == "output" else traced[target].inp
        except (KeyError, RuntimeError):  # a call the independent inputs do not repeat (routing by content)
            return None
        branch = g.out.name if g.out.key[1] == 0 else f"{g.out.name}#{g.out.key[1]}"
        terms = {k: t for k, t in terms.items() if t.shape == goal.shape}
        kept = {}
        for k, t in terms.items():  # the same tensor under two names (a post-norm's stream is x): once
            if not any(_same(t, u) for u in kept.values()):
                kept[k] = t
        fit = _combination(goal, kept)
        if fit is None or abs(fit["coefficients"].get(branch, 0.0)) < COEF_TOL:
            return None
        others = {k: v for k, v in fit["coefficients"].items() if k != branch and abs(v) >= COEF_TOL}
        if not others:
            return None
        # the stream h the sub-layer reads: its input, or the input of the pre-norm that feeds it
        stream = self.stream_input(g)
        prenorm = next((n for n in self.norm_calls if n.index < stream.index and _same(n.out, stream.inp)), None)
        raw = [traced[c.key].inp for c in (stream, prenorm) if c is not None and c.key in traced]
        stream_name = next((k for r in raw for k, t in kept.items() if k in fit["coefficients"] and _same(t, r)
                            and abs(fit["coefficients"][k]) >= COEF_TOL), None)
        return {**fit, "branch": branch, "stream": stream_name, "terms": list(kept),
                "coefficients": {k: v for k, v in fit["coefficients"].items() if abs(v) >= COEF_TOL}}

    def stream_input(self, g: SubLayer) -> Call:
        """The in-projection reading the stream that the writer depends on (not a router beside the sub-layer, as a
        mixture-of-depths block's, that decides which tokens it processes)."""
        reading = [c for c in g.ins if c.inp.shape[-2] == self.seq]
        return next((c for c in reading if self.depends.get((c.key, g.out.key))), reading[0] if reading else g.ins[0])

    def reads_only_through(self, g: SubLayer) -> Call | None:
        """The norm outside the sub-layers through which alone g's stream input reads the stream, with something
        between them (Canon layers' short causal convolution with its own residual, n + conv(n), between the norm
        and the projections): with x changed and the norm's output held at what it was, the in-projection's input
        does not move. None where the input is a norm's output as it is (a plain pre-norm), or no norm is found."""
        memo = self.__dict__.setdefault("_through", {})
        if g.out.key in memo:
            return memo[g.out.key]
        stream_in, found = self.stream_input(g), None
        if not any(_same(n.out, stream_in.inp) for n in self.norm_calls):
            earlier = [o.out.index for o in self.sublayers if o.out.index < stream_in.index]
            for n in reversed([n for n in self.norm_calls if max(earlier, default=-1) < n.index < stream_in.index
                               and not self._inside(n) and n.out.shape == (1, self.seq, self.width)]):
                x = self.batch(2)
                x[1] += self.randn(self.seq, self.width)

                def hold(key, out, n=n):
                    if key != n.key:
                        return None
                    out[1] = out[0]
                    return out

                traced, _ = self.tracer.inputs_of(x, hold)
                plain, _ = self.tracer.inputs_of(x)
                if stream_in.key in traced and _same(traced[stream_in.key].inp[1], traced[stream_in.key].inp[0]) \
                        and not _same(plain[stream_in.key].inp[1], plain[stream_in.key].inp[0]):
                    found = n
                    break
        memo[g.out.key] = found
        return found

    def norm_placement(self, g: SubLayer) -> dict:
        stream_in = self.stream_input(g)
        inner = [n for n in self.norm_calls if stream_in.index < n.index < g.out.index]
        stream = [n for n in self.norm_calls if n not in inner]
        before = [n.name for n in stream if n.index < stream_in.index and _same(n.out, stream_in.inp)] \
            or self.functional_norm(g)
        through = self.reads_only_through(g) if not before else None
        if through is not None:
            before = [through.name]
        # a norm of the writer's output is an output norm, unless it is the next sub-layer's input norm: a block
        # whose sub-layer output replaces the stream (no residual) feeds it straight into the next pre-norm
        later_inputs = [self.stream_input(o).inp for o in self.sublayers if o.out.index > g.out.index]
        later_norms = {n.name for o in self.sublayers if o.out.index > g.out.index
                       for n in [self.reads_only_through(o)] if n is not None}
        after = [n.name for n in stream if n.index > g.out.index and _same(n.inp, g.out.out)
                 and not any(_same(n.out, i) for i in later_inputs)]
        sums = self._sum_norms(g)
        post = [n.name for n in sums]
        if g is not self.sublayers[-1] and not self._sum_norms(self.sublayers[-1]):
            # the stack ends without a norm on its residual sum: a norm of an earlier sum that feeds the next
            # sub-layer is that sub-layer's input norm (the stream goes on un-normalized), not a post-norm
            post = [n for n in post if n not in later_norms and not any(_same(m.out, i) for m in self.norm_calls
                                                                         if m.name == n for i in later_inputs)]
        # a post-norm layer's FFN reads the attention's post norm: that norm belongs to the residual before it
        if not (before or after or post) and self._unit_after(g):
            # no norm module: the stream after the sub-layer is L2-normalised by hand (nGPT's x / ||x||, its
            # sum of h and the normalised branch put back on the unit sphere)
            post = ["l2_normalize()"]
        placement = ("post" if post and not after else "sandwich" if before and after else "pre" if before
                     else "output" if after else "none")
        out = {"placement": placement, "input_norm": before, "output_norm": after, "post_norm": post,
               "norms": before + after + post}
        if through is not None:
            # what runs between the norm and the projections (a module, or code outside any: a function of the
            # norm's output alone)
            out["read_through"] = [c.name for c in self.calls if through.index < c.index < stream_in.index
                                   and c not in self.projections] or ["code outside any module"]
        if placement == "post" and not sums:
            out["unit_sphere"] = True  # a norm by hand: its sum is not seen, no coefficients
        elif placement == "post":  # the sum the norm reads: its coefficients (DeepNorm's alpha, Admin's omega, B2T's x)
            out["post_sum"] = self.stream_sum(next(n.key for n in sums if n.name == post[0]), g)
        return out

    def _unit_after(self, g: SubLayer) -> bool:
        """The stream after g, the next sub-layer's input (or the layer's output after the last), has rows of
        length 1 while the layer's input does not: an L2 normalisation written by hand (nGPT)."""
        later = [self.stream_input(o).inp for o in self.sublayers if o.out.index > g.out.index]
        t = later[0] if later else self.y
        if t.shape[-1] != self.width or (self.x.norm(dim=-1) - 1).abs().max().item() < UNIT_TOL:
            return False
        return (t.norm(dim=-1) - 1).abs().max().item() < UNIT_TOL

    def functional_norm(self, g: SubLayer) -> list[str]:
        """A pre-norm with no module of its own (nanochat's F.rms_norm(x)): the in-projections read rms_norm() or
        layer_norm() without weights of the stream, the layer's input x plus the outputs of the writers before g
        (or x alone: a parallel block). Compared to FUNCTIONAL_TOL: the eps inside is the user's."""
        stream_in = self.stream_input(g)
        earlier = [o.out.out for o in self.sublayers if o.out.index < g.out.index and o.out.out.shape == self.x.shape]
        candidates = [self.x, self.x + sum(earlier)] if earlier else [self.x]
        for name, norm in FUNCTIONAL_NORMS.items():
            for t in candidates:
                if t.shape == stream_in.inp.shape and _rel(stream_in.inp, norm(t)) < FUNCTIONAL_TOL:
                    return [name]
        return []

    def qk_norm(self, g: SubLayer) -> list[str]:
        keys = [c.key for c in g.ins]
        latent = {c.key for c in self.latents(g)}
        return [n.name for n in self.norm_calls if g.ins[0].index < n.index < (g.read or g.out).index
                and n.key not in latent and any(self.depends.get((k, n.key)) for k in keys)]

    def qk_scale_invariant(self, g: SubLayer, heads: dict) -> bool:
        """A QK-norm with no module (nGPT's q / ||q||, a functional rms_norm): the queries' features multiplied by 3
        (one run) and the keys' (another) leave the heads' output as it was; without a norm the logits scale."""
        roles = heads.get("roles") or {}
        if not any("q" in rs for rs in roles.values()) or not any("k" in rs for rs in roles.values()):
            return False

        def edit(key, out):
            if key not in roles:
                return None
            flat = out.view(out.shape[0], out.shape[1], -1)
            for f, role in enumerate(roles[key]):
                if role in ("q", "k"):
                    flat[1 if role == "q" else 2, :, f] *= 3.0
            return out

        traced, _ = self.tracer.inputs_of(self.batch(3), edit)
        o_in = self.read_input(traced, g)
        return all(_rel(o_in[b], o_in[0]) < FUNCTIONAL_TOL for b in (1, 2))

    def experts(self, g: SubLayer) -> dict:
        """Routed experts, from the experts module as a whole: how many (its 3-D weights' first dimension), how many
        each token is routed to (the routing it is handed: the last dimension of its integer argument), and what
        one expert computes: the module called again on its own input with every token routed to expert 0 at
        weight 1, against W_out act(W_in x) and W_out (act(gate) * up) for each activation."""
        if g.hand:  # written by hand: the expert every token was routed to, read as an FFN
            f = self.ffn(g)
            return {"experts": g.hand["experts"], "per_token": g.hand["per_token"], "hidden": f["hidden"],
                    "kind": f["kind"], "activation": f["activation"], "module": g.out.name,
                    "container": g.hand["container"], "router": g.hand["router"], "read_through": g.hand["expert"]}
        call = g.out
        weights = experts_weights(call.module)
        index = next((a for a in call.args[1:] if torch.is_tensor(a) and not a.is_floating_point()), None)
        per_token = int(index.shape[-1]) if index is not None and index.dim() >= 1 else None
        w_in = next((w for w in weights if w.shape[-1] == self.width), None)
        w_out = next((w for w in weights if w is not w_in and w.shape[1] == self.width), None)
        hidden = w_out.shape[-1] if w_out is not None else None
        kind, activation = "unknown", "unknown"
        if index is not None and w_in is not None and w_out is not None:
            x = call.args[0].detach()
            flat = x.reshape(-1, x.shape[-1])
            args = [flat, torch.zeros(flat.shape[0], 1, dtype=index.dtype), torch.ones(flat.shape[0], 1,
                                                                                        dtype=flat.dtype)]
            try:
                with torch.no_grad():
                    y = call.module(*args[:len(call.args)])
                h = flat @ w_in[0].T
                for name, act in ACTIVATIONS.items():
                    candidates = ([act(h)] if h.shape[-1] == hidden else
                                  [act(a) * b for a, b in (h.split(hidden, -1), h.split(hidden, -1)[::-1])]
                                  if h.shape[-1] == 2 * hidden else [])
                    if any(_rel(c @ w_out[0].T, y) < ACT_TOL for c in candidates):
                        kind = (PLAIN if h.shape[-1] == hidden else GATED)[name]
                        activation = name
                        break
            except Exception:  # noqa: BLE001 - an experts module with another calling convention: kind unknown
                pass
        return {"experts": weights[0].shape[0], "per_token": per_token, "hidden": hidden, "kind": kind,
                "activation": activation, "module": call.name}

    def ffn(self, g: SubLayer) -> dict:
        """Which activation turns the in-projections' outputs into the writer's input."""
        hidden = g.out.inp.shape[-1]
        # the activation's output is the writer's input, or the input of what runs on it first (NormFormer's and
        # BitNet's norm after the activation)
        between = [c for c in self.calls if g.ins[-1].index < c.index < g.out.index and c.inp.shape == g.out.inp.shape]
        targets = [g.out, *between]
        outs = [c.out for c in g.ins if c.out.shape[-1] in (hidden, 2 * hidden)]
        if len(outs) == 1 and outs[0].shape[-1] == 2 * hidden:  # fused gate and up
            outs = list(outs[0].split(hidden, dim=-1))
        kind, activation, at = "unknown", "unknown", None
        candidates = ([(PLAIN, lambda act: [act(outs[0])])] if len(outs) == 1 else
                      [(GATED, lambda act: [act(a) * b for a, b in (outs, outs[::-1])])] if len(outs) == 2 else [])
        for kinds, made in candidates:
            for name, act in ACTIVATIONS.items():
                # no activation at all only where the writer itself reads the in-projections' outputs: a module
                # between them that reads them as they are is the activation (Apertus's xIELU), of a kind not known
                at = next((t for t in (targets if name != "identity" else [g.out]) for m in made(act)
                           if _rel(m, t.inp) < ACT_TOL), None)
                if at is not None:
                    kind, activation = kinds[name], name
                    break
        scaled = None
        if at is None and len(outs) in (1, 2):
            # the in-projection's output scaled before the activation (nGPT's s_uv * sqrt(d_model) * c_fc(h))
            for name in ACTIVATIONS:
                found = next(((t, fit) for t in targets for fit in [_scaled_activation(outs, t.inp, name)] if fit), None)
                if found is not None:
                    at, scaled = found
                    kind, activation = (PLAIN if len(outs) == 1 else GATED)[name], name
                    break
        # no activation fits and most hidden units are exactly zero: a thresholded activation (a top-k of the gate,
        # Gemma 3n's activation sparsity), measured and said
        zeros = float((g.out.inp == 0).double().mean()) if at is None else 0.0
        return {"kind": kind, "activation": activation, "hidden": hidden, "matrices": len(g.ins) + 1,
                **({"zero_fraction": round(zeros, 3)} if zeros > 0.5 else {}),
                "writer": g.out.name, "inputs": [c.name for c in g.ins],
                "after_activation": [c.name for c in targets if at is not None and c.index >= at.index
                                     and c is not g.out],
                **({"scaled_before_activation": scaled} if scaled else {})}
