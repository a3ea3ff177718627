"""A norm position declared in-process (the registry monkeypatched, nothing trained) reaches every stage, or the stage
says it is not covered: the model and its count, the figures (problem 11's wiring diagrams and outcome grid, the loss
curves), the report's answers to problem 11 in the declared order, and the pages' literature rows, whose link to a
claim that claims.yaml does not hold yet fails the claim-link check. A position whose forward is an existing one's is
refused with a message naming the existing one and its label. (tests/test_new_norm.py trains a declared position through
the tiny pipeline.)"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from torch import nn

from blocklab import model_config
from blocklab.figures import doc000
from blocklab.model import blocks
from blocklab.model.counting import decoder_lm_params
from blocklab.model.layers import make_norm
from blocklab.model.models import DecoderLM
from blocklab.model_config import NORM_POSITION_SPECS, ConfigError, ModelConfig, NormPosition
from blocklab.records import GALLERY
from blocklab.reporting import answers, claim_links, docs, lab_docs
from blocklab.reporting.claims import Data

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / GALLERY
NEW = NormPosition("outnorm", "h + LN(F(h))", "a position of the test (a norm on the branch's output only)", 1, "",
                   False, True, "#888888", "출력 정규화", "output norm (test)", True)


class OutNormResidual(nn.Module):
    """h + LN(F(h)): the test's position, computed by no declared one."""

    def __init__(self, cfg, sublayer):
        super().__init__()
        self.norm, self.sublayer = make_norm(cfg), sublayer

    def forward(self, h, *args, block_input=None, **kwargs):
        return h + self.norm(self.sublayer(h, *args, **kwargs))


def _declare(monkeypatch, spec: NormPosition, residual) -> None:
    """What a maintainer writes, in-process: its line of NORM_POSITION_SPECS and its residual class; and the copies
    modules take at import (the tuple of names, the figures' colours, the lab pages' fixes)."""
    monkeypatch.setitem(NORM_POSITION_SPECS, spec.name, spec)
    monkeypatch.setattr(model_config, "NORM_POSITIONS", tuple(NORM_POSITION_SPECS))
    monkeypatch.setitem(blocks.RESIDUAL, spec.name, residual)
    monkeypatch.setitem(doc000.NORM_COLORS, spec.name, spec.colour)
    if spec.fixes_post:
        monkeypatch.setattr(lab_docs, "FIXES", (*lab_docs.FIXES, spec.name))


@pytest.fixture
def declared(monkeypatch):
    _declare(monkeypatch, NEW, OutNormResidual)
    return NEW


def _sweep_with(name: str) -> dict:
    """The gallery's sweep (post and pre) and the new position's runs (pre-norm's numbers under its name)."""
    summary = pd.read_csv(DATA / "sweep" / "summary.csv")
    losses = pd.read_csv(DATA / "sweep" / "losses.csv")
    renamed = lambda frame: frame[frame["norm"] == "pre"].assign(  # noqa: E731
        norm=name, run=lambda f: f["run"].str.replace("pre-", f"{name}-", n=1))
    return {"sweep/summary.csv": pd.concat([summary, renamed(summary)], ignore_index=True)  # as training/sweep.py sorts
            .sort_values(["norm", "warmup", "seed"], ignore_index=True),
            "sweep/losses.csv": pd.concat([losses, renamed(losses)], ignore_index=True)}


def test_the_model_builds_and_counts_a_declared_position(declared):
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=3, vocab_size=11, max_len=12, norm_position=declared.name)
    model = DecoderLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == decoder_lm_params(cfg)
    assert torch.isfinite(model(torch.randint(0, 11, (2, 12)))).all()
    blocks.check_distinct_positions()  # a new forward: no error


def test_a_position_whose_forward_is_an_existing_ones_is_refused_naming_it(monkeypatch):
    """'peri' declared with sandwich's residual class: the error names sandwich and its label 'sandwich (Peri-LN)'."""
    sandwich = NORM_POSITION_SPECS["sandwich"]
    peri = NormPosition("peri", "h + LN(F(LN(h)))", "Kim et al. 2025 (Peri-LN)", 2, "", False, True, "#999999",
                        "페리 정규화", "Peri-LN", True)
    _declare(monkeypatch, peri, blocks.RESIDUAL["sandwich"])
    assert blocks.duplicate_positions() == [("peri", "sandwich")]
    with pytest.raises(ConfigError) as refused:
        blocks.check_distinct_positions()
    said = str(refused.value)
    assert "'peri' computes the same block as 'sandwich'" in said and repr(sandwich.label_en) in said, said


