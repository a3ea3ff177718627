"""The claims table's rows judged from the stability lab's runs recorded in git (``lab.records.RUNS``): the
literature's claims (source ``literature`` in claims.yaml) and the default cell's claims that read the same cell's
recorded runs beside the sweep's (``claims.reads_lab_records``), kept in step with those runs.

The gallery's ``data/claims/claims.csv`` is the claims table of the full default run; these rows are judged from runs
recorded in git after that run (the lab trains them for hours, one at a time), so they change whenever a run is
recorded. ``blocklab docs`` re-judges those rows alone (``refresh``) and rewrites them in place as a snapshot edit (the
manifest is re-recorded), every other row byte for byte as it was; ``blocklab docs --check`` fails while they differ
from what the recorded runs give.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from ..integrity import begin_snapshot, record_snapshot, snapshot_file
from ..params_file import load_params

CLAIMS = "claims/claims.csv"


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _text(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def judged(data: Path) -> list[list[str]]:
    """The rows the recorded lab runs judge, as the claims engine writes them (its CSV, header first), on ``data``."""
    from .claims import Data, evaluate_data, load_claims, reads_lab_records

    mine = [c for c in load_claims() if c["source"] == "literature" or reads_lab_records(c)]
    ids, checks = [c["id"] for c in mine], {c["check"] for c in mine}
    table = evaluate_data(Data(data, load_params(data / "params.yaml")), only=checks)
    return _rows(table[table["id"].isin(ids)].to_csv(index=False))


def refreshed(data: Path) -> tuple[str, str]:
    """(claims.csv as it is, as it should be): its rows judged from the recorded runs replaced by (or, when missing, appended as) those
    the recorded runs give now, in claims.yaml's order; every other row kept as it is."""
    path = Path(data) / CLAIMS
    text = path.read_text(encoding="utf-8")
    rows = _rows(text)
    header, body = rows[0], rows[1:]
    new = judged(Path(data))
    if new[0] != header:
        raise ValueError(f"{path}: its columns {header} are not the claims engine's {new[0]}; rerun `blocklab gallery`")
    fresh = {r[0]: r for r in new[1:]}
    kept = [fresh.pop(r[0], r) for r in body]
    return text, _text([header, *kept, *fresh.values()])


def refresh(data: Path, check: bool = False) -> bool:
    """Whether the gallery's rows judged from the recorded runs differed from them; rewritten unless ``check``."""
    data = Path(data)
    if not (data / CLAIMS).is_file() or not (data / "params.yaml").is_file():
        return False  # not a run's snapshot (no claims table, or not the parameters to judge it with)
    now, should = refreshed(data)
    if now == should:
        return False
    if not check:
        begin_snapshot(data)
        with snapshot_file(data, CLAIMS) as tmp:
            Path(tmp).write_text(should, encoding="utf-8")
        record_snapshot(data)
    return True
