"""The analysis report: figures from cached data, each problem's question and answer, formatted tables, and the papermill
run that turns notebooks/analysis.ipynb into reports/analysis.html (code hidden, project font embedded).

Texts (headings, the documents' questions, column names) come from answers.yaml, in Korean and English.
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

from ..io import check_table, data_layout, read_table, recorded_path
from ..params_file import load_params
from ..pipeline import FIGURES
from ..run_settings import CopyModel, CopyTask, Sweep
from . import answers as answers_mod
from .sensitivity import robustness
from .claims import DOCUMENT_SETUP, INCONCLUSIVE, NOT_CHECKABLE, NOT_REPRODUCED, PARTLY, REPRODUCED

VERDICT_ORDER = (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE, NOT_CHECKABLE)
VERDICT_CLASS = {REPRODUCED: "v-ok", PARTLY: "v-partly", NOT_REPRODUCED: "v-no", INCONCLUSIVE: "v-open",
                 NOT_CHECKABLE: "v-na"}
SENSITIVITY_FIGURES = {  # drawn by the sensitivity family's own rule; shown here when the study is in the report
    "sensitivity_phase": ["data/sensitivity/summary.csv"],
    "sensitivity_loss_curves": ["data/sensitivity/losses.csv"],
    "sensitivity_gradnorm": ["data/sensitivity/gradnorm.csv"],
}

# The report's sections in order: (key, document, figures, tables). Problems and exercises also carry answers.
SECTIONS = [
    ("gradnorm", "000", ["gradnorm_at_init"], []),
    ("p9", "000", ["problem9_scores"], ["problem9"]),
    ("p10", "000", ["problem10_residual_growth", "residual_growth_trained"], ["residual_sim"]),
    ("p11", "000", ["loss_curves", "problem11_norm_warmup"], ["sweep"]),
    ("params", "004", ["param_counts"], ["audit", "models"]),
    ("e1", "004", [], []),
    ("e2", "004", ["activation_norms"], []),
    ("ablation", "004", ["residual_ablation"], []),
    ("e3", "004", ["reverse_copy"], ["reverse_copy"]),
]

# table -> (data file, columns shown, decimals per column; "pct": percent, "int": thousands separators)
TABLES = {
    "problem9": ("problem9/scores.csv", ["student", "subject", "raw", "per_student", "per_subject_pair"],
                 {"raw": 0, "per_student": 3, "per_subject_pair": 3}),
    "residual_sim": ("residual_sim/table.csv", ["blocks", "mean_length", "std_length", "sqrt_L_plus_1", "rel_change",
                                                "turn_deg"],
                     {"mean_length": 3, "std_length": 3, "sqrt_L_plus_1": 3, "rel_change": 3, "turn_deg": 1}),
    "sweep": ("sweep/summary.csv", ["norm", "warmup", "seed", "final_loss", "min_loss", "min_loss_step", "outcome",
                                    "wall_time_s"],
              {"final_loss": 4, "min_loss": 4, "min_loss_step": "int", "wall_time_s": 0}),
    "audit": ("param_counts/audit.csv", ["step", "quantity", "document_expression", "document_written", "computed_value",
                                         "relative_error", "verdict", "note"],
              {"document_value": "int", "computed_value": "int", "relative_error": "pct"}),
    "models": ("param_counts/models.csv", ["model", "layers", "d_model", "heads", "kv_heads", "ffn_ratio", "vocab_size",
                                           "total_formula", "published_total"],
               {"ffn_ratio": 2, "vocab_size": "int", "total_formula": "int", "published_total": "int"}),
    "reverse_copy": ("reverse_copy/summary.csv", ["variant", "seeds", "steps", "n_params", "final_loss_mean",
                                                  "final_loss_std", "seq_accuracy_mean"],
                     {"n_params": "int", "final_loss_mean": 3, "final_loss_std": 3, "seq_accuracy_mean": "pct"}),
}


def _frames(data: Path, name: str) -> list[pd.DataFrame]:
    return [read_table(data / Path(p).relative_to("data")) for p in FIGURES[name]]


def build_figure(name: str, params: dict, data: str | Path = "data", lang: str | None = None):
    """Draw one figure of ``FIGURES`` from its cached data; returns the matplotlib Figure."""
    from ..figures import doc000, doc004, params as params_figs, residual_trained, style

    lang = lang or params["figures"]["lang"]
    style.setup(lang)
    frames = _frames(Path(data), name)
    vocab = CopyTask.from_params(params).vocab_size
    draw = {
        "gradnorm_at_init": lambda f: doc000.gradnorm_figure(f[0], lang=lang),
        "loss_curves": lambda f: doc000.loss_curves_figure(f[0], lang=lang, vocab_size=vocab),
        "problem9_scores": lambda f: doc000.problem9_figure(f[0], lang=lang, words=answers_mod.in_english),
        "problem10_residual_growth": lambda f: doc000.problem10_figure(f[0], lang=lang),
        "problem11_norm_warmup": lambda f: doc000.problem11_figure(f[0], lang=lang),
        "activation_norms": lambda f: doc004.activation_norms_figure(f[0], lang=lang),
        "residual_ablation": lambda f: doc004.residual_ablation_figure(f[0], lang=lang),
        "reverse_copy": lambda f: doc004.reverse_copy_figure(f[0], f[1], lang=lang),
        "param_counts": lambda f: params_figs.block_breakdown_figure(f[0], lang=lang),
        "residual_growth_trained": lambda f: residual_trained.residual_growth_figure(f[0], f[1], lang=lang),
    }[name]
    return draw(frames)


def save_figure(name: str, params: dict, data: str | Path = "data", figs: str | Path = "figs", lang: str | None = None):
    """Draw and save ``figs/<name>.png`` with a JSON sidecar naming its data files and parameters."""
    from ..figures import style

    fig = build_figure(name, params, data, lang)
    sources = [str(Path(data) / Path(p).relative_to("data")) for p in FIGURES[name]]
    return style.save(fig, Path(figs) / f"{name}.png", dpi=params["figures"]["dpi"], sources=sources,
                      params={"figures": params["figures"], "lang": lang or params["figures"]["lang"]})


# ---- HTML pieces ---------------------------------------------------------------------------------------------------------


def _fmt(value, how) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (bool,)) or not isinstance(value, (int, float)):
        return str(value)
    if how == "int":
        return f"{value:,.0f}"
    if how == "pct":
        return f"{value:.1%}"
    if isinstance(how, int):
        if how >= 3 and value != 0 and abs(value) < 10 ** -(how - 1):
            return f"{value:.2e}"
        return f"{value:,.{how}f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def table_html(frame: pd.DataFrame, columns: list[str], formats: dict, names: dict, lang: str, caption: str = "",
               verdict_column: str | None = "verdict") -> str:
    """A plain HTML table: readable column names, rounded numbers, rows coloured by their verdict when they have one."""
    columns = [c for c in columns if c in frame.columns]
    head = "".join(f"<th>{html.escape(names.get(c, {}).get(lang, c))}</th>" for c in columns)
    words = answers_mod.in_english if lang == "en" else str  # the data's Korean words, on an English page
    rows = []
    for record in frame[columns].to_dict("records"):
        verdict = record.get(verdict_column) if verdict_column else None
        cls = f' class="{VERDICT_CLASS.get(verdict, "")}"' if verdict in VERDICT_CLASS else ""
        cells = "".join(f"<td>{html.escape(words(_fmt(record[c], formats.get(c))))}</td>" for c in columns)
        rows.append(f"<tr{cls}>{cells}</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<table class="blocklab">{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


class Report:
    """Everything the notebook shows, as HTML strings (the notebook only displays them)."""

    def __init__(self, params_path: str | Path, data_dir: str | Path = "data", figs_dir: str | Path = "figs",
                 lang: str | None = None, draw: bool = True):
        """``draw``: redraw each figure into ``figs_dir`` (False: show those there, or say one is missing)."""
        self.params_path = Path(params_path)
        self.draw = draw
        self.params = load_params(params_path)
        self.lang = lang or self.params["figures"]["lang"]
        self.data_dir, self.figs_dir = Path(data_dir), Path(figs_dir)
        self.data, self.claims = answers_mod.load(self.data_dir, self.params)
        self.texts = answers_mod.texts()
        self.hash = hashlib.sha256(self.params_path.read_bytes()).hexdigest()[:16]
        self.figure_number = 0
        self.words = answers_mod.in_english if self.lang == "en" else str  # the data's and claims' Korean words, in English

    def t(self, *keys, **values) -> str:
        node = self.texts["report"]
        for key in keys:
            node = node[key]
        text = node[self.lang]
        return text.format(**values) if values else text

    def column_names(self) -> dict:
        return self.texts["report"]["columns"]

    # headings and the table of contents

    def title(self, key: str) -> str:
        if key in self.texts["problems"]:
            return answers_mod.problem_title(key, self.lang)
        return self.t("sections", key)

    def anchor(self, key: str) -> str:
        return f"sec-{key}"

    def header(self) -> str:
        from ..provenance import code_version

        p, model, sweep = self.params, CopyModel.from_params(self.params), Sweep.from_params(self.params)
        commit = (code_version().get("git_commit") or "?")[:10]
        run = self.t("run", params=self.params_path.name, hash=self.hash, commit=commit, lang=self.lang,
                     layers=model.n_layers, width=model.d_model, steps=sweep.steps, seeds=len(sweep.seeds))
        differ = [f"{k}={p[k.split('.')[0]][k.split('.')[1]]} ({v})" for k, v in DOCUMENT_SETUP.items()
                  if p[k.split(".")[0]][k.split(".")[1]] != v]
        note = f'<p class="note">{html.escape(self.t("not_document", differ=", ".join(differ)))}</p>' if differ else ""
        toc = []
        for doc in ("000", "004"):
            items = "".join(f'<li><a href="#{self.anchor(k)}">{html.escape(self.title(k))}</a></li>'
                            for k, d, _, _ in SECTIONS if d == doc)
            toc.append(f'<li><a href="#doc-{doc}">{html.escape(self.t(f"document_{doc}"))}</a><ul>{items}</ul></li>')
        toc.append(f'<li><a href="#sec-claims">{html.escape(self.t("claims_title"))}</a></li>')
        return (f'<h1 id="top">{html.escape(self.t("title"))}</h1><p>{html.escape(self.t("intro"))}</p>'
                f'<p class="run">{html.escape(run)}</p>{note}'
                f'<nav class="toc"><h2>{html.escape(self.t("toc"))}</h2><ul>{"".join(toc)}</ul></nav>')

    def document_heading(self, doc: str) -> str:
        return f'<h2 id="doc-{doc}">{html.escape(self.t(f"document_{doc}"))}</h2>'

    # figures

    def figure(self, name: str, draw: bool = True) -> str:
        """The figure (redrawn into figs/ from its data when ``draw``) with a caption naming its data and parameters."""
        path = self.figs_dir / f"{name}.png"
        if draw and self.draw:
            path = save_figure(name, self.params, self.data_dir, self.figs_dir, self.lang)
        if not path.exists():
            return f'<p class="missing">{html.escape(self.t("missing_figure", name=name, path=str(path)))}</p>'
        sidecar = json.loads(path.with_suffix(".json").read_text(encoding="utf-8")) if path.with_suffix(".json").exists() else {}
        sources = [self._relative(s) for s in sidecar.get("sources", [])]
        commit = (sidecar.get("git_commit") or "?")[:10]
        self.figure_number += 1
        encoded = base64.b64encode(path.read_bytes()).decode()
        caption = (f"{self.t('figure')} {self.figure_number}. <code>figs/{name}.png</code> — {self.t('data')}: "
                   + ", ".join(f"<code>{html.escape(s)}</code>" for s in sources)
                   + f"; {self.t('params_hash')}: <code>{self.hash}</code>; {self.t('code')}: <code>{commit}</code>")
        return (f'<figure class="blocklab" data-figure="{name}"><img alt="{name}" src="data:image/png;base64,{encoded}">'
                f"<figcaption>{caption}</figcaption></figure>")

    def _relative(self, source: str) -> str:
        return data_layout(source, self.data_dir)

    # sections

    def question(self, key: str) -> str:
        if key in self.texts["problems"]:
            label, text = self.texts["labels"]["question"][self.lang], self.texts["problems"][key]["question"][self.lang]
        else:
            label, text = self.t("says"), self.t("statements", key)
        return f'<blockquote class="question"><strong>{html.escape(label)}</strong> — {html.escape(text)}</blockquote>'

    def table(self, name: str) -> str:
        relative, columns, formats = TABLES[name]
        if not self.data.exists(relative):
            return ""
        frame = self.data.table(relative)
        if name == "reverse_copy":
            from ..experiments.reverse_copy import variant_table

            frame = variant_table(frame[~frame["match_params"].astype(bool)])
        if name == "problem9":
            frame = frame.assign(per_subject_pair=frame["per_subject_pair"].where(frame["in_pair"].astype(bool)))
        if "outcome" in frame:
            labels = self.texts["labels"]["outcome"]
            frame = frame.assign(outcome=frame["outcome"].map(lambda o: labels.get(o, {self.lang: o})[self.lang]))
        if "norm" in frame:  # the declared order (model_config.NORM_POSITION_SPECS), as the figures draw them
            frame = answers_mod.by_norm(frame)
            frame = frame.assign(norm=frame["norm"].map(lambda n: answers_mod.norm_label(n, self.lang)))
        if name == "audit":
            labels = self.texts["labels"]["audit"]
            frame = frame.assign(verdict_code=frame["verdict"].map({"right": REPRODUCED, "rough": PARTLY, "wrong": NOT_REPRODUCED}),
                                 verdict=frame["verdict"].map(lambda v: labels.get(v, {self.lang: v})[self.lang]))
        if "variant" in frame:
            labels = self.texts["labels"]["variant"]
            frame = frame.assign(variant=frame["variant"].map(lambda v: labels.get(v, {self.lang: v})[self.lang]))
        caption = f"{self.t('table')}: data/{relative}"
        verdict_column = "verdict_code" if name == "audit" else None  # the document's arithmetic: right or wrong
        return table_html(frame, columns, formats, self.column_names(), self.lang, caption, verdict_column)

    def answers_html(self, key: str) -> str:
        if key not in self.texts["problems"]:
            return ""
        parts = []
        for a in answers_mod.answers_for(key, self.data, self.claims, self.lang):
            parts.append(self._answer_html(a))
        return f'<div class="answers" data-problem="{key}">{"".join(parts)}</div>'

    def _answer_html(self, a) -> str:
        labels, verdicts = self.texts["labels"], self.texts["verdicts"]
        head = f"<strong>{html.escape(a.part)}</strong> " if a.part else f"<strong>{html.escape(labels['answer'][self.lang])}</strong> "
        ids = f' <span class="ids">({html.escape(labels["claims"][self.lang])}: {", ".join(a.claim_ids)})</span>' if a.claim_ids else ""
        return (f'<div class="answer {VERDICT_CLASS[a.verdict]}" data-answer="{a.key}" data-verdict="{a.verdict}">'
                f"<p>{head}{html.escape(self.words(a.text))}</p>"
                f'<p class="beside"><em>{html.escape(labels["document"][self.lang])}:</em> '
                f'{html.escape(self.words(a.document_value))}'
                f' · <em>{html.escape(labels["verdict"][self.lang])}:</em> '
                f'<span class="verdict">{html.escape(verdicts[a.verdict][self.lang])}</span>{ids}</p></div>')

    def section(self, key: str) -> str:
        _, _, figures, tables = next(s for s in SECTIONS if s[0] == key)
        parts = [f'<h3 id="{self.anchor(key)}">{html.escape(self.title(key))}</h3>', self.question(key)]
        parts += [self.figure(name) for name in figures]
        parts.append(self.answers_html(key))
        parts += [self.table(name) for name in tables]
        if key == "p11":
            parts.append(self.sensitivity())
            parts.append(self.dynamics())
            parts.append(self.inference())
        return f'<section class="blocklab" data-section="{key}">{"".join(parts)}</section>'

    def sensitivity(self) -> str:
        head = f'<h4 id="sec-sensitivity">{html.escape(self.t("sensitivity_title"))}</h4>'
        if not answers_mod.sensitivity_present(self.data):
            return f'{head}<p class="note" data-sensitivity="absent">{html.escape(self.t("sensitivity_absent"))}</p>'
        parts = [head]
        parts += [self.figure(name, draw=False) for name in SENSITIVITY_FIGURES]
        by_setting = self.data.table(answers_mod.SENSITIVITY["claims_by_setting"])
        verdicts = self.texts["verdicts"]
        settings = list(dict.fromkeys(by_setting["setting"]))
        judged = by_setting.set_index(["id", "setting"])
        agree = robustness(by_setting).set_index("id")
        head_row = "".join(f"<th>{html.escape(s)}</th>" for s in settings)
        rows = []
        for claim_id, group in by_setting.groupby("id", sort=False):
            cells = []
            for s in settings:  # the verdict, and what was measured there on hovering it
                verdict = judged["verdict"].get((claim_id, s))
                measured = str(judged["measured"].get((claim_id, s), ""))
                cells.append(f'<td class="{VERDICT_CLASS.get(verdict, "")}" title="{html.escape(measured)}">'
                             f'{html.escape(verdicts.get(verdict, {self.lang: str(verdict)})[self.lang])}</td>')
            a = agree.loc[claim_id]
            rows.append(f"<tr><td>{html.escape(claim_id)}</td><td>{html.escape(str(group['claim'].iloc[0]))}</td>"
                        f"{''.join(cells)}<td class=\"agree\">{a['agree']}/{a['settings']}</td></tr>")
        names = self.column_names()
        parts.append(f'<table class="blocklab sensitivity" data-sensitivity="present"><caption>{html.escape(self.t("sensitivity_table"))}</caption>'
                     f"<thead><tr><th>{names['id'][self.lang]}</th><th>{names['claim'][self.lang]}</th>{head_row}"
                     f"<th>{html.escape(self.t('sensitivity_agree'))}</th></tr></thead>"
                     f"<tbody>{''.join(rows)}</tbody></table>")
        return "".join(parts)

    def dynamics(self) -> str:
        """The training dynamics: both figures, the collapse rate with its interval, the precursors of every
        spike or collapse, and the compare runs' first steps."""
        from ..studies.dynamics.aggregate import early_updates, event_precursors
        from ..studies.dynamics.plan import FIGURES as DYNAMICS_FIGURES

        head = f'<h4 id="sec-dynamics">{html.escape(self.t("dynamics_title"))}</h4>'
        if not answers_mod.dynamics_present(self.data):
            return f'{head}<p class="note" data-dynamics="absent">{html.escape(self.t("dynamics_absent"))}</p>'
        parts = [head]
        parts += [self.figure(name, draw=False) for name in DYNAMICS_FIGURES]
        names = self.column_names()
        rates = self.data.table(answers_mod.DYNAMICS["rates"]).copy()
        interval = lambda r, e: (f"{int(r[e])} / {int(r['learned'])} ({answers_mod.pct(r[e + '_low'])}–"  # noqa: E731
                                 f"{answers_mod.pct(r[e + '_high'])})")
        rates["collapsed_text"] = [interval(r, "collapsed") for _, r in rates.iterrows()]
        rates["spiked_text"] = [interval(r, "spiked") for _, r in rates.iterrows()]
        if "to_chance" in rates:
            rates["to_chance_text"] = [interval(r, "to_chance") for _, r in rates.iterrows()]
        parts.append(table_html(rates, ["setting", "runs", "learned", "collapsed_text", "spiked_text", "to_chance_text"], {}, names,
                                self.lang, self.t("dynamics_rates"), None))
        summary = self.data.table(answers_mod.DYNAMICS["summary"])
        diagnostics = answers_mod.dynamics_diagnostics(self.data)
        events_ = event_precursors(summary, diagnostics)
        if len(events_):
            parts.append(table_html(events_, ["run", "outcome", "event_step", "event_loss", "adam_rms_ref", "adam_rms_lead",
                                              "grad_ffn_out_ref", "grad_ffn_out_lead", "attn_logit_max_ref",
                                              "attn_logit_max_lead"],
                                    {"event_step": "int", "event_loss": 3, "adam_rms_ref": 3, "adam_rms_lead": 3,
                                     "grad_ffn_out_ref": 3, "grad_ffn_out_lead": 3, "attn_logit_max_ref": 1,
                                     "attn_logit_max_lead": 1}, names, self.lang, self.t("dynamics_events"), None))
        detectors = answers_mod.detector_table(self.data)
        if len(detectors):
            detectors = detectors.copy()
            words = self.texts["answers"]["p11c"]["resolutions"]
            detectors["resolution"] = [words.get(r, {self.lang: r})[self.lang] for r in detectors["resolution"]]
            rate = lambda k, n, lo, hi: (f"{int(k)} / {int(n)} ({answers_mod.pct(lo)}–{answers_mod.pct(hi)})"  # noqa: E731
                                         if n else "—")
            detectors["hits_text"] = [rate(r.hits, r.events_evaluable, r.hit_low, r.hit_high) for r in detectors.itertuples()]
            detectors["fa_text"] = [rate(r.false_alarms, r.windows, r.fa_low, r.fa_high) for r in detectors.itertuples()]
            detectors["lead_text"] = ["—" if r.lead_median != r.lead_median else
                                      f"{r.lead_median:g} ({r.lead_min:g}–{r.lead_max:g})" for r in detectors.itertuples()]
            parts.append(table_html(detectors, ["detector", "resolution", "hits_text", "late", "lead_text", "fa_text",
                                                "runs_with_fa"], {"late": "int", "runs_with_fa": "int"}, names,
                                    self.lang, self.t("dynamics_detectors"), None))
        early = early_updates(summary, diagnostics)
        parts.append(table_html(early, ["run", "outcome", "early_update", "init_grad_out_over_in", "grad_out_over_in_step2",
                                        "grad_out_over_in_step5", "grad_out_over_in_later", "final_logit_max",
                                        "final_entropy_max"],
                                {"early_update": 4, "init_grad_out_over_in": 2, "grad_out_over_in_step2": 2,
                                 "grad_out_over_in_step5": 2, "grad_out_over_in_later": 2,
                                 "final_logit_max": 1, "final_entropy_max": 3}, names, self.lang,
                                self.t("dynamics_early"), None))
        return f'<div class="dynamics" data-dynamics="present">{"".join(parts)}</div>'

    def inference(self) -> str:
        """The document's unstated setup, inferred: the fitting runs' ranking by the pre-registered score."""
        from .inference import FIT_CLAIMS

        head = f'<h4 id="sec-inference">{html.escape(self.t("inference_title"))}</h4>'
        path = "inference/ranking.csv"
        if not (self.data.params.get("inference", {}).get("in_report") and self.data.exists(path)):
            return f'{head}<p class="note" data-inference="absent">{html.escape(self.t("inference_absent"))}</p>'
        ranked = self.data.table(path)
        names = {**self.column_names(), **{i: {"ko": i.removeprefix("d000-"), "en": i.removeprefix("d000-")}
                                           for i in FIT_CLAIMS}}
        formats = {"score": 2, "seed_score_min": 2, "seed_score_max": 2, **{i: 2 for i in FIT_CLAIMS}}
        table = table_html(ranked, ["rank", "setting", *FIT_CLAIMS, "score", "seed_score_min", "seed_score_max", "seeds"],
                           formats, names, self.lang, self.t("inference_table"), None)
        return f'<div class="inference" data-inference="present">{head}{table}</div>'

    # the claims table, grouped by document and section, coloured by verdict

    def claims_table(self) -> str:
        head = f'<h2 id="sec-claims">{html.escape(self.t("claims_title"))}</h2>'
        if self.claims is None:
            return head
        claims = self.claims.assign(document=self.claims["document"].astype(str).str.zfill(3))
        verdicts = self.texts["verdicts"]
        counts = claims["verdict"].value_counts()
        count_text = ", ".join(f"{verdicts[v][self.lang]} {counts[v]}" for v in VERDICT_ORDER if v in counts)
        legend = "".join(f'<span class="chip {VERDICT_CLASS[v]}">{html.escape(verdicts[v][self.lang])}</span>'
                         for v in VERDICT_ORDER)
        parts = [head, f"<p>{html.escape(self.t('claims_intro', counts=count_text))}</p><p class='legend'>{legend}</p>"]
        names = self.column_names()
        columns = ["where", "id", "claim", "document_value", "kind", "measured", "margin", "verdict"]
        claims = claims.assign(kind=claims["kind"] if "kind" in claims else "", margin=claims["margin"].fillna("")
                               if "margin" in claims else "")
        for doc, group in claims.groupby("document", sort=True):
            parts.append(f'<h3 id="claims-{doc}">{html.escape(self.t(f"document_{doc}"))}</h3>')
            rows = []
            for where, block in group.groupby("where", sort=False):
                for i, r in enumerate(block.itertuples(index=False)):
                    first = (f'<td rowspan="{len(block)}" class="where">{html.escape(self.words(where))}</td>'
                             if i == 0 else "")
                    rows.append(f'<tr class="{VERDICT_CLASS.get(r.verdict, "")}" data-verdict="{html.escape(r.verdict)}">{first}'
                                + "".join(f"<td>{html.escape(self.words(str(getattr(r, c))))}</td>"
                                          for c in columns[1:-1])
                                + f'<td class="verdict">{html.escape(verdicts.get(r.verdict, {self.lang: r.verdict})[self.lang])}'
                                + self._decide(r) + "</td></tr>")
            heads = "".join(f"<th>{html.escape(names[c][self.lang])}</th>" for c in columns)
            parts.append(f'<table class="blocklab claims"><thead><tr>{heads}</tr></thead><tbody>{"".join(rows)}</tbody></table>')
        return "".join(parts)

    def _decide(self, row) -> str:
        """An inconclusive verdict's seeds that would decide it (claims.csv's seeds_to_decide), in the report's words."""
        seeds = getattr(row, "seeds_to_decide", None)
        if row.verdict != INCONCLUSIVE or seeds is None or pd.isna(seeds):
            return ""
        return f'<br><span class="decide">{html.escape(self.t("seeds_to_decide", seeds=int(seeds)))}</span>'


