"""`make lock`: requirements.lock from the working install, each package pinned with the sha256 of its file.

pip's hash-checking form (`pip install --require-hashes --no-deps -r requirements.lock`, as `make install` runs it): a
file whose bytes differ from the recorded hash (a changed upload, a tampered mirror, a truncated download) is refused.
The hashes are those of the files pip downloads for this machine (Linux x86_64, CPython 3.11 here); on another
platform, run `make lock` there. torch is the CPU build (``2.13.0+cpu``), as the install the tests were measured with:
pip finds it where this machine's pip configuration points (find-links), elsewhere on PyTorch's CPU index
(`make install TORCH_INDEX=https://download.pytorch.org/whl/cpu`).

Usage: python scripts/lock.py [OUT]   (default: requirements.lock; run with the project's venv python)
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

HEADER = """# Every package the project installs, pinned, with the sha256 of its file (pip's --require-hashes form; torch is the
# CPU build). `make install` installs exactly these. Regenerate after changing pyproject.toml: make lock (scripts/lock.py)
"""


def pins() -> list[str]:
    # --all: setuptools too (torch requires it, and a new venv's own is older); pip itself is the Makefile's PIP_VERSION
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"], check=True,
                            capture_output=True, text=True).stdout.splitlines()
    return sorted((line for line in frozen if "==" in line and not line.lower().startswith(("blocklab==", "pip=="))),
                  key=lambda line: line.lower())


def file_name(path: Path) -> str:
    if path.name.endswith(".whl"):
        return canonicalize_name(parse_wheel_filename(path.name)[0])
    return canonicalize_name(parse_sdist_filename(path.name)[0])


def hashed(requirements: list[str], extra: list[str] = ()) -> str:
    with tempfile.TemporaryDirectory(prefix="blocklab-lock-") as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", scratch, *extra,
                        *requirements], check=True)
        digests = {file_name(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(scratch).iterdir()}
    lines = []
    for requirement in requirements:
        name = canonicalize_name(requirement.split("==")[0])
        if name not in digests:
            raise SystemExit(f"scripts/lock.py: pip downloaded no file for {requirement}")
        lines.append(f"{requirement} \\\n    --hash=sha256:{digests[name]}")
    return HEADER + "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path("requirements.lock")
    text = hashed(pins())
    tmp = out.with_name(out.name + ".new")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    print(f"{out}: {text.count('--hash=')} packages, each with its sha256", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
