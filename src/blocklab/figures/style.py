"""Shared figure style: Korean labels by default (NanumGothic from koreanize-matplotlib), English on request."""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import koreanize_matplotlib  # noqa: E402,F401  (registers NanumGothic and sets it as the default family)
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from ..io import RECORD_SUFFIX, data_layout, recorded_path  # noqa: E402

LANGS = ("ko", "en")


def setup(lang: str = "ko") -> None:
    if lang not in LANGS:
        raise ValueError(f"lang={lang!r} is not allowed; choose one of {list(LANGS)}")
    sns.set_theme(style="whitegrid", context="notebook", font="NanumGothic", rc={"axes.unicode_minus": False})


def log_y(ax) -> None:
    """Log y axis with plain decimal tick labels: the default 10^-3 labels are mathtext, whose minus sign (U+2212)
    NanumGothic lacks, so Korean figures would show a dummy glyph there. An axis that spans less than a decade or two
    (the smoke's losses, 2 to 7.5) holds one power of ten or none: there the minor ticks at 2, 3 and 5 times a power of
    ten are labelled too (at 2 and 5 below two decades), so that every log axis has at least two labelled ticks."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: _minor_label(ax, value)))


def _minor_label(ax, value: float) -> str:
    """A minor tick's label on a log axis (``log_y``): at 2, 3 or 5 times a power of ten where the view spans at most
    about one decade, at 2 and 5 up to two decades, none beyond (the powers of ten are labelled there)."""
    low, high = sorted(ax.get_ylim())
    if not (value > 0 and low > 0):
        return ""
    decades = math.log10(high / low)
    lead = round(value / 10 ** math.floor(math.log10(value) + 1e-9), 6)
    shown = (2, 3, 5) if decades <= 1.2 else (2, 5) if decades <= 2.2 else ()
    return f"{value:g}" if lead in shown else ""


def text(lang: str, ko: str, en: str) -> str:
    """Pick the label for the figure language."""
    return ko if lang == "ko" else en


def relative_sidecar(sidecar, data) -> dict:
    """Rewrite a figure's JSON sidecar (``save``) so that its sources name the data/ layout (``data_layout``), not the
    absolute paths of the machine that drew it: a copy kept in git (the gallery), so without the checksum records of
    the figure and its sidecar (git checks what it keeps; docs/ holds pages and pictures only). Returns the record."""
    sidecar = Path(sidecar)
    record = json.loads(sidecar.read_text(encoding="utf-8"))
    record["sources"] = [data_layout(s, data) for s in record["sources"]]
    with recorded_path(sidecar, record=False) as tmp:
        tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for picture in sidecar.parent.glob(f"{sidecar.stem}.*{RECORD_SUFFIX}"):
        picture.unlink()
    return record


def project_relative(source) -> str:
    """A figure's source as its sidecar records it: relative to the project (the folder the pipeline's jobs run in,
    here) when it lies there, so that the record holds on another machine or after a move; any other as given."""
    try:
        return Path(source).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return str(source)


def save(fig, path, dpi: int = 150, sources=(), params: dict | None = None, record: bool = True) -> Path:
    """Write the figure atomically, plus ``<name>.json`` saying which data files and parameters made it, each with its
    checksum record (``NAME.sha256``, ``io.recorded_path``) that `blocklab verify` checks; ``record=False`` for a
    figure kept in git (docs/)."""
    path = Path(path)
    with recorded_path(path, record) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    from .. import provenance

    sidecar = {"figure": path.name, "sources": [project_relative(s) for s in sources], "params": params or {},
               **provenance.code_version()}
    with recorded_path(path.with_suffix(".json"), record) as tmp:
        tmp.write_text(json.dumps(sidecar, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