# ---- the HTML file: code hidden, the project's font embedded -----------------------------------------------------------------

CSS = """
:root { --jp-content-font-family: 'NanumGothic', sans-serif; --jp-ui-font-family: 'NanumGothic', sans-serif; }
body, .jp-RenderedHTMLCommon, .jp-Notebook { font-family: 'NanumGothic', sans-serif; }
body { max-width: 1150px; margin: 0 auto; line-height: 1.6; }
.jp-RenderedHTMLCommon table.blocklab { border-collapse: collapse; font-size: 0.95em; margin: 0.6em 0 1.4em; table-layout: auto; }
.jp-RenderedHTMLCommon table.blocklab th, .jp-RenderedHTMLCommon table.blocklab td { border: 1px solid #ccc; padding: 3px 7px;
  text-align: left; vertical-align: top; max-width: 36em; }
.jp-RenderedHTMLCommon table.blocklab caption { caption-side: top; text-align: left; color: #555; font-size: 0.95em; }
.v-ok { background: #dcf1dc; } .v-partly { background: #fff1bf; } .v-no { background: #f7d2d2; } .v-na { background: #ececec; }
.v-open { background: #dde8f7; }
tr.v-ok td.verdict, tr.v-partly td.verdict, tr.v-no td.verdict, tr.v-open td.verdict { font-weight: bold; }
td.where { background: #fafafa; font-weight: bold; }
.chip { padding: 2px 8px; margin-right: 6px; border-radius: 4px; }
figure.blocklab { margin: 1em 0 1.5em; } figure.blocklab img { max-width: 100%; height: auto; }
figure.blocklab figcaption { font-size: 0.85em; color: #444; }
blockquote.question { border-left: 4px solid #7a8fb8; background: #f4f6fb; margin: 0.5em 0 1em; padding: 0.5em 1em; }
div.answer { border-left: 4px solid #999; padding: 0.3em 1em; margin: 0.6em 0; }
div.answer.v-ok { border-color: #3c9a3c; } div.answer.v-partly { border-color: #c9a200; }
div.answer.v-no { border-color: #c03b3b; } div.answer.v-na { border-color: #999; }
div.answer.v-open { border-color: #4a74b0; }
div.answer p.beside { font-size: 0.9em; color: #333; } span.ids { color: #666; font-size: 0.9em; }
nav.toc ul { margin: 0.2em 0; } p.note { background: #fff7e0; padding: 0.4em 0.8em; }
"""


