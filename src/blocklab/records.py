"""Where the recorded runs and tables live: ``records/``, in git beside the code, so a fresh clone
has them without a network; the pipeline, the studies, the reporting, the docs generator and the tests read them from
here. ``docs/`` holds pages and pictures only. Each location is named once, here; code refers to these constants
(paths relative to the project root, POSIX, as params.yaml writes them).

- ``GALLERY``: the tables of a full default run (the pipeline's data/ layout) and its params.yaml, which the gallery's
  figures (docs/gallery/) and every generated block of the pages are drawn from (``blocklab gallery`` writes them).
- ``SENSITIVITY``, ``DYNAMICS``, ``INFERENCE``: the studies' snapshots of recorded runs, one directory each
  (``<study>.from_snapshots`` in params.yaml names them; ``blocklab <study> snapshot --out`` writes them).
- ``LAB_RUNS``: the stability lab's recorded runs (its STATUS page stays in docs/lab/).
- ``REVIEWER``: the block reviewer's recorded tables (``blocklab review --table ... --json``), drawn in docs/reviewer.md.
"""
from __future__ import annotations

RECORDS = "records"
GALLERY = f"{RECORDS}/gallery"
SENSITIVITY = f"{RECORDS}/sensitivity"
DYNAMICS = f"{RECORDS}/dynamics"
INFERENCE = f"{RECORDS}/inference"
LAB_RUNS = f"{RECORDS}/lab/runs"
REVIEWER = f"{RECORDS}/reviewer"
