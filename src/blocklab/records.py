"""Where the recorded runs and tables live: ``records/``, in git beside the code, so a fresh clone
has them without a network; the pipeline, the studies, the reporting, the docs generator and the tests read them from
here. ``docs/`` holds pages and pictures only. Each location is named once, here; code refers to these constants
(paths relative to the project root, POSIX, as params.yaml writes them).

- ``GALLERY``: the tables of a full default run (the pipeline's data/ layout) and its params.yaml, which the gallery's
  figures (docs/gallery/) and every generated block of the pages are drawn from (``blocklab gallery`` writes them).
- ``SENSITIVITY``, ``DYNAMICS``, ``INFERENCE``: the studies' snapshots of recorded runs, one directory each
  (``<study>.from_snapshots`` in params.yaml names them; ``blocklab <study> snapshot --out`` writes them).
- ``LAB_RUNS``: the stability lab's recorded runs (its STATUS page stays in docs/lab/); ``LAB_LR_RUNS``: its
  learning-rate sensitivity study's.
- ``REVIEWER``: the block reviewer's recorded tables (``blocklab review --table ... --json``), drawn in docs/reviewer.md.
"""
from __future__ import annotations

RECORDS = "records"
GALLERY = f"{RECORDS}/gallery"
SENSITIVITY = f"{RECORDS}/sensitivity"
DYNAMICS = f"{RECORDS}/dynamics"
INFERENCE = f"{RECORDS}/inference"
LAB_RUNS = f"{RECORDS}/lab/runs"
LAB_LR_RUNS = f"{RECORDS}/lab/lr-sweep/runs"  # the learning-rate sensitivity study's recorded runs (lab.lrsweep)
LAB_LR_UNDERFLOW = f"{RECORDS}/lab/lr-sweep/underflow.csv"  # the study's runs' subnormal gradients (lab.underflow)
REVIEWER = f"{RECORDS}/reviewer"

# Where `blocklab smoke` last ran: its scratch copy's directory, its configuration, when it started and finished (a
# JSON file under the checkout, ignored by git). `blocklab status`, `blocklab claims` and `blocklab report inspect` read
# it when the project's own data/ is absent, and show the smoke's result, saying so.
SMOKE = ".blocklab/smoke.json"
SMOKE_METRICS = ".blocklab/smoke/metrics.json"  # its data/claims/metrics.json, which dvc.yaml lists for `dvc metrics show`


def last_smoke(root=".") -> dict | None:
    """The record ``blocklab smoke`` left under ``root`` (``project``: its scratch copy, ``finished``: when, or None
    while it runs or after an interrupt), or None when there is none or its scratch copy is gone."""
    import json
    from pathlib import Path

    try:
        record = json.loads((Path(root) / SMOKE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and Path(str(record.get("project", ""))).is_dir() else None


def smoke_copy(relative: str, root=".") -> tuple[object, str] | None:
    """(the last smoke's copy of ``relative``, a line saying so) when ``root`` lacks ``relative`` and the smoke's
    scratch copy has it; else None."""
    from pathlib import Path

    record = last_smoke(root)
    if (Path(root) / relative).exists() or record is None or not (Path(record["project"]) / relative).exists():
        return None
    when = f"finished {record['finished']}" if record.get("finished") else "not finished: interrupted or running"
    found = Path(record["project"]) / relative
    return found, (f"no {relative} here: the smoke's, {found} (`blocklab smoke` {when}; the tiny configuration, whose "
                   "numbers test the code, not the documents)")