def _font_face(text: str) -> str:
    """@font-face rules for NanumGothic (regular and bold) from koreanize-matplotlib, subset to the characters used."""
    import logging

    import koreanize_matplotlib
    from fontTools import subset

    logging.getLogger("fontTools").setLevel(logging.ERROR)  # "TSI0 NOT subset": VTT sources, not needed to render

    fonts = Path(koreanize_matplotlib.__file__).parent / "fonts"
    chars = set(text) | {chr(c) for c in range(32, 127)}
    rules = []
    for weight, file in (("normal", "NanumGothic.ttf"), ("bold", "NanumGothicBold.ttf")):
        options = subset.Options()
        options.flavor = "woff"
        options.layout_features = ["*"]
        font = subset.load_font(str(fonts / file), options)
        subsetter = subset.Subsetter(options)
        subsetter.populate(text="".join(sorted(chars)))
        subsetter.subset(font)
        buffer = io.BytesIO()
        subset.save_font(font, buffer, options)
        encoded = base64.b64encode(buffer.getvalue()).decode()
        rules.append(f"@font-face {{ font-family: 'NanumGothic'; font-weight: {weight}; font-style: normal; "
                     f"src: url(data:font/woff;base64,{encoded}) format('woff'); }}")
    return "\n".join(rules)


