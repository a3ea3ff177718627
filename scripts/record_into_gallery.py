"""Record tables into the gallery's snapshot (records/gallery), the way the gallery writes itself: the snapshot is
checked against its MANIFEST.json first, marked as being written, each file copied in through ``snapshot_file`` and
the manifest recorded last (a kill leaves a snapshot every reader refuses). Used for the extra
seeds (scripts/extra_seeds.sh).

    python scripts/record_into_gallery.py SRC:DEST [SRC:DEST ...]   # DEST relative to records/gallery

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


SEED1_SNAPSHOTS = ("records/sensitivity/depth_lr-s1-main-sweep", "records/sensitivity/depth_lr-s1")


def depth_seed1(text: str) -> str:
    """params.yaml's text with the depth grid's seed 1 planned (``sensitivity.depth_lr.seeds: [0, 1]``) and its two
    snapshots read (``sensitivity.from_snapshots``), comments kept; refused unless each edit applies exactly once."""
    section = re.search(r"^sensitivity:.*?(?=^\S)", text, flags=re.S | re.M)
    if section is None:
        raise SystemExit("params.yaml has no sensitivity section")
    body = section.group(0)
    body, n_from = re.subn(r"(  from_snapshots: \[[^\]]*?)\]", lambda m: m.group(1) + ",\n                   "
                           + ", ".join(SEED1_SNAPSHOTS) + "]", body, count=1)
    body, n_seeds = re.subn(r"(  depth_lr:.*?\n    seeds: )\[0\]", r"\g<1>[0, 1]  # seed 1: docs/extra-seeds/cost.md",
                            body, count=1, flags=re.S)
    if (n_from, n_seeds) != (1, 1) or any(s in section.group(0) for s in SEED1_SNAPSHOTS):
        raise SystemExit("params.yaml: the sensitivity section is not as expected (from_snapshots list, depth_lr seeds "
                         "[0], seed-1 snapshots not yet listed)")
    return text[: section.start()] + body + text[section.end():]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("pairs", nargs="*")
    p.add_argument("--gradnorm-seeds", default=None)
    p.add_argument("--depth-seed1", action="store_true",
                   help="plan the depth grid's seed 1 and read its snapshots, in the gallery's params.yaml and the "
                        "project's (extra_seeds.sh finish)")
    p.add_argument("--note", default="scripts/extra_seeds.sh")
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
    if args.depth_seed1:
        text = (gallery / "params.yaml").read_text(encoding="utf-8")
        with snapshot_file(gallery, "params.yaml") as tmp:
            Path(tmp).write_text(depth_seed1(text), encoding="utf-8")
        project = Path("params.yaml")
        new = depth_seed1(project.read_text(encoding="utf-8"))
        project.with_name("params.yaml.new").write_text(new, encoding="utf-8")
        project.with_name("params.yaml.new").replace(project)
        print(f"{gallery / 'params.yaml'}, params.yaml: sensitivity.depth_lr.seeds [0, 1], from_snapshots + "
              f"{', '.join(SEED1_SNAPSHOTS)}")
    record_snapshot(gallery)


if __name__ == "__main__":
    main()
