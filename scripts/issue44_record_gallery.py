"""Record tables into the gallery's snapshot (records/gallery), the way the gallery writes itself: the snapshot is
checked against its MANIFEST.json first, marked as being written, each file copied in through ``snapshot_file`` and
the manifest recorded last (a kill leaves a snapshot every reader refuses). Issue 44's extra seeds
(scripts/issue44_seeds.sh).

    python scripts/issue44_record_gallery.py SRC:DEST [SRC:DEST ...]   # DEST relative to records/gallery

``--gradnorm-seeds 0,1,...`` also sets the ``gradnorm.seeds`` line of the gallery's params.yaml (its comments kept).
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from blocklab.integrity import begin_snapshot, record_snapshot, snapshot_file, verify_snapshot
from blocklab.records import GALLERY


def gradnorm_seeds(text: str, seeds: list[int], note: str) -> str:
    """params.yaml's text with the seeds line of its ``gradnorm:`` section replaced (that section only)."""
    section = re.search(r"^gradnorm:.*?(?=^\S)", text, flags=re.S | re.M)
    if section is None:
        raise SystemExit("params.yaml has no gradnorm section")
    body, n = re.subn(r"^  seeds: .*$", f"  seeds: {seeds}  # {note}", section.group(0), count=1, flags=re.M)
    if n != 1:
        raise SystemExit("the gradnorm section has no seeds line")
    return text[: section.start()] + body + text[section.end():]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("pairs", nargs="*")
    p.add_argument("--gradnorm-seeds", default=None)
    p.add_argument("--note", default="issue 44 (scripts/issue44_seeds.sh)")
    args = p.parse_args()
    gallery = Path(GALLERY)
    verify_snapshot(gallery)
    begin_snapshot(gallery)
    for pair in args.pairs:
        src, dest = pair.split(":")
        with snapshot_file(gallery, dest) as tmp:
            Path(tmp).write_bytes(Path(src).read_bytes())
        print(f"{src} -> {gallery / dest}")
    if args.gradnorm_seeds is not None:
        seeds = [int(s) for s in args.gradnorm_seeds.split(",")]
        text = (gallery / "params.yaml").read_text(encoding="utf-8")
        with snapshot_file(gallery, "params.yaml") as tmp:
            Path(tmp).write_text(gradnorm_seeds(text, seeds, args.note), encoding="utf-8")
        print(f"{gallery / 'params.yaml'}: gradnorm.seeds {seeds}")
    record_snapshot(gallery)


if __name__ == "__main__":
    main()