def finish_html(body: str, title: str | None = None) -> str:
    """Add the report's style and the embedded font to an exported notebook (and its title)."""
    if title:
        body = re.sub(r"<title>.*?</title>", lambda _: f"<title>{html.escape(title)}</title>", body, count=1, flags=re.S)
    visible = re.sub(r"data:[^\"')]+", "", re.sub(r"<script.*?</script>|<style.*?</style>", "", body, flags=re.S))
    style = f'<style id="blocklab-style">\n{_font_face(visible)}\n{CSS}</style>'
    return body.replace("</head>", style + "\n</head>", 1)


def export_html(notebook_path) -> str:
    """The executed notebook as HTML for readers: inputs (code), prompts and the notebook-only note hidden."""
    import nbconvert
    import nbformat

    from traitlets.config import Config

    config = Config()
    config.TagRemovePreprocessor.enabled = True
    config.TagRemovePreprocessor.remove_cell_tags = {"notebook-only"}  # the notebook's own note on how it works
    exporter = nbconvert.HTMLExporter(config=config, exclude_input=True, exclude_input_prompt=True,
                                      exclude_output_prompt=True)
    notebook = nbformat.read(str(notebook_path), as_version=4)
    body, _ = exporter.from_notebook_node(notebook)
    lang = notebook.metadata.get("papermill", {}).get("parameters", {}).get("lang") or "ko"
    return finish_html(body, answers_mod.texts()["report"]["title"].get(lang))