def test_the_declared_positions_compute_distinct_blocks():
    blocks.check_distinct_positions()


def test_the_figures_draw_a_declared_position_in_the_declared_order(declared):
    tables = _sweep_with(declared.name)
    fig = doc000.problem11_figure(tables["sweep/summary.csv"], "en")
    diagrams, grid = fig.axes[:-1], fig.axes[-1]
    assert [ax.get_title(loc="left") for ax in diagrams] == ["post-norm", "pre-norm", declared.label_en]
    said = " ".join(t.get_text() for t in diagrams[-1].texts)
    assert "wiring not drawn" in said and declared.formula in said  # no line in doc000.DIAGRAMS: said, not left out
    rows = [t.get_text() for t in grid.texts if t.get_rotation() == 90]
    assert rows == ["post-norm", "pre-norm", declared.label_en]
    curves = doc000.loss_curves_figure(tables["sweep/losses.csv"], "en", vocab_size=64)
    titles = [ax.get_title() for ax in curves.axes]
    assert [t.split(" · ")[0] for t in titles[::len(titles) // 3]] == ["post-norm", "pre-norm", declared.label_en]


def test_every_declared_position_has_its_wiring_diagram():
    assert set(doc000.DIAGRAMS) == set(NORM_POSITION_SPECS)


def test_the_reports_answers_name_a_declared_position_in_the_declared_order(declared):
    params = yaml.safe_load((DATA / "params.yaml").read_text(encoding="utf-8"))
    params["dynamics"]["in_report"] = False  # its diagnostics (a minute to read) are of post and pre alone
    claims = pd.read_csv(DATA / "claims" / "claims.csv")
    tables = _sweep_with(declared.name)
    label = declared.label_en
    b = answers.answer("p11b", Data(DATA, params, dict(tables)), claims, "en").text
    assert b.index("post-norm · no warm-up") < b.index("pre-norm · no warm-up") < b.index(f"{label} · no warm-up"), b
    c = answers.answer("p11c", Data(DATA, params, dict(tables)), claims, "en").text
    assert f"The other norm positions the main sweep trained (the document compares none of them): {label} · " in c, c
    # the sensitivity study (post and pre only) compares the two: its sentences say they do not cover the new one
    study = pd.DataFrame([{"family": "choices", "setting": "s", "norm": n, "warmup": 0, "depth": 24, "outcome": "learned"}
                          for n in ("post", "pre")])
    by_setting = pd.DataFrame([{"id": "c1", "setting": "s", "default": True, "verdict": "reproduced"}])
    tables.update({"sensitivity/summary.csv": study, "sensitivity/claims_by_setting.csv": by_setting})
    params["sensitivity"]["in_report"] = True
    c = answers.answer("p11c", Data(DATA, params, tables), claims, "en").text
    assert (f"The main sweep also trained {label}, which the sensitivity study does not run: this comparison does not "
            "cover it.") in c, c


def test_the_pages_name_a_declared_fix_and_its_missing_claim_fails_the_link_check(declared):
    """The lab's rows of problem 11 (다) list the new fix as not recorded, and link its claim lit-<name>-nowarm, which
    claims.yaml does not hold: the claim-link check names it (a claim must be written for it)."""
    page = "<!-- generated: answer-11c-instead -->\n<!-- /generated -->\n"
    rendered = docs.render(page, DATA, ROOT)
    assert f"`{declared.name}`: no run without warm-up recorded yet" in rendered
    assert claim_links.dangling(rendered) == [f"lit-{declared.name}-nowarm"]


def test_the_reports_sweep_table_lists_norms_in_the_declared_order(declared, tmp_path):
    """The report's table of the sweep (summary.csv is sorted by name: outnorm before post): post, pre, then the new."""
    from blocklab.reporting.report import Report

    report = Report(DATA / "params.yaml", DATA, tmp_path, lang="en")
    report.data.tables.update(_sweep_with(declared.name))
    html = report.table("sweep")
    first = [html.index(f"<td>{label}</td>") for label in ("post-norm", "pre-norm", declared.label_en)]
    assert first == sorted(first), first
