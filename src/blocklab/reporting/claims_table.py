"""`blocklab claims`: the claims table the pipeline wrote, for people: each claim of the two chapters, the chapter's
value, what was measured and the verdict, one claim a line (``--long``: each claim in full).

It reads ``data/claims/claims.csv`` (written by the pipeline's `blocklab report claims` job) or any claims table given;
the full default run's table is in the gallery: ``blocklab claims --table records/gallery/claims/claims.csv``.
"""
from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path
from ..records import GALLERY, smoke_copy

TABLE = Path("data/claims/claims.csv")
GALLERY_TABLE = Path(f"{GALLERY}/claims/claims.csv")


def read_claims(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(
            f"no claims table at {path}: the pipeline writes it (`snakemake --cores 2 {TABLE}`, or `make run`); the "
            f"full default run's table: `blocklab claims --table {GALLERY_TABLE}`")
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def format_claims(rows: list[dict], width: int = 120, long: bool = False) -> str:
    """One line a claim: verdict, id, the chapter's value and the measurement, clipped to ``width`` columns; with
    ``long``, each claim over several lines, whole. Then the count of each verdict."""
    counts: dict[str, int] = {}
    lines = []
    wid = max((len(r["id"]) for r in rows), default=2)
    ver = max((len(r["verdict"]) for r in rows), default=7)
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        if long:
            lines += [f"{r['id']}  [{r['verdict']}]  ({r['document']}, {r['where']})", f"  claim:    {r['claim']}",
                      f"  document: {r['document_value']}", f"  measured: {r['measured']}", ""]
            continue
        head = f"{r['verdict']:<{ver}}  {r['id']:<{wid}}  "
        rest = max(20, width - len(head))
        lines.append(head + _clip(f"{r['document_value']} → {r['measured']}", rest))
    summary = f"{len(rows)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.items())
    return "\n".join(lines + ([""] if not long else []) + [summary])


def register(subparsers) -> None:
    p = subparsers.add_parser("claims", help="the claims table: each claim, its measured value and verdict",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", type=Path, default=TABLE, help=f"a claims table (default {TABLE})")
    p.add_argument("--verdict", action="append", help="only claims with this verdict (repeatable)")
    p.add_argument("--long", action="store_true", help="each claim in full, over several lines")
    p.set_defaults(func=_main)


def _main(args) -> int:
    smoke = smoke_copy(str(TABLE)) if args.table == TABLE else None
    if smoke is not None:  # a fresh checkout after `make smoke`: the smoke's table, said so first
        print(smoke[1] + ":", file=sys.stderr)
        args.table = smoke[0]
    elif args.table == TABLE and not TABLE.is_file() and GALLERY_TABLE.is_file():  # a fresh clone: the recorded run's
        print(f"no {TABLE} here (the pipeline writes it: `make run`; `make smoke`, a tiny one): the recorded full "
              f"default run's, {GALLERY_TABLE}:", file=sys.stderr)
        args.table = GALLERY_TABLE
    rows = read_claims(args.table)
    if args.verdict:
        rows = [r for r in rows if r["verdict"] in args.verdict]
    print(format_claims(rows, shutil.get_terminal_size((120, 24)).columns, args.long))
    return 0