def kernel_config(sockets: str | Path):
    """The notebook kernel's settings: its channels over local (IPC) sockets in the private directory ``sockets``, not
    TCP on localhost. A TCP kernel prints a four-line "running over TCP without encryption" warning into every
    pipeline's output; IPC is what that warning recommends, and a directory of its own per notebook keeps
    two notebooks run at once (the report in two languages) from choosing the same socket names."""
    from traitlets.config import Config

    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = str(Path(sockets) / "kernel")
    return config


def run_notebook(params_path: str, notebook: str, out_notebook: str, out_html: str, figs: str, data: str = "data",
                 lang: str | None = None) -> None:
    """Execute the analysis notebook with papermill (it writes every figure), then export it to HTML."""
    import papermill

    params = load_params(params_path)
    # every table a figure is drawn from, before papermill starts (else a 100-line traceback from inside a cell)
    sources = sorted({Path(data) / Path(source).relative_to("data") for paths in FIGURES.values() for source in paths})
    missing = [str(path) for path in [Path(notebook), *sources] if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"the report's input(s) {', '.join(missing)} do not exist; make them with "
                                "`snakemake --cores N` (it makes the report's inputs first)")
    for path in sources:
        check_table(path)  # a table that differs from its checksum record stops here, naming it
    parameters = {"params_path": str(Path(params_path).resolve()), "data_dir": str(Path(data).resolve()),
                  "figs_dir": str(Path(figs).resolve()), "lang": lang or params["figures"]["lang"]}
    Path(figs).mkdir(parents=True, exist_ok=True)
    # papermill writes the executed notebook as it goes, for minutes: into a scratch folder of the system's temporary
    # directory, removed when the render ends, so that a render killed even by SIGKILL leaves nothing in reports/ (or
    # in what DVC records of it); the results are then written in a moment each, by recorded_path
    with tempfile.TemporaryDirectory(prefix="blocklab-render-") as scratch, \
            tempfile.TemporaryDirectory(prefix="blocklab-kernel-") as sockets:
        executed = Path(scratch) / Path(out_notebook).name
        papermill.execute_notebook(
            notebook, str(executed), parameters=parameters, kernel_name="python3", cwd=os.getcwd(), progress_bar=False,
            config=kernel_config(sockets),
        )
        body = export_html(executed)
        with recorded_path(out_notebook) as tmp_nb:  # each with its checksum record, which `blocklab verify` checks
            shutil.copyfile(executed, tmp_nb)
        with recorded_path(out_html) as tmp_html:
            tmp_html.write_text(body, encoding="utf-8")


