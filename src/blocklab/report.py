"""The analysis report: which data each figure is drawn from, and running the notebook with papermill."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from .io import atomic_path, read_table
from .params import load_params
from .pipeline import FIGURES


def _frames(data: Path, name: str) -> list[pd.DataFrame]:
    return [read_table(data / Path(p).relative_to("data")) for p in FIGURES[name]]


def build_figure(name: str, params: dict, data: str | Path = "data", lang: str | None = None):
    """Draw one figure of ``FIGURES`` from its cached data; returns the matplotlib Figure."""
    from .figures import doc000, doc004, params as params_figs, probe, style

    lang = lang or params["figures"]["lang"]
    style.setup(lang)
    frames = _frames(Path(data), name)
    vocab = params["copy_task"]["vocab_size"]
    draw = {
        "gradnorm_at_init": lambda f: doc000.gradnorm_figure(f[0], lang=lang),
        "loss_curves": lambda f: doc000.loss_curves_figure(f[0], lang=lang, vocab_size=vocab),
        "problem9_scores": lambda f: doc000.problem9_figure(f[0], lang=lang),
        "problem10_residual_growth": lambda f: doc000.problem10_figure(f[0], lang=lang),
        "problem11_norm_warmup": lambda f: doc000.problem11_figure(f[0], lang=lang),
        "activation_norms": lambda f: doc004.activation_norms_figure(f[0], lang=lang),
        "residual_ablation": lambda f: doc004.residual_ablation_figure(f[0], lang=lang),
        "reverse_copy": lambda f: doc004.reverse_copy_figure(f[0], f[1], lang=lang),
        "param_counts": lambda f: params_figs.block_breakdown_figure(f[0], lang=lang),
        "residual_growth_trained": lambda f: probe.residual_growth_figure(f[0], f[1], lang=lang),
    }[name]
    return draw(frames)


def save_figure(name: str, params: dict, data: str | Path = "data", figs: str | Path = "figs", lang: str | None = None):
    """Draw and save ``figs/<name>.png`` with a JSON sidecar naming its data files and parameters."""
    from .figures import style

    fig = build_figure(name, params, data, lang)
    sources = [str(Path(data) / Path(p).relative_to("data")) for p in FIGURES[name]]
    return style.save(fig, Path(figs) / f"{name}.png", dpi=params["figures"]["dpi"], sources=sources,
                      params={"figures": params["figures"], "lang": lang or params["figures"]["lang"]})


def run_notebook(params_path: str, notebook: str, out_notebook: str, out_html: str, figs: str, data: str = "data",
                 lang: str | None = None) -> None:
    """Execute the analysis notebook with papermill (it writes every figure), then export it to HTML."""
    import nbconvert
    import nbformat
    import papermill

    params = load_params(params_path)
    parameters = {"params_path": str(Path(params_path).resolve()), "data_dir": str(Path(data).resolve()),
                  "figs_dir": str(Path(figs).resolve()), "lang": lang or params["figures"]["lang"]}
    Path(figs).mkdir(parents=True, exist_ok=True)
    with atomic_path(out_notebook) as tmp_nb:
        papermill.execute_notebook(
            notebook, str(tmp_nb), parameters=parameters, kernel_name="python3", cwd=os.getcwd(), progress_bar=False,
        )
        body, _ = nbconvert.HTMLExporter().from_notebook_node(nbformat.read(tmp_nb, as_version=4))
        with atomic_path(out_html) as tmp_html:
            tmp_html.write_text(body, encoding="utf-8")


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="run the analysis notebook (papermill): every figure into figs/, plus HTML")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--notebook", default="notebooks/analysis.ipynb")
    p.add_argument("--out-notebook", default="reports/analysis.ipynb")
    p.add_argument("--out-html", default="reports/analysis.html")
    p.add_argument("--figs", default="figs")
    p.add_argument("--data", default="data")
    p.add_argument("--lang", choices=["ko", "en"], default=None, help="figure language (default: params figures.lang)")
    p.set_defaults(func=lambda a: run_notebook(a.params, a.notebook, a.out_notebook, a.out_html, a.figs, a.data, a.lang))

    p = subparsers.add_parser("figure", help="redraw one figure from cached data, without the notebook")
    p.add_argument("name", choices=sorted(FIGURES))
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--data", default="data")
    p.add_argument("--figs", default="figs")
    p.add_argument("--lang", choices=["ko", "en"], default=None)
    p.set_defaults(func=lambda a: print(save_figure(a.name, load_params(a.params), a.data, a.figs, a.lang)))
