"""`blocklab review --table`: architectures side by side against the 2026 checklist.

The reviews are computed once (``run``) and kept as compact records (``record``: the verdict, the parameter count and
each stack's structure without its evidence); the markdown is drawn from records alone (``markdown``), so the table
in docs/reviewer.md is rendered by ``blocklab docs`` from the recorded file (``--table ... --json FILE``) and a
change of layout never reruns a review.
"""
from __future__ import annotations

import datetime as dt

from ..model_config import ConfigError
from .architecture import review_architecture
from .report import EXIT_USAGE, Review
from .rules import DEFAULTS, layer_ranges

COLUMNS = ("residual", "norm_placement", "norm_kind", "attention", "qk_norm", "position", "ffn", "causal")
HEADERS = ("architecture", "residual", "norm", "norm kind", "attention (Q/KV heads)", "QK-norm", "position",
           "FFN (ratio)", "causal", "layers", "parameters", "verdict")
CHECKLIST = ("**2026 default**", "**sequential**", "**pre**", "**rmsnorm**", "**GQA**", "—", "**rope**",
             "**swiglu** (>= 2x)", "decoder: yes", "", "", "pass")


def _stacks(structure: dict) -> dict:
    """{label: stack}: '' for a single stack, 'encoder' and 'decoder' for an encoder-decoder."""
    return {"": structure} if "reviewable" in structure or not structure else structure


def _compact(s: dict) -> dict:
    out = {k: v for k, v in s.items() if k != "evidence"}
    if s.get("reviewable"):
        out["rotary_fraction"] = s["evidence"].get("rotary_fraction")
    return out


def record(review: Review) -> dict:
    """What the table shows of one review, and nothing it does not."""
    return {"subject": review.subject, "verdict": review.verdict, "exit_status":
            EXIT_USAGE if "usage_error" in review.facts else review.exit_status,
            "usage_error": review.facts.get("usage_error"), "parameters": review.facts.get("parameters", 0),
            "stacks": {label: _compact(s) for label, s in _stacks(review.facts.get("structure") or {}).items()}}


def _cell(s: dict, key: str) -> str:
    value = s[key]
    if key == "attention":
        text = f"{value} {s['query_heads']}/{s['kv_heads']}"
    elif key == "ffn":
        text = f"{value} ({s['ffn_ratio']:.2f}x)"
    elif key == "position":
        rotary = s.get("rotary_fraction")
        text = f"partial rope ({rotary:.0%})" if value == "rope" and rotary is not None and rotary < 1 else value
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    else:
        text = str(value)
    default = DEFAULTS.get(key)
    return f"**{text}**" if default is not None and value == default else text


def _traits(p: dict) -> list[str]:
    if p.get("reviewable") is False:
        return ["not reviewed"]
    return [p["mixer"], *(["NoPE"] if p["mixer"] == "attention" and p["position"] == "none" else []),
            *([f"window {p['sliding_window']}"] if p["sliding_window"] else []), "MoE" if p["moe"] else "dense"]


def _layers_cell(s: dict) -> str:
    """A uniform stack: 'uniform' (with its window, if it has one). A mixed stack: each layer pattern by what sets it
    apart from the others, with its number of layers and, when short, their indices: 'attention x27, NoPE x9
    (3, 7, ..., 35)', 'conv x10, attention x6 (2, 5, 8, 10, 12, 14)'."""
    layers = s.get("layers") or []
    if len(layers) == 1:
        window = layers[0].get("sliding_window")
        return f"uniform, window {window}" if window else "uniform"
    if not layers:
        return "—"
    traits = [_traits(p) for p in layers]
    common = set.intersection(*map(set, traits))
    parts = []
    for p, t in zip(layers, traits):
        own = [x for x in t if x not in common] or [t[0]]
        where = layer_ranges(p["indices"])
        parts.append(" + ".join(own) + f" x{len(p['indices'])}" + (f" ({where})" if len(where) <= 24 else ""))
    return ", ".join(parts)


def rows(rec: dict) -> list[list[str]]:
    """One row per stack of a record."""
    out = []
    for label, s in (rec["stacks"] or {"": {}}).items():
        name = rec["subject"] + (f" ({label})" if label else "")
        verdict = "error (exit 3)" if rec.get("usage_error") else rec["verdict"]
        cells = [_cell(s, k) for k in COLUMNS] if s.get("reviewable") else ["—"] * len(COLUMNS)
        out.append([name, *cells, _layers_cell(s), f"{rec['parameters']:,}", verdict])
    return out


def table_rows(review: Review) -> list[list[str]]:
    return rows(record(review))


def markdown(records: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS), "| " + " | ".join(CHECKLIST) + " |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for r in records for row in rows(r)]
    return "\n".join(lines)


def run(model_types, attention: str = "eager", max_memory_gb=None) -> list[Review]:
    """Every row it can: an argument that is not an architecture gets a review holding its error (exit 3)."""
    reviews = []
    for m in model_types:
        try:
            reviews.append(review_architecture(m, attention=attention, max_memory_gb=max_memory_gb))
        except (ConfigError, FileNotFoundError) as err:
            bad = Review(subject=str(m), mode="hf-config", role=None)
            bad.add("arguments", "cannot", f"error: {err}", None)
            bad.facts["usage_error"] = str(err)
            reviews.append(bad)
    return reviews


def recorded(reviews: list[Review], model_types, path) -> dict:
    """The file `blocklab docs` renders the docs' table from: the command, when it ran, one record per review."""
    return {"command": "blocklab review --table " + " ".join(str(m) for m in model_types) + f" --json {path}",
            "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "records": [record(r) for r in reviews]}


def page(table: dict, source: str = "the recorded table") -> str:
    """The docs' block for a recorded table: how and when it was made, then the table."""
    missing = [k for k in ("command", "generated", "records") if k not in table]
    if missing:
        raise ConfigError(f"{source}: no {', '.join(map(repr, missing))}: not a table written by "
                          "`blocklab review --table ... --json`")
    transformers = (table.get("libraries") or {}).get("transformers", "unknown")
    return (f"Generated on {table['generated']} (transformers {transformers}) by\n\n```bash\n{table['command']}\n```\n\n"
            + markdown(table["records"]) + "\n")