PROJECT = Path(__file__).resolve().parents[3]
RECORDED_OUT = "reports-recorded"  # ignored by git; outside reports/, which the pipeline writes and DVC tracks
PIPELINE_TIMES = "performance/measured/pipeline_times.csv"  # the project's recorded timings of its commands


def recorded_cost(project: Path = PROJECT) -> str:
    """What ``render_recorded`` has cost where it was measured (PIPELINE_TIMES, rows ``blocklab report recorded``):
    the range of the recorded wall times, with their machines and loads; said before it starts."""
    import pandas as pd

    path = Path(project) / PIPELINE_TIMES
    rows = pd.read_csv(path, keep_default_na=False) if path.is_file() else pd.DataFrame(columns=["what"])
    rows = rows[rows["what"] == "blocklab report recorded"]
    if rows.empty:
        return "not measured yet"

    def said(seconds: float) -> str:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if minutes else f"{rest} s"

    walls = rows["wall_s"].astype(float)
    where = "; ".join(f"{said(float(r.wall_s))} on {r.n_cores} {r.cores} cores ({r.machine}, {r.load}, {r.date})"
                      for r in rows.itertuples(index=False))
    return f"{said(walls.min())} to {said(walls.max())} measured: {where}" if len(rows) > 1 else f"measured: {where}"


