"""An English page holds no Korean except the chapters' quoted titles: the report's text rendered in English from the
recorded full default run (records/gallery, in git), without the pipeline and without drawing its figures."""
from __future__ import annotations

import html
import re
from pathlib import Path

from blocklab.records import GALLERY
from blocklab.reporting import answers
from blocklab.reporting.report import SECTIONS, Report

ROOT = Path(__file__).resolve().parents[1]
# The chapters' titles, which an English page may quote as they are (the README does, with a translation beside).
TITLES = ("트랜스포머 블록: 어텐션과 MLP 를 층 정규화와 잔차로 엮어 쌓는다", "완전한 트랜스포머 — 인코더와 디코더")


def korean_left(text: str) -> list[str]:
    for title in TITLES:
        text = text.replace(title, "")
    return [m.group(0) for m in re.finditer(r".{0,50}" + answers.HANGUL.pattern + r"+.{0,30}", text)]


def english_texts(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "en" and isinstance(value, str):
                yield path, value
            else:
                yield from english_texts(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from english_texts(value, f"{path}[{i}]")


def test_every_english_text_of_answers_yaml_is_english():
    texts = answers.texts()
    found = [(path, text) for path, text in english_texts(texts) if answers.HANGUL.search(text)]
    found += [(f"english.{ko}", en) for ko, en in texts["english"].items() if answers.HANGUL.search(en)]
    assert found == []


def test_the_data_and_claims_korean_words_are_said_in_english():
    assert answers.in_english("문제 11 (나) (Xiong et al. 2020; 문서는 재지 않음)") == (
        "Problem 11 (b) (Xiong et al. 2020; the document does not measure it)")
    assert answers.in_english("per layer (계층당)") == "per layer"  # the original after its English: once
    assert answers.in_english("grows deeper (앞·뒤 정규화의 차이는 블록을 깊게 쌓을수록 커져요)") == "grows deeper"
    assert answers.in_english("three subjects (국어·영어·수학)") == "three subjects (Korean·English·math)"
    assert answers.in_english(0.5) == 0.5 and answers.in_english("plain") == "plain"


def test_the_english_report_from_the_recorded_run_has_no_korean(tmp_path):
    report = Report(ROOT / GALLERY / "params.yaml", ROOT / GALLERY, tmp_path / "figs", "en", draw=False)
    pages = [report.header(), report.document_heading("000"), report.document_heading("004"), report.claims_table()]
    pages += [report.section(key) for key, *_ in SECTIONS if key != "p11"]
    # problem 11 but its training-dynamics diagnostics (a minute to read on a loaded machine; numbers and answers.yaml's
    # words, checked above): its question, its sweep table, answers (a) and (b), the sensitivity and inference studies
    pages += [report.question("p11"), report.table("sweep"), report.sensitivity(), report.inference()]
    pages += [report._answer_html(answers.answer(key, report.data, report.claims, "en")) for key in ("p11a", "p11b")]
    text = html.unescape(re.sub(r"<[^>]+>", " ", "".join(pages)))
    assert "Problem 11 (c)" in text and "Korean" in text and "Exercise 3" in text  # said in English, not left out
    assert korean_left(text) == []
    korean = Report(ROOT / GALLERY / "params.yaml", ROOT / GALLERY, tmp_path / "figs", "ko", draw=False)
    assert "문제 11 (다)" in korean.claims_table() and "국어" in korean.section("p9")  # the Korean page as it was


def test_the_recorded_report_draws_the_studies_figures_their_own_rules_draw_in_the_pipeline(tmp_path):
    """`blocklab report recorded` runs the notebook, which shows the studies' figures without drawing them (their own
    rules draw them in the pipeline): it draws each from the recorded tables, the sensitivity study's per-step losses
    (not in the gallery: 8 MB) aggregated from its recorded runs by its own aggregate, whose summary and claim x
    setting equal the gallery's byte for byte. Before, the English report had 5 of its 15 figures missing."""
    import json

    from blocklab.params_file import load_params
    from blocklab.reporting.report import draw_study_figures, recorded_tables
    from blocklab.studies.dynamics.plan import FIGURES as DYNAMICS
    from blocklab.studies.sensitivity.aggregate import aggregate
    from blocklab.studies.sensitivity.plan import FIGURES as SENSITIVITY

    params = load_params(ROOT / GALLERY / "params.yaml")
    tables = aggregate(params, ROOT)
    assert tables["summary"].to_csv(index=False) == (ROOT / GALLERY / "sensitivity" / "summary.csv").read_text()
    data = recorded_tables(params, ROOT, tmp_path / "data")
    assert not (ROOT / GALLERY / "sensitivity" / "losses.csv").exists()  # written in the copy, never in the records
    drawn, lacking = draw_study_figures(params, data, tmp_path / "figs", "en")
    assert sorted(drawn) == sorted([*DYNAMICS, *SENSITIVITY]) and lacking == {}
    for name in drawn:
        sidecar = json.loads((tmp_path / "figs" / f"{name}.json").read_text(encoding="utf-8"))
        assert (tmp_path / "figs" / f"{name}.png").stat().st_size > 10_000 and sidecar["sources"], name
    # a table no record holds is named, not drawn around
    (data / "dynamics" / "losses.csv").unlink()
    _, lacking = draw_study_figures(params, data, tmp_path / "again", "en")
    assert lacking == {"dynamics_collapse": ["data/dynamics/losses.csv"]}
