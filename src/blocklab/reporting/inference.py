"""The inference study's ranking by the document's numbers (claim judging out of the studies' aggregation):
the five fitted numbers are claims (claims.yaml marks them ``fitted: true``), read here and handed to the study's
``score`` (``studies.inference.aggregate``), which measures distances and knows nothing of the claims. The two verbs
that rank: ``blocklab inference aggregate`` (the fitting runs' losses, ``aggregate``, and their ranking: the
pipeline's rule) and ``blocklab inference score`` (any recorded runs)."""
from __future__ import annotations

from pathlib import Path

from ..io import write_table
from ..params_file import load_params
from ..run_settings import Sweep
from ..studies.family import add_command
from ..studies.inference.aggregate import aggregate, read_losses, score
from ..studies.inference.plan import LOSSES, RANKING
from .claims import load_claims
from ..records import SENSITIVITY

FIT_CLAIMS = ("d000-post-warm-step100", "d000-post-warm-step200", "d000-post-warm-step300", "d000-pre-nowarm-step100",
              "d000-pre-nowarm-step200")


def _range(claim: dict) -> tuple[float, float]:
    """The document's number as a range: a value (low = high), a range, or "below" a bound (low 0)."""
    if claim["kind"] == "value":
        return float(claim["value"]), float(claim["value"])
    if claim["kind"] == "range":
        return float(claim["low"]), float(claim["high"])
    if claim["kind"] == "inequality" and claim["side"] == "below":
        return 0.0, float(claim["bound"])
    raise ValueError(f"{claim['id']}: a fitted claim of kind {claim['kind']} has no range to score")


def targets() -> list[dict]:
    """The five fitted numbers (the claims marked ``fitted: true``): claim id, norm, warm-up, step and the document's
    range (low = high for one value), in ``FIT_CLAIMS``'s order (the ranking's columns)."""
    claims = {c["id"]: c for c in load_claims()}
    fitted = {i for i, c in claims.items() if c.get("fitted")}
    if fitted != set(FIT_CLAIMS):
        raise ValueError(f"claims.yaml marks {sorted(fitted)} as fitted; the procedure fitted {list(FIT_CLAIMS)}")
    return [{"id": i, **{k: claims[i]["args"][k] for k in ("norm", "warmup", "step")},
             **dict(zip(("low", "high"), _range(claims[i])))} for i in FIT_CLAIMS]


def register(subparsers) -> None:
    add_command(subparsers, "aggregate", "the fitting runs' losses and the ranking of the candidates", _aggregate_main)
    p = subparsers.add_parser("score", help="rank recorded settings by the document's five early losses")
    p.add_argument("--snapshots", nargs="*", default=[f"{SENSITIVITY}/choices"])
    p.add_argument("--sweep-losses", nargs="*", default=[], help="main-sweep losses.csv files (their setting: --sweep-setting)")
    p.add_argument("--sweep-setting", default="learned-b32-L24-lr0.001-fp32")
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=_score_main)


def _aggregate_main(args) -> None:
    params = load_params(args.params)
    losses = aggregate(params)["losses"]
    write_table(losses, LOSSES)
    warmup = max(Sweep.from_params(params).warmups)
    fitted = targets()
    document_warmup = next(t["warmup"] for t in fitted if t["norm"] == "post")
    if warmup != document_warmup:
        print(f"note: post-norm runs use warm-up {warmup}, the document {document_warmup}: this ranking is not about "
              "the document's setup")
    ranked = score(losses, fitted, post_warmup=warmup)
    write_table(ranked, RANKING)
    print(ranked.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def _score_main(args) -> None:
    ranked = score(read_losses(args.snapshots, args.sweep_losses, args.sweep_setting), targets())
    print(ranked.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        write_table(ranked, args.out)
