"""Issue 48, point 5: every reference to the recorded runs' old homes under docs/ rewritten to records/ (re-runnable).
Python code names the locations by the constants of blocklab.records; prose and data files name the new paths."""
import os, re, subprocess, sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
os.chdir(ROOT)
MOVES = [("docs/gallery/data", "records/gallery"), ("docs/sensitivity", "records/sensitivity"),
         ("docs/dynamics", "records/dynamics"), ("docs/inference", "records/inference"),
         ("docs/lab/runs", "records/lab/runs"), ("docs/reviewer", "records/reviewer")]
CONST = {"docs/gallery/data": "GALLERY", "docs/sensitivity": "SENSITIVITY", "docs/dynamics": "DYNAMICS",
         "docs/inference": "INFERENCE", "docs/lab/runs": "LAB_RUNS", "docs/reviewer": "REVIEWER"}
JOINED = [(r'/ "docs" / "gallery" / "data"', "GALLERY"), (r'/ "docs" / "lab" / "runs"', "LAB_RUNS"),
          (r'/ "docs" / "sensitivity"', "SENSITIVITY"), (r'/ "docs" / "dynamics"', "DYNAMICS"),
          (r'/ "docs" / "inference"', "INFERENCE"), (r'/ "docs" / "reviewer"', "REVIEWER")]
OLD = "|".join(re.escape(o) for o, _ in MOVES)
PROSE = re.compile(rf"(?<![\w/.])({OLD})(?=/|\b(?!\.md))")  # docs/dynamics/x, docs/dynamics` ; not docs/dynamics.md


def new_path(old: str) -> str:
    for o, n in MOVES:
        if old == o or old.startswith(o + "/"):
            return n + old[len(o):]
    return old


def prose(text: str) -> str:
    return PROSE.sub(lambda m: new_path(m.group(1)), text)


def python(text: str, module: str | None) -> str:
    used = set()
    for pattern, name in JOINED:
        if pattern in text:
            text = text.replace(pattern, f"/ {name}")
            used.add(name)

    def literal(m):
        prefix, quote, old, rest = m.group(1), m.group(2), m.group(3), m.group(4)
        name = CONST[old]
        used.add(name)
        if not rest and not prefix:
            return name
        body = rest.replace("{", "{{").replace("}", "}}") if "f" not in prefix else rest
        return f"f{quote}{{{name}}}{body}{quote}"

    text = re.sub(rf'(?<![\w"\'])(f?)(["\'])({OLD})((?:/[^"\'\n]*)?)\2', literal, text)
    text = prose(text)
    names = sorted(n for n in used if re.search(rf"\b{n}\b", text))
    if names and f"from {module} import" not in text:
        line = (f"from {module} import {', '.join(names)}\n")
        lines = text.split("\n")
        # after the last top-level import of the header
        last = max((i for i, l in enumerate(lines[:200]) if re.match(r"(from \S+ import |import )", l)), default=None)
        if last is None:
            lines.insert(0, line.rstrip("\n"))
        else:
            while lines[last].rstrip().endswith(("(", ",")) and not lines[last].rstrip().endswith(")"):
                last += 1
            lines.insert(last + 1, line.rstrip("\n"))
        text = "\n".join(lines)
    return text


files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
skip_ext = (".csv", ".parquet", ".sha256", ".png", ".pt", ".ipynb", ".lock")
for f in files:
    p = Path(f)
    if not p.is_file() or p.suffix in skip_ext or p.name == "MANIFEST.json" or f.startswith("scripts/records_move/"):
        continue
    if f.startswith("records/") and not (p.suffix in (".md", ".py") or p.name == "params.yaml"
                                         or f.startswith("records/reviewer/")):  # its recorded refresh commands
        continue  # recorded artifacts (tables, sealed meta.json, the reviewer's recorded commands) stay as written
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        continue
    if not re.search(OLD.replace("/", r"/") + "|\"docs\" / \"", text):
        continue
    if p.suffix == ".py" and (f.startswith("src/blocklab/") or f.startswith("tests/") or f.startswith("scripts/")):
        if f.startswith("src/blocklab/"):
            depth = len(Path(f).relative_to("src/blocklab").parts) - 1
            module = "." * (depth + 1) + "records"
        else:
            module = "blocklab.records"
        new = python(text, module)
    else:
        new = prose(text)
    if new != text:
        p.write_text(new, encoding="utf-8")
        print("rewrote", f)

# relative links of markdown pages: from each file's old home to its link's new home
moved = {}
for line in subprocess.run(["git", "diff", "--cached", "-M", "--name-status", "HEAD"], capture_output=True, text=True).stdout.splitlines():
    parts = line.split("\t")
    if parts[0].startswith("R"):
        moved[parts[2]] = parts[1]
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s#]+)(#[^)\s]*)?\)")
for f in [x for x in subprocess.run(["git", "ls-files", "*.md"], capture_output=True, text=True).stdout.split()]:
    p = Path(f)
    old_home = Path(moved.get(f, f)).parent
    text = p.read_text(encoding="utf-8")

    def fix(m):
        link = m.group(2)
        if re.match(r"[a-z]+:", link) or link.startswith("/"):
            return m.group(0)
        target_old = os.path.normpath(old_home / link)
        target_new = new_path(target_old.replace(os.sep, "/"))
        if target_new == target_old and f not in moved:
            return m.group(0)
        if not Path(target_new).exists():
            return m.group(0)
        rel = os.path.relpath(target_new, p.parent).replace(os.sep, "/")
        if link.endswith("/") and not rel.endswith("/"):
            rel += "/"
        return f"{m.group(1)}{rel}{m.group(3) or ''})"

    new = LINK.sub(fix, text)
    if new != text:
        p.write_text(new, encoding="utf-8")
        print("links", f)