# The studies whose figures their own rules draw (the notebook shows them, ``Report.figure(draw=False)``)
STUDIES_DRAWN_APART = ("sensitivity", "dynamics")


def draw_study_figures(params: dict, data: Path, figs: Path, lang: str) -> tuple[list[str], dict[str, list[str]]]:
    """What the studies' figure rules would draw in the pipeline, drawn here from the tables under ``data`` (each study
    in the report by its ``in_report``; its functions, ``studies.<study>.figures.save_figures``): every figure whose
    tables ``data`` holds. Returns (the figures drawn, {a figure not drawn: the tables it lacks})."""
    import importlib

    drawn, lacking = [], {}
    for study in STUDIES_DRAWN_APART:
        if not params.get(study, {}).get("in_report"):
            continue
        plan = importlib.import_module(f"blocklab.studies.{study}.plan")
        names = []
        for name, tables in plan.FIGURES.items():
            absent = [t for t in tables if not (Path(data) / Path(t).relative_to("data")).exists()]
            if absent:
                lacking[name] = absent
            else:
                names.append(name)
        importlib.import_module(f"blocklab.studies.{study}.figures").save_figures(params, data, figs, lang, names=names)
        drawn += names
    return drawn, lacking


def recorded_tables(params: dict, project: Path, into: Path) -> Path:
    """The gallery's tables copied into ``into``, with the sensitivity study's per-step losses, which the gallery does
    not record (8 MB), aggregated from the study's recorded runs (``sensitivity.from_snapshots``, in git) by its own
    aggregate, as the pipeline's rule does (its summary and claim x setting from the same call equal the gallery's
    byte for byte: tests/test_english.py)."""
    import shutil

    from ..io import write_table
    from ..records import GALLERY
    from ..studies.sensitivity.aggregate import aggregate
    from ..studies.sensitivity.plan import TABLES

    data = Path(into)
    shutil.copytree(Path(project) / GALLERY, data, dirs_exist_ok=True)
    losses = data / Path(TABLES["losses"]).relative_to("data")
    if params.get("sensitivity", {}).get("in_report") and not losses.exists():
        write_table(aggregate(params, project)["losses"].round({"loss": 6}), losses)
    return data


