"""Re-judge the gallery's claims tables with the current rules, after a rule, a claim's words or its error-rate worlds
change (the data stay as the full default run left them):

    python scripts/rejudge_gallery.py

1. the sensitivity study's tables from its recorded snapshots (`blocklab sensitivity aggregate`, the gallery README's
   recipe), of which records/gallery/sensitivity keeps summary.csv and claims_by_setting.csv;
2. records/gallery/claims/claims.csv from the gallery's own tables (`blocklab report claims`);
3. the gallery's MANIFEST.json recorded again (last).
Then run `blocklab docs` (the pages drawn from these tables). tests/test_docs.py checks both tables against what
the code gives.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from blocklab.integrity import begin_snapshot, record_snapshot, snapshot_file  # noqa: E402
from blocklab.records import GALLERY  # noqa: E402


def main() -> int:
    gallery = ROOT / GALLERY
    params = yaml.safe_load((gallery / "params.yaml").read_text(encoding="utf-8"))
    blocklab = str(Path(sys.executable).with_name("blocklab"))
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / "data" / "sensitivity"
        study.mkdir(parents=True)
        shutil.copy(gallery / "sensitivity" / "gradnorm.csv", study / "gradnorm.csv")
        subprocess.run([blocklab, "sensitivity", "aggregate", "--params", str(gallery / "params.yaml"), "--root", tmp,
                        "--from", *[str(ROOT / s) for s in params["sensitivity"]["from_snapshots"]]], check=True,
                       cwd=ROOT)
        claims = Path(tmp) / "claims.csv"
        subprocess.run([blocklab, "report", "claims", "--params", str(gallery / "params.yaml"), "--data", str(gallery),
                        "--out", str(claims)], check=True, cwd=ROOT)
        begin_snapshot(gallery)  # a kill from here on leaves a gallery every reader refuses, until this runs again
        made = {f"sensitivity/{name}": study / name for name in ("summary.csv", "claims_by_setting.csv")}
        for name, source in {**made, "claims/claims.csv": claims}.items():
            with snapshot_file(gallery, name) as tmp_file:
                shutil.copy(source, tmp_file)
        record_snapshot(gallery)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
