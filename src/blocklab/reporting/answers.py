"""Answers to every problem part (document 000) and exercise (document 004), computed from the pipeline's data.

Each answer function reads the tables through ``claims.Data`` and returns the values that fill its text template in
``answers.yaml`` (one file for Korean and English). The verdict beside each answer is that of the claims table's rows
(``data/claims/claims.csv``, the one place claims are judged); the two parts that have no claim row (problem 9 (c),
problem 10 (b)) are judged here, by the rule given in their function.
"""
from __future__ import annotations

import copy
import functools
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ..model_config import NORM_POSITION_SPECS, norm_rank
from ..run_settings import CopyModel, CopyTask, Sweep
from ..studies.sensitivity.plan import snapshots
from . import verdicts as verdict_rules
from .claims import NOT_CHECKABLE, NOT_REPRODUCED, REPRODUCED, Data
from .sensitivity import robustness

ORDER = ("p9a", "p9b", "p9c", "p10a", "p10b", "p10c", "p11a", "p11b", "p11c", "e1", "e2", "e3")
SENSITIVITY = {"summary": "sensitivity/summary.csv", "claims_by_setting": "sensitivity/claims_by_setting.csv"}
COMPUTE = {}


def texts() -> dict:
    return copy.deepcopy(_texts())  # a copy each: a caller may change its own; the file is read and parsed once


@functools.lru_cache(maxsize=1)
def _texts() -> dict:
    return yaml.safe_load(resources.files("blocklab.reporting").joinpath("answers.yaml").read_text(encoding="utf-8"))


HANGUL = re.compile("[\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f]")
_REPEATED = re.compile(r"\b([\w'’ -]+?) \(\1\)")  # "per layer (per layer)": a translated original after its English
_KOREAN_ORIGINAL = re.compile(r"\s*\((?=[^()]*[\uac00-\ud7a3])[^()]*\)")  # "(앞·뒤 정규화의 ...)" after its English


def in_english(value):
    """A value from the data or the claims table for an English page: the documents' Korean words that reach it (a
    problem's place, problem 9's subjects, a value as the document writes it) in English (answers.yaml's
    ``english``, the longest first), and a Korean original in parentheses after its English left out. Anything else
    is returned as it is."""
    if not isinstance(value, str) or not HANGUL.search(value):
        return value
    words = _texts()["english"]
    for korean in sorted(words, key=len, reverse=True):
        value = value.replace(korean, words[korean])
    return _KOREAN_ORIGINAL.sub("", _REPEATED.sub(r"\1", value))


def computes(fn):
    COMPUTE[fn.__name__.removeprefix("_")] = fn
    return fn


@dataclass
class Answer:
    key: str
    problem: str
    part: str
    text: str
    document_value: str
    verdict: str
    claim_ids: list = field(default_factory=list)
    claim_verdicts: dict = field(default_factory=dict)

    def markdown(self, lang: str = "ko") -> str:
        t = texts()
        label = lambda k: t["labels"][k][lang]  # noqa: E731
        head = f"**{self.part}** " if self.part else ""
        verdict = t["verdicts"][self.verdict][lang]
        ids = f" ({label('claims')}: {', '.join(self.claim_ids)})" if self.claim_ids else ""
        return (f'<div class="answer" data-answer="{self.key}" data-verdict="{self.verdict}">\n\n'
                f"{head}{self.text}\n\n"
                f"*{label('document')}:* {self.document_value} · *{label('verdict')}:* "
                f'<span class="verdict" data-verdict="{self.verdict}">{verdict}</span>{ids}\n\n</div>')


def combine(verdicts) -> str:
    """One verdict for several claims, by the rule for a claim's parts (``verdicts.combine``): checkable ones decide;
    all reproduced -> reproduced; none reproduced and some not -> not reproduced; inconclusive with the rest reproduced
    -> inconclusive; any other mix -> partly."""
    return verdict_rules.combine(verdicts)


# ---- number formatting: the same for both languages ------------------------------------------------------------------