def render_recorded(lang: str = "en", out: str | Path = RECORDED_OUT, project: Path = PROJECT) -> Path:
    """The analysis notebook run on the recorded full default run's tables (records/gallery, in git: a fresh clone has
    them) in ``lang``: the report and every figure into ``out/lang``, with no training and no pipeline; says its cost
    before it starts and where the report is when it ends."""
    from ..records import GALLERY

    folder = Path(out) / lang
    print(f"blocklab report recorded: the full default run's report and figures, drawn from its recorded tables "
          f"({GALLERY}/, no training) in {'English' if lang == 'en' else 'Korean'}, into {folder}/: "
          f"{recorded_cost(project)}", file=sys.stderr, flush=True)
    from contextlib import chdir

    folder = folder.resolve()
    with chdir(project):  # the recorded params name their snapshots relative to the project (records/...)
        import tempfile

        from ..params_file import load_params

        params = load_params(f"{GALLERY}/params.yaml")
        with tempfile.TemporaryDirectory() as tmp:
            _, lacking = draw_study_figures(params, recorded_tables(params, project, Path(tmp) / "data"),
                                            folder / "figs", lang)
        for name, tables in lacking.items():
            print(f"blocklab report recorded: figure {name} is not drawn: its table {', '.join(tables)} is not among the "
                  f"recorded tables ({GALLERY}/)", file=sys.stderr, flush=True)
        run_notebook(f"{GALLERY}/params.yaml", "notebooks/analysis.ipynb", str(folder / "analysis.ipynb"),
                     str(folder / "analysis.html"), str(folder / "figs"), GALLERY, lang)
    print(f"report:  {folder / 'analysis.html'}\nfigures: {folder / 'figs'}/")
    return folder / "analysis.html"


def register(subparsers) -> None:
    p = subparsers.add_parser("notebook", help="run the analysis notebook (papermill): every figure into figs/, plus HTML")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--notebook", default="notebooks/analysis.ipynb")
    p.add_argument("--out-notebook", default="reports/analysis.ipynb")
    p.add_argument("--out-html", default="reports/analysis.html")
    p.add_argument("--figs", default="figs")
    p.add_argument("--data", default="data")
    p.add_argument("--lang", choices=["ko", "en"], default=None, help="figure language (default: params figures.lang)")
    p.set_defaults(func=lambda a: run_notebook(a.params, a.notebook, a.out_notebook, a.out_html, a.figs, a.data, a.lang))

    p = subparsers.add_parser("recorded", help="the recorded full default run's report and figures, rendered here in "
                              "a minute or two from records/gallery (no training): English by default")
    p.add_argument("--lang", choices=["ko", "en"], default="en", help="the language (default: en)")
    p.add_argument("--out", default=RECORDED_OUT, help=f"the folder: OUT/LANG/analysis.html and OUT/LANG/figs/ "
                   f"(default: {RECORDED_OUT})")
    p.set_defaults(func=lambda a: render_recorded(a.lang, a.out) and None)

    p = subparsers.add_parser("figure", help="redraw one figure from cached data, without the notebook")
    p.add_argument("name", choices=sorted(FIGURES))
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--data", default="data")
    p.add_argument("--figs", default="figs")
    p.add_argument("--lang", choices=["ko", "en"], default=None)
    p.set_defaults(func=lambda a: print(save_figure(a.name, load_params(a.params), a.data, a.figs, a.lang)))
