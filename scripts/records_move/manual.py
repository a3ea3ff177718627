"""Issue 48 point 5, the parts a rewrite of names cannot do: the gallery writes its tables to records/gallery, the
docs generator reads records' pages too, the layer test knows records.py; the gallery's manifest re-recorded after its
params.yaml names the snapshots' new homes (its tables are untouched)."""
import re, sys
from pathlib import Path

R = Path(sys.argv[1] if len(sys.argv) > 1 else ".")


def edit(path, pairs):
    p = R / path
    s = p.read_text(encoding="utf-8")
    for old, new in pairs:
        if old not in s:
            print(f"!! {path}: not found: {old[:70]!r}")
            continue
        s = s.replace(old, new)
    p.write_text(s, encoding="utf-8")


edit("src/blocklab/reporting/gallery.py", [
    ('''def build_gallery(params_file: Path, data: Path, out: Path, dpi: int, lang: str | None = None,
                  pipeline_wall_time: str | None = None) -> Path:''',
     '''def build_gallery(params_file: Path, data: Path, out: Path, dpi: int, lang: str | None = None,
                  pipeline_wall_time: str | None = None, tables: Path = Path(GALLERY)) -> Path:
    """The figures and their page into ``out`` (docs/gallery), the tables behind them and the run's params.yaml into
    ``tables`` (records/gallery: recorded data lives in records/, docs/ holds pages and pictures)."""'''),
    ('''    (out / "data").mkdir(parents=True, exist_ok=True)
    begin_snapshot(out / "data")''', '''    tables.mkdir(parents=True, exist_ok=True)
    begin_snapshot(tables)'''),
    ('''snapshot = snapshot_tables(data, out / "data", params,''', '''snapshot = snapshot_tables(data, tables, params,'''),
    ('''    with atomic_path(out / "data" / "params.yaml") as tmp:''', '''    with atomic_path(tables / "params.yaml") as tmp:'''),
    ('''    record_snapshot(out / "data")  #''', '''    record_snapshot(tables)  #'''),
    ('''f"Tables behind every figure and claim: `data/` here ({len(snapshot)} files, "''',
     '''f"Tables behind every figure and claim: `{tables.as_posix()}/`, in the data/ layout ({len(snapshot)} files, "'''),
    ('''    p.add_argument("--wall-time", default=None, help="the measured pipeline wall time, as text, for the page")
    p.set_defaults(func=lambda a: print(build_gallery(a.params, a.data, a.out, a.dpi, a.lang, a.wall_time)))''',
     '''    p.add_argument("--wall-time", default=None, help="the measured pipeline wall time, as text, for the page")
    p.add_argument("--tables", default=GALLERY, type=Path, help=f"where the tables go (default: {GALLERY})")
    p.set_defaults(func=lambda a: print(build_gallery(a.params, a.data, a.out, a.dpi, a.lang, a.wall_time, a.tables)))'''),
])
s = (R / "src/blocklab/reporting/gallery.py").read_text(encoding="utf-8")
if "import GALLERY" not in s and "records import" not in s:
    s = s.replace("from ..pipeline import FIGURES\n", "from ..pipeline import FIGURES\nfrom ..records import GALLERY\n")
elif "records import" in s and not re.search(r"records import .*\bGALLERY\b", s):
    s = re.sub(r"from \.\.records import ([^\n]+)", lambda m: "from ..records import " + ", ".join(sorted(set(m.group(1).split(", ")) | {"GALLERY"})), s)
(R / "src/blocklab/reporting/gallery.py").write_text(s, encoding="utf-8")
edit("docs/gallery/README.md", [("Tables behind every figure and claim: `data/` here (",
                                 "Tables behind every figure and claim: `records/gallery/`, in the data/ layout (")])

edit("src/blocklab/reporting/docs.py", [
    ('''    """README.md, bench/README.md and every page under docs/."""
    return [p for p in [root / "README.md", root / "bench" / "README.md", *sorted((root / "docs").rglob("*.md"))]''',
     '''    """README.md, bench/README.md, every page under docs/ and the records' own pages (records/**/README.md)."""
    return [p for p in [root / "README.md", root / "bench" / "README.md", *sorted((root / "docs").rglob("*.md")),
                        *sorted((root / RECORDS).rglob("*.md"))]'''),
])
s = (R / "src/blocklab/reporting/docs.py").read_text(encoding="utf-8")
s = re.sub(r"from \.\.records import ([^\n]+)", lambda m: "from ..records import " + ", ".join(sorted(set(m.group(1).split(", ")) | {"RECORDS"})), s, count=1)
(R / "src/blocklab/reporting/docs.py").write_text(s, encoding="utf-8")

if "blocklab.records" not in (R / "tests/test_layers.py").read_text(encoding="utf-8"):
    edit("tests/test_layers.py", [('''    "params": ["blocklab.config", "blocklab.params",''', '''    "params": ["blocklab.config", "blocklab.params", "blocklab.records",''')])

# tests/test_docs.py::test_docs_holds_pages_and_pictures_and_the_records_have_one_home_in_the_code was added with
# this move (commit history); it is not re-written here.

# the gallery's params.yaml now names records/: its manifest re-recorded (the tables' records unchanged)
sys.path.insert(0, str(R / "src"))
from blocklab.integrity import record_snapshot, verify_snapshot  # noqa: E402
import json  # noqa: E402
before = json.loads((R / "records/gallery/MANIFEST.json").read_text())["files"]
after = record_snapshot(R / "records/gallery")["files"]
changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
print("gallery manifest: changed records:", changed)
assert changed in ([], ["params.yaml"]), changed
verify_snapshot(R / "records/gallery")