def num(value, digits: int = 3) -> str:
    """Fixed decimals for ordinary sizes, 3 significant digits (no exponent below 1e-4) for small ones."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    value = float(value)
    if value != 0 and abs(value) < 10 ** -digits * 10:
        return f"{value:.3g}" if abs(value) >= 1e-4 else f"{value:.2e}"
    return f"{value:.{digits}f}"


def vector(values, digits: int = 3) -> str:
    return ", ".join(num(0.0 if abs(v) < 0.5 * 10 ** -digits else v, digits) for v in values)


def integer(value) -> str:
    return f"{int(value):,}"


def joined(items, lang: str) -> str:
    return ("; " if lang == "en" else ", ").join(items)


# ---- document 000: problem 9 -----------------------------------------------------------------------------------------


def _scores(data: Data):
    scores = data.table("problem9/scores.csv")
    students = list(dict.fromkeys(scores["student"]))
    return scores, students


@computes
def _p9a(data: Data, t: dict, lang: str) -> dict:
    scores, students = _scores(data)
    items = []
    for student in students:
        rows = scores[scores["student"] == student]
        items.append(t["item"][lang].format(student=student, mean=num(rows["student_mean"].iloc[0], 1),
                                            std=num(rows["student_std"].iloc[0]), z=vector(rows["per_student"])))
    return {"subjects": "·".join(dict.fromkeys(scores["subject"])), "items": joined(items, lang)}


@computes
def _p9b(data: Data, t: dict, lang: str) -> dict:
    scores, _ = _scores(data)
    pair = scores[scores["in_pair"].astype(bool)]
    students = list(dict.fromkeys(pair["student"]))
    items = [t["item"][lang].format(student=s, z=vector(pair[pair["student"] == s]["per_subject_pair"]))
             for s in students]
    return {"pair": ", ".join(students), "items": joined(items, lang)}


@computes
def _p9c(data: Data, t: dict, lang: str) -> dict:
    """Verdict: the document's reading holds when the pair's per-student rows are equal (to 1e-9) although their means
    differ, and the third student's row differs from the first's by more than 0.1."""
    scores, students = _scores(data)
    pair = list(dict.fromkeys(scores[scores["in_pair"].astype(bool)]["student"]))
    a, b = pair
    c = next((s for s in students if s not in pair), None)
    z = {s: scores[scores["student"] == s]["per_student"].to_numpy() for s in students}
    mean = {s: scores[scores["student"] == s]["student_mean"].iloc[0] for s in students}
    std = {s: scores[scores["student"] == s]["student_std"].iloc[0] for s in students}
    ab_diff = float(np.abs(z[a] - z[b]).max())
    shape_diff = float(np.abs(z[c] - z[a]).max()) if c else float("nan")
    ok = ab_diff < 1e-9 and abs(mean[a] - mean[b]) > 0 and (c is None or shape_diff > 0.1)
    values = {"a": a, "b": b, "c": c or "—", "ab_diff": num(ab_diff), "gap": num(abs(mean[a] - mean[b]), 1),
              "mean_a": num(mean[a], 1), "mean_b": num(mean[b], 1), "std_a": num(std[a]), "std_b": num(std[b]),
              "shape_diff": num(shape_diff)}
    return values, REPRODUCED if ok else NOT_REPRODUCED


# ---- document 000: problem 10 ----------------------------------------------------------------------------------------


@computes
def _p10a(data: Data, t: dict, lang: str) -> dict:
    table = data.table("residual_sim/table.csv")
    curve = data.table("residual_sim/curve.csv")
    sim = data.params["residual_sim"]
    items = [t["item"][lang].format(blocks=int(r.blocks), length=num(r.mean_length), sqrt=num(r.sqrt_L_plus_1))
             for r in table.itertuples()]
    sq_off = float((curve["mean_sq_length"] / (curve["blocks"] + 1) - 1).abs().max())
    return {"dim": sim["dim"], "trials": integer(sim["trials"]), "items": joined(items, lang), "sq_off": f"{sq_off:.1%}"}


@computes
def _p10b(data: Data, t: dict, lang: str) -> dict:
    """Verdict: the measured |Δ|/|h| at the deepest reported block within 10% of 1/√L (the document: 1/6 at 36)."""
    curve = data.table("residual_sim/curve.csv").set_index("blocks")
    last_block = int(max(data.params["residual_sim"]["report_blocks"]))
    first, last = curve.loc[1, "rel_change"], curve.loc[last_block, "rel_change"]
    inv = 1 / math.sqrt(last_block)
    values = {"first": num(first), "last": num(last), "last_block": last_block, "inv": num(inv),
              "turn_first": num(curve.loc[1, "turn_deg"], 1), "turn_last": num(curve.loc[last_block, "turn_deg"], 1)}
    return values, REPRODUCED if abs(last / inv - 1) < 0.1 and last < first else NOT_REPRODUCED


@computes
def _p10c(data: Data, t: dict, lang: str) -> dict:
    lm = data.table("probe/lm.csv")
    items = []
    for (model, prompt), g in lm.groupby(["model", "prompt"], sort=False):
        g = g.set_index("layer").sort_index()
        last_layer = int(g.index.max())
        mid_layer = int(g.index[len(g) // 2])
        growth = g.loc[last_layer, "token_norm_p50"] / g.loc[1, "token_norm_p50"]
        items.append(t["item"][lang].format(
            model=model, prompt=prompt, first=num(g.loc[1, "norm_of_mean"], 1), mid_layer=mid_layer,
            mid=num(g.loc[mid_layer, "norm_of_mean"], 1), last_layer=last_layer, last=num(g.loc[last_layer, "norm_of_mean"], 1),
            growth=num(growth, 1), random=num(math.sqrt((last_layer + 1) / 2), 1)))
    copy = ""
    if data.exists("probe/copy.csv"):
        c = data.table("probe/copy.csv")
        last = c[c["layer"] == c["layer"].max()]
        by = last.groupby(["state", "norm"])["mean_token_norm"].mean()
        pick = lambda state: ", ".join(f"{norm_label(n, lang)} {num(v, 1)}" for n, v in by.loc[state].items())  # noqa: E731
        if {"init", "trained"} <= set(by.index.get_level_values(0)):
            copy = t["copy"][lang].format(layers=int(c["layer"].max()), init=pick("init"), trained=pick("trained"))
    qwen = "" if lm["model"].str.contains("qwen", case=False).any() else t["qwen_missing"][lang]
    return {"items": joined(items, lang), "copy": copy, "qwen": qwen}


# ---- document 000: problem 11 ----------------------------------------------------------------------------------------


def norm_label(norm: str, lang: str) -> str:
    """A norm position's name in ``lang``, from its declaration (model_config.NORM_POSITION_SPECS), so that every position
    ``sweep.norms`` may list is named in the report; a value that is no position (a table's "none") as it is."""
    return NORM_POSITION_SPECS[norm].label(lang) if norm in NORM_POSITION_SPECS else str(norm)


def by_norm(frame: pd.DataFrame, *then: str) -> pd.DataFrame:
    """``frame`` with its norm positions in the declared order (model_config.NORM_POSITION_SPECS, as the figures draw
    them; not alphabetically), then by the columns ``then``."""
    ranked = frame.assign(_norm_rank=frame["norm"].map(norm_rank))
    return ranked.sort_values(["_norm_rank", *then], kind="stable").drop(columns="_norm_rank")


def other_norms(frame: pd.DataFrame, lang: str, compared=("post", "pre")) -> list[str]:
    """The labels of the norm positions in ``frame`` besides the ones a sentence compares, in the declared order."""
    return [norm_label(n, lang) for n in dict.fromkeys(by_norm(frame)["norm"]) if n not in compared]


def _case(lang: str, norm: str, warmup: int) -> str:
    labels = texts()["labels"]
    when = labels["no_warmup"][lang] if warmup == 0 else labels["warmup"][lang].format(steps=warmup)
    return f"{norm_label(norm, lang)} · {when}"


def _outcomes(runs: pd.DataFrame, lang: str) -> str:
    labels = texts()["labels"]
    counts = by_norm(runs, "warmup").groupby(["norm", "warmup"], sort=False)["outcome"].agg(list)
    parts = []
    for (norm, warmup), outcomes in counts.items():
        tally = pd.Series(outcomes).value_counts()
        parts.append(f"{_case(lang, norm, warmup)} " + "/".join(
            f"{labels['outcome'].get(o, {lang: o})[lang]} {n}" for o, n in tally.items()))
    return "; ".join(parts)


def first_below(curve: pd.DataFrame, threshold: float) -> float:
    """The first step at which the loss is below ``threshold`` (NaN: never)."""
    below = curve.loc[curve["loss"] < threshold, "step"]
    return float(below.iloc[0]) if len(below) else float("nan")


@computes
def _p11a(data: Data, t: dict, lang: str) -> dict:
    summary = data.table("sweep/summary.csv")
    losses = data.table("sweep/losses.csv")
    vocab = CopyTask.from_params(data.params).vocab_size
    chance = math.log(vocab)
    runs = summary[(summary["norm"] == "post") & (summary["warmup"] == 0)].sort_values("seed")
    labels = texts()["labels"]
    stuck = 0
    for run in runs["run"]:
        curve = losses[losses["run"] == run]["loss"]
        stuck += bool((curve.iloc[len(curve) // 10:] > 0.9 * chance).all())
    finals = ", ".join(labels["seed_item"][lang].format(seed=r.seed, value=num(r.final_loss, 4)) for r in runs.itertuples())
    return {"steps": integer(Sweep.from_params(data.params).steps), "finals": finals, "vocab": vocab, "chance": num(chance),
            "stuck": len(runs), "stuck_count": stuck, "outcomes": _outcomes(runs, lang)}


@computes
def _p11b(data: Data, t: dict, lang: str) -> dict:
    summary = data.table("sweep/summary.csv")
    losses = data.table("sweep/losses.csv")
    vocab = CopyTask.from_params(data.params).vocab_size
    threshold = 0.1 * math.log(vocab)  # sweep.classify's "learned" line
    labels = texts()["labels"]
    items, at = [], []
    doc_steps = [s for s in (100, 200, 300) if s <= losses["step"].max()]
    for (norm, warmup), runs in by_norm(summary, "warmup").groupby(["norm", "warmup"], sort=False):
        runs = runs.sort_values("seed")
        steps = [first_below(losses[losses["run"] == r.run], threshold) for r in runs.itertuples()]
        firsts = [labels["seed_item"][lang].format(seed=seed, value=labels["never"][lang] if math.isnan(step) else integer(step))
                  for seed, step in zip(runs["seed"], steps)]
        text = labels["all_never"][lang] if all(math.isnan(s) for s in steps) else ", ".join(firsts)
        items.append(t["item"][lang].format(case=_case(lang, norm, warmup), steps=text))
        if (norm, warmup) in {("post", max(Sweep.from_params(data.params).warmups)), ("pre", 0)}:
            for step in doc_steps:
                row = losses[(losses["norm"] == norm) & (losses["warmup"] == warmup) & (losses["step"] == step)]
                at.append(t["step_item"][lang].format(case=_case(lang, norm, warmup), step=step,
                                                      losses=vector(row.sort_values("seed")["loss"], 4)))
    at_steps = (t["at_steps"][lang].format(items="; ".join(at)) if at
                else t["no_steps"][lang].format(steps=integer(losses["step"].max())))
    return {"threshold": num(threshold), "vocab": vocab, "items": "; ".join(items), "at_steps": at_steps,
            "outcomes": _outcomes(summary, lang), "collapse": _collapse_text(data, t, lang)}


DYNAMICS = {"summary": "dynamics/summary.csv", "rates": "dynamics/rates.csv", "diagnostics": "dynamics/diagnostics.parquet"}


def dynamics_present(data: Data) -> bool:
    """The dynamics family is in the report when params say so and its tables exist."""
    return bool(data.params.get("dynamics", {}).get("in_report")) and all(data.exists(p) for p in DYNAMICS.values())


def dynamics_diagnostics(data: Data) -> pd.DataFrame:
    if DYNAMICS["diagnostics"] not in data.tables:
        data.tables[DYNAMICS["diagnostics"]] = pd.read_parquet(data.root / DYNAMICS["diagnostics"])
    return data.tables[DYNAMICS["diagnostics"]]


def pct(value) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0%}"


def _collapse_text(data: Data, t: dict, lang: str) -> str:
    """Problem 11 (b)'s collapse, as a rate over seeds at each collapse setting (the default first), with its Wilson
    interval."""
    if not dynamics_present(data):
        return t["collapse_absent"][lang]
    rates = data.table(DYNAMICS["rates"])
    summary = data.table(DYNAMICS["summary"])
    texts = [_collapse_at(rates, summary, setting, data, t, lang) for setting in data.params["dynamics"]["collapse"]["settings"]]
    texts = [x for x in texts if x]
    return "".join(texts) + t["collapse_note"][lang] if texts else t["collapse_absent"][lang]


def _collapse_at(rates: pd.DataFrame, summary: pd.DataFrame, setting: str, data: Data, t: dict, lang: str) -> str:
    row = rates[rates["setting"] == setting]
    if row.empty:
        return ""
    r = row.iloc[0]
    hits = summary[summary["collapse"].astype(bool) & (summary["setting"] == setting)
                   & summary["outcome"].isin(["spiked", "collapsed"])].sort_values("seed")
    items = ", ".join(t["collapse_item"][lang].format(seed=h.seed, step=integer(h.spike_step), loss=num(h.spike_loss))
                      for h in hits.itertuples())
    where = t["collapse_where"][lang].format(items=items) if items else ""
    return t["collapse"][lang].format(
        n=int(r["runs"]), setting=setting, learned=int(r["learned"]), k=int(r["collapsed"]), rate=pct(r["collapsed_rate"]),
        low=pct(r["collapsed_low"]), high=pct(r["collapsed_high"]), spikes=int(r["spiked"]),
        spike_rate=pct(r["spiked_rate"]), spike_low=pct(r["spiked_low"]), spike_high=pct(r["spiked_high"]), where=where,
        chance=int(r["to_chance"]), chance_rate=pct(r["to_chance_rate"]), chance_low=pct(r["to_chance_low"]),
        chance_high=pct(r["to_chance_high"]), at=f'{data.params["dynamics"]["events"]["collapse_at"]:g}',
        vocab=CopyTask.from_params(data.params).vocab_size)


DETECTORS = "dynamics/detectors.csv"


def detector_table(data: Data) -> pd.DataFrame:
    """data/dynamics/detectors.csv (the pipeline's dynamics_detectors rule), or, for a data directory made before it
    existed, the same table computed from the aggregated summary, losses and diagnostics."""
    from ..studies.dynamics.detectors import from_frames

    if data.exists(DETECTORS):
        return data.table(DETECTORS)
    if not data.exists("dynamics/losses.csv"):
        return pd.DataFrame()
    return from_frames(data.table(DYNAMICS["summary"]), data.table("dynamics/losses.csv"), dynamics_diagnostics(data),
                       data.params["dynamics"]["events"], CopyTask.from_params(data.params).vocab_size)["detectors"]


def _rate(k, n, low, high) -> str:
    return f"{int(k)}/{int(n)} ({pct(low)}–{pct(high)})"


def _detector_text(data: Data, t: dict, lang: str) -> str:
    """Each precursor as a detector (studies.dynamics.detectors; the procedure fixed in docs/dynamics.md): hit and
    false-alarm rates with their intervals at each resolution where they could be judged, which precursors tell an
    event from a quiet stretch (the hit interval above the false-alarm interval), and what the sparse ones cannot say."""
    table = detector_table(data)
    if table.empty:
        return t["why_nodet"][lang]
    n_events = int(table["events"].max())
    if n_events == 0:
        return t["why_none"][lang]
    names, res = t["detector_names"], t["resolutions"]
    items, apart, not_apart, sparse, zero = [], {}, {}, [], []
    for name, rows in table.groupby("detector", sort=False):
        label = names.get(name, {lang: name})[lang]
        judged = rows[rows["events_evaluable"] > 0]
        if judged.empty:
            continue
        parts = [t["detector_item"][lang].format(resolution=res[r.resolution][lang],
                                                 hits=_rate(r.hits, r.events_evaluable, r.hit_low, r.hit_high),
                                                 fa=_rate(r.false_alarms, r.windows, r.fa_low, r.fa_high))
                 for r in judged.itertuples() if r.windows > 0]
        items.append(f"{label}: " + "; ".join(parts))
        for r in judged.itertuples():
            side = apart if r.windows > 0 and r.hit_low > r.fa_high else not_apart
            side.setdefault(label, []).append(res[r.resolution][lang])
        if (rows.loc[rows["resolution"] == "every step", "events_evaluable"] == 0).all():
            sparse.append(label)
            if (judged["hits"] == 0).all():
                zero.append((label, judged["hit_high"].max(), int(judged["events_evaluable"].max())))
    none = t["none"][lang]
    listed = lambda side: ", ".join(f"{k} ({', '.join(v)})" for k, v in side.items()) or none  # noqa: E731
    out = t["why_detectors"][lang].format(n_events=n_events, runs=int(table["runs"].max()), items="; ".join(items),
                                          apart=listed(apart), not_apart=listed(not_apart))
    if sparse:
        zeros = "".join(t["why_zero"][lang].format(name=n, n=k, upper=pct(u)) for n, u, k in zero)
        out += t["why_sparse"][lang].format(names=", ".join(sparse), zero=zeros)
    return out + t["why_cause"][lang].format(n_events=n_events)


def _why_text(data: Data, t: dict, lang: str) -> str:
    """Problem 11 (c)'s "why", from the diagnostics: how hard the first steps push per case, where the gradient goes at
    step 1, after the first full-rate steps and at step 50, where attention ends (one run a case: measured, judged by
    no claim, and so read as nothing more than these numbers), and each precursor as a detector (hit and false-alarm
    rates with intervals)."""
    from ..studies.dynamics.aggregate import early_updates, uniform_entropy

    if not dynamics_present(data):
        return ""
    summary, diagnostics = data.table(DYNAMICS["summary"]), dynamics_diagnostics(data)
    early = by_norm(early_updates(summary, diagnostics), "warmup")
    if early.empty:
        return ""
    case = lambda r: _case(lang, r.norm, int(r.warmup))  # noqa: E731
    uniform = uniform_entropy(2 * CopyTask.from_params(data.params).seq_len - 1)
    by_case = {(r.norm, int(r.warmup)): r for r in early.itertuples()}
    ratios = "; ".join(f"{case(r)} {r.init_grad_out_over_in:.3g} / {r.grad_out_over_in_step2:.3g} / "
                       f"{r.grad_out_over_in_step5:.3g} / {r.grad_out_over_in_later:.3g}" for r in early.itertuples())
    return t["why"][lang].format(
        early="; ".join(f"{case(r)} {r.early_update:.2g}" for r in early.itertuples()), ratio=ratios,
        entropy="; ".join(f"{case(r)} {r.final_entropy_max:.3f}" for r in early.itertuples()), uniform=f"{uniform:.3f}",
        logits="; ".join(f"{case(r)} {r.final_logit_max:.3g}" for r in early.itertuples()),
        seeds=", ".join(str(int(x)) for x in sorted(early["seed"].unique())) if "seed" in early else "0",
        reading=_detector_text(data, t, lang)) + _not_covered(early, "dynamics", data, t, lang)


def sensitivity_present(data: Data) -> bool:
    """The sensitivity study is in the report when params say so and its tables exist."""
    section = data.params.get("sensitivity", {})
    return bool(section.get("in_report")) and all(data.exists(p) for p in SENSITIVITY.values())


@computes
def _p11c(data: Data, t: dict, lang: str) -> dict:
    summary = data.table("sweep/summary.csv")
    model, sweep = CopyModel.from_params(data.params), Sweep.from_params(data.params)
    post = summary[summary["norm"] == "post"]
    pre = summary[(summary["norm"] == "pre") & (summary["warmup"] == 0)]
    scope = t["scope"][lang].format(
        layers=model.n_layers, width=model.d_model, lr=f"{sweep.lr:g}", steps=integer(sweep.steps), seeds=summary["seed"].nunique(), post_runs=len(post),
        post_failed=int((post["outcome"] != "learned").sum()), pre_runs=len(pre),
        pre_learned=int((pre["outcome"] == "learned").sum()))
    others = summary[~summary["norm"].isin(["post", "pre"])]
    if len(others):  # every other position the sweep trained: named with its outcomes, which the document compares not
        scope += t["scope_others"][lang].format(outcomes=_outcomes(others, lang))
    why = _why_text(data, t, lang) + _instead_text(data, t, lang)
    if not sensitivity_present(data):
        return {"scope": scope, "sensitivity": t["sens_absent"][lang], "why": why}
    return {"scope": scope, "sensitivity": _sensitivity_text(data, t, lang), "why": why}


def _instead_text(data: Data, t: dict, lang: str) -> str:
    """Problem 11 (c)'s "what to do instead": each literature fix's claim (source literature, judged from the stability
    lab's recorded runs at this run's setup) with its recorded runs without warm-up, and the fixes it decides; "" for a
    claims table without those rows."""
    if not data.exists("claims/claims.csv"):
        return ""
    claims = data.table("claims/claims.csv")
    rows = claims[claims["source"] == "literature"] if "source" in claims else claims.iloc[0:0]
    if rows.empty:
        return ""
    judged = rows[rows["verdict"] != NOT_CHECKABLE]
    if judged.empty:
        return t["instead_none"][lang]
    from ..lab import records

    verdict_words = texts()["verdicts"]
    items = []
    for r in judged.itertuples():
        fix = r.id.removeprefix("lit-").removesuffix("-nowarm")
        runs = records.recorded(norm=fix, warmup=0)
        items.append(t["instead_item"][lang].format(fix=fix, k=int((runs["outcome"] == "learned").sum()), n=len(runs),
                                                     verdict=verdict_words[r.verdict][lang]))
    decided = [r.id.removeprefix("lit-").removesuffix("-nowarm") for r in judged.itertuples() if r.verdict == REPRODUCED]
    failed = [r.id.removeprefix("lit-").removesuffix("-nowarm") for r in judged.itertuples()
              if r.verdict in (NOT_REPRODUCED, "partly")]
    conclusion = (t["instead_yes"][lang].format(names=", ".join(decided)) if decided else t["instead_open"][lang])
    if failed:  # with the runs of each one's warm-up arm, measured and judged by no claim (too few seeds)
        warm = records.recorded()
        warm = warm[warm["warmup"] > 0]
        names = [fix + "".join(t["instead_warm"][lang].format(w=int(w), k=int((g["outcome"] == "learned").sum()),
                                                               n=len(g))
                               for w, g in warm[warm["block"] == fix].groupby("warmup")) for fix in failed]
        conclusion += t["instead_no"][lang].format(names=", ".join(names))
    return t["instead"][lang].format(items="; ".join(items), conclusion=conclusion)


def _sensitivity_text(data: Data, t: dict, lang: str) -> str:
    by_setting = data.table(SENSITIVITY["claims_by_setting"])
    summary = data.table(SENSITIVITY["summary"])
    robust = robustness(by_setting)
    settings = list(dict.fromkeys(by_setting["setting"]))
    changed = ", ".join(robust.loc[robust["checkable"] & ~robust["robust"], "id"]) or t["none"][lang]
    choices = summary[summary["family"] == "choices"] if "family" in summary else summary
    post0 = choices[(choices["norm"] == "post") & (choices["warmup"] == 0)]
    labels = texts()["labels"]
    post_by_setting = "; ".join(
        f"{setting} " + "/".join(f"{labels['outcome'].get(o, {lang: o})[lang]} {n}" for o, n in g["outcome"].value_counts().items())
        for setting, g in post0.groupby("setting", sort=False)) or t["none"][lang]
    depth = ""
    grid = summary[summary["family"] == "depth_lr"] if "family" in summary else summary.iloc[0:0]
    if len(grid) and {"post", "pre"} <= set(grid["norm"]):
        learned = grid.assign(ok=grid["outcome"] == "learned").groupby(["depth", "norm"])["ok"].mean().unstack("norm")
        post0 = grid[(grid["norm"] == "post") & (grid["warmup"] == 0)]
        cells = post0.assign(ok=post0["outcome"] == "learned").groupby(["depth", "lr"])["ok"].all()
        named = lambda keep: "; ".join(t["cell_item"][lang].format(depth=int(d), lr=f"{lr:g}")  # noqa: E731
                                       for (d, lr), ok in cells.items() if ok == keep) or t["none"][lang]
        depth = t["depth"][lang].format(items=", ".join(
            t["depth_item"][lang].format(depth=int(d), pre=f"{r['pre']:.0%}", post=f"{r['post']:.0%}")
            for d, r in learned.sort_index().iterrows()), post_learned=named(True), post_failed=named(False))
    return t["sens_present"][lang].format(n_settings=len(settings), settings=", ".join(settings), n_claims=len(robust),
                                          robust=int(robust["robust"].sum()), changed=changed,
                                          uncheckable=int((~robust["checkable"]).sum()),
                                          post_by_setting=post_by_setting, depth=depth,
                                          relapse=_relapse_text(summary, data.params, t, lang)
                                          + _not_covered(summary, "sensitivity", data, t, lang)) + _source_text(summary, data.params, t, lang)


def _source_text(summary: pd.DataFrame, params: dict, t: dict, lang: str) -> str:
    """Where the study's runs come from when it was made from snapshots (sensitivity.from_snapshots): which directories,
    and on which processors they were trained (the summary's ``machine`` column, one count per run). Empty otherwise."""
    dirs = snapshots(params)
    if not dirs:
        return ""
    runs = summary.drop_duplicates("run_dir") if "run_dir" in summary else summary
    machines = runs["machine"].fillna("?") if "machine" in runs else pd.Series(["?"] * len(runs))
    items = "; ".join(t["machine_item"][lang].format(machine=m, n=n) for m, n in machines.value_counts().items())
    return t["source"][lang].format(n=len(runs), dirs=", ".join(dirs), machines=items)


def _relapse_text(summary: pd.DataFrame, params: dict, t: dict, lang: str) -> str:
    """How many of the study's runs that had learned jumped back above the sweep's "learned" line (10% of ln V, as
    sweep.classify) afterwards: the document's "post-norm may wobble even with warm-up". Empty for tables without the
    relapse columns (made before they existed)."""
    if "relapse_loss" not in summary:
        return ""
    vocab = CopyTask.from_params(params).vocab_size
    line = 0.1 * math.log(vocab)
    runs_once = summary.drop_duplicates("run_dir") if "run_dir" in summary else summary  # a run counts once
    learned = runs_once[runs_once["relapse_loss"].notna()]
    counts = {}
    for norm in ("post", "pre"):
        runs = learned[learned["norm"] == norm]
        jumped = runs[runs["relapse_loss"] > line]
        where = [t["relapse_item"][lang].format(setting=r.setting, run=r.run, step=integer(r.relapse_step),
                                                loss=num(r.relapse_loss)) for r in jumped.itertuples()]
        counts[norm] = {"n": len(runs), "k": len(jumped), "where": f" ({'; '.join(where)})" if where else ""}
    others = [t["relapse_other"][lang].format(norm=norm_label(n, lang), n=len(g), k=int((g["relapse_loss"] > line).sum()))
              for n, g in by_norm(learned).groupby("norm", sort=False) if n not in ("post", "pre")]
    return t["relapse"][lang].format(vocab=vocab, line=num(line), post_n=counts["post"]["n"], post_k=counts["post"]["k"],
                                     post_where=counts["post"]["where"], pre_n=counts["pre"]["n"],
                                     pre_k=counts["pre"]["k"], pre_where=counts["pre"]["where"],
                                     others="".join(", " + o for o in others))


def _not_covered(study: pd.DataFrame, name: str, data: Data, t: dict, lang: str) -> str:
    """The norm positions the main sweep trained that sentences comparing post- and pre-norm over ``study`` (the runs
    of the study ``name``: sensitivity, dynamics) leave out: named as not covered, so that no trained position goes
    unsaid; "" when the study has every position the sweep trained."""
    if not data.exists("sweep/summary.csv"):
        return ""
    trained = set(data.table("sweep/summary.csv")["norm"]) - {"post", "pre"}
    missing = [n for n in NORM_POSITION_SPECS if n in trained and n not in set(study["norm"])]
    missing += sorted(trained - set(NORM_POSITION_SPECS) - set(study["norm"]))
    return (t["not_covered"][lang].format(norms=", ".join(norm_label(n, lang) for n in missing),
                                          study=t["studies"][name][lang]) if missing else "")


# ---- document 004 ----------------------------------------------------------------------------------------------------


@computes
def _e1(data: Data, t: dict, lang: str) -> dict:
    blocks = data.table("param_counts/blocks.csv")
    rows = blocks[blocks["case"] == "exercise1"].drop_duplicates("variant")
    labels = t["variants"]
    items = [t["item"][lang].format(
        variant=labels.get(r.variant, {lang: r.variant})[lang], closed=integer(r.closed_form_total), numel=integer(r.built_numel),
        equal=t["equal" if r.closed_form_total == r.built_numel else "differ"][lang], approx=integer(r.document_approx),
        rel=f"{r.document_approx_rel_error:+.2%}") for r in rows.itertuples()]
    first = rows.iloc[0]
    return {"d": int(first["d_model"]), "heads": int(first["n_heads"]), "ratio": f"{first['ffn_ratio']:g}",
            "items": joined(items, lang)}


@computes
def _e2(data: Data, t: dict, lang: str) -> dict:
    from ..experiments.activation_norms import verdict

    norms = data.table("activation_norms/norms.csv")
    judged = verdict(norms)
    depth = 12 if 12 in set(judged["depth"]) else int(judged["depth"].max())
    rows = by_norm(judged[judged["depth"] == depth])
    items = [t["item"][lang].format(norm=norm_label(r.norm, lang), first=num(r.input_norm, 2),
                                    last=num(r.last_norm, 2), growth=num(r.growth, 2),
                                    verdict=t["explodes" if r.explodes else "bounded"][lang]) for r in rows.itertuples()]
    pre = rows[rows["norm"] == "pre"]
    return {"depth": depth, "seeds": norms["seed"].nunique(), "items": joined(items, lang),
            "sqrt_d": num(rows["sqrt_d"].iloc[0], 1), "pre_growth": num(pre["growth"].iloc[0], 2) if len(pre) else "—"}


@computes
def _e3(data: Data, t: dict, lang: str) -> dict:
    from ..experiments.reverse_copy import variant_table

    summary = data.table("reverse_copy/summary.csv")
    table = variant_table(summary[~summary["match_params"].astype(bool)]).set_index("variant")
    labels = texts()["labels"]["variant"]
    items = [t["item"][lang].format(variant=labels.get(v, {lang: v})[lang], loss=num(r.final_loss_mean),
                                    std=num(r.final_loss_std)) for v, r in table.iterrows()]
    rc = data.params["reverse_copy"]
    values = {"layers": rc["n_layers"], "steps": integer(table["steps"].max()), "seeds": int(table["seeds"].max()),
              "items": joined(items, lang), "diff": "—", "ppl_classic": "—", "ppl_modern": "—"}
    if {"classic", "modern"} <= set(table.index):
        classic, modern = table.loc["classic", "final_loss_mean"], table.loc["modern", "final_loss_mean"]
        values.update(diff=f"{modern - classic:+.3f}", ppl_classic=num(math.exp(classic), 2),
                      ppl_modern=num(math.exp(modern), 2))
    return values


# ---- the answers ------------------------------------------------------------------------------------------------------


def answer(key: str, data: Data, claims: pd.DataFrame | None = None, lang: str = "ko") -> Answer:
    """One answer: its text filled from ``data``, the document's value, and the verdict of its claims (``claims``: the
    claims table; rows it lacks count as not checkable)."""
    t = texts()
    spec = t["answers"][key]
    computed = COMPUTE[key](data, spec, lang)
    values, own_verdict = computed if isinstance(computed, tuple) else (computed, None)
    ids = list(spec["claims"])
    table = claims.set_index("id") if claims is not None and len(claims) else pd.DataFrame(columns=["verdict"])
    claim_verdicts = {i: table.loc[i, "verdict"] if i in table.index else NOT_CHECKABLE for i in ids}
    verdict = own_verdict if own_verdict is not None else combine(claim_verdicts.values())
    return Answer(key=key, problem=spec["problem"], part=spec["part"][lang], text=spec["text"][lang].format(**values),
                  document_value=spec["document_value"][lang], verdict=verdict, claim_ids=ids,
                  claim_verdicts=claim_verdicts)


def answers_for(problem: str, data: Data, claims: pd.DataFrame | None = None, lang: str = "ko") -> list[Answer]:
    spec = texts()["answers"]
    return [answer(key, data, claims, lang) for key in ORDER if spec[key]["problem"] == problem]


def problem_title(problem: str, lang: str = "ko") -> str:
    return texts()["problems"][problem]["title"][lang]


def load(data_root: str | Path, params: dict) -> tuple[Data, pd.DataFrame | None]:
    """The data and the claims table of a finished run."""
    data = Data(data_root, params)
    claims = data.table("claims/claims.csv") if data.exists("claims/claims.csv") else None
    return data, claims
