"""The tiny DAG's reports/analysis.html as a reader sees it in headless Chromium, and Snakemake's own report.

Reuses the session's tiny DAG run (conftest.snake_project). The browser tests skip only when no Chromium is installed,
and say so; .ci/run installs Debian's chromium and sets BLOCKLAB_REQUIRE_BROWSER=1, so in CI they run (or fail).
"""
import base64
import io
import os
import re
import zipfile

import pandas as pd
import pytest
from tiny_dag import run_in_project
from fontTools.ttLib import TTFont

from blocklab.params_file import load_params
from blocklab.pipeline import FIGURES
from blocklab.reporting import answers
from blocklab.reporting.browser import find_chromium, inspect_report
from blocklab.reporting.claims import Data
from blocklab.studies.dynamics.plan import FIGURES as DYNAMICS_FIGURES
from blocklab.reporting.report import SENSITIVITY_FIGURES

CHROMIUM = find_chromium()
if CHROMIUM is None and os.environ.get("BLOCKLAB_REQUIRE_BROWSER"):
    raise RuntimeError("BLOCKLAB_REQUIRE_BROWSER is set but no Chromium is installed (apt-get install chromium)")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="SKIPPED: no Chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")
HANGUL = re.compile("[\uac00-\ud7a3]")
OUR_FONT = "NanumGothic (web font)"


@pytest.fixture(scope="module")
def seen(snake_project, tmp_path_factory):
    shot = tmp_path_factory.mktemp("browser") / "report.png"
    result = inspect_report(snake_project / "reports" / "analysis.html", CHROMIUM, screenshot=shot)
    result["screenshot"] = shot
    return result


@needs_chromium
def test_every_figure_loads_and_no_code_is_shown(seen, snake_project):
    params = load_params(snake_project / "params.yaml")
    expected = set(FIGURES) | (set(SENSITIVITY_FIGURES) if params["sensitivity"]["in_report"] else set())
    expected |= set(DYNAMICS_FIGURES) if params["dynamics"]["in_report"] else set()
    assert {f["figure"] for f in seen["figures"]} == expected and seen["missing_figures"] == 0
    for figure in seen["figures"]:
        assert figure["complete"] and figure["width"] > 100 and figure["height"] > 100 and figure["shown"] > 100, figure
    assert seen["visible_code_elements"] == 0 and not seen["text_has_code"]
    assert seen["toc_links"] and seen["toc_targets_missing"] == 0
    assert seen["claims_rows"] > 20 and seen["claims_coloured"] == seen["claims_rows"]  # every claim row has its colour
    assert seen["screenshot"].stat().st_size > 50_000


@needs_chromium
def test_every_answer_is_shown_with_the_numbers_of_the_data(seen, snake_project):
    shown = {a["key"]: a for a in seen["answers"]}
    assert list(shown) == list(answers.ORDER)
    data = snake_project / "data"
    summary = pd.read_csv(data / "sweep/summary.csv")
    post = summary[(summary["norm"] == "post") & (summary["warmup"] == 0)].sort_values("seed")
    for r in post.itertuples():  # problem 11 (a): each post-norm final loss, as in the data file
        assert f"시드 {r.seed} {answers.num(r.final_loss, 4)}" in shown["p11a"]["text"]
    for r in pd.read_csv(data / "residual_sim/table.csv").itertuples():  # problem 10 (a)
        assert f"블록 {r.blocks}개 뒤 {r.mean_length:.3f}" in shown["p10a"]["text"]
    blocks = pd.read_csv(data / "param_counts/blocks.csv")
    for total in blocks.loc[blocks["case"] == "exercise1", "built_numel"]:  # exercise 1
        assert f"{int(total):,}" in shown["e1"]["text"]
    claims = pd.read_csv(data / "claims/claims.csv").set_index("id")
    assert shown["p9a"]["verdict"] == answers.combine(claims.loc[["d000-p9-A", "d000-p9-B", "d000-p9-C"], "verdict"])
    if seen["sensitivity"] == "absent":
        assert "민감도 연구는 이 실행에서 돌리지 않았다" in shown["p11c"]["text"]
    else:
        assert "민감도 연구(" in shown["p11c"]["text"]


def test_claim_by_setting_table_shows_every_verdict_its_measurement_and_the_agreement(snake_project):
    import html as html_mod

    from blocklab.reporting.sensitivity import robustness

    data = snake_project / "data" / "sensitivity" / "claims_by_setting.csv"
    if not load_params(snake_project / "params.yaml")["sensitivity"]["in_report"]:
        pytest.skip("the tiny configuration does not put the study in the report")
    by_setting = pd.read_csv(data, keep_default_na=False)
    page = (snake_project / "reports" / "analysis.html").read_text(encoding="utf-8")
    table = re.search(r'<table class="blocklab sensitivity".*?</table>', page, re.S).group(0)
    rows = {re.search(r"<td>(.*?)</td>", r).group(1): r for r in re.findall(r"<tr><td>.*?</tr>", table, re.S)}
    assert set(rows) == set(by_setting["id"])
    titles = {claim_id: [html_mod.unescape(s) for s in re.findall(r'title="(.*?)"', row)] for claim_id, row in rows.items()}
    for claim_id, group in by_setting.groupby("id", sort=False):  # each cell carries what was measured in its setting
        assert titles[claim_id] == list(group["measured"])
    agree = robustness(by_setting).set_index("id")
    for claim_id, row in rows.items():
        assert f'<td class="agree">{agree.loc[claim_id, "agree"]}/{agree.loc[claim_id, "settings"]}</td>' in row


def embedded_font_characters(page: str) -> set[str]:
    """Every character the report's embedded @font-face fonts have a glyph for."""
    covered = set()
    for encoded in re.findall(r"url\(data:font/woff;base64,([A-Za-z0-9+/=]+)\)", page):
        covered |= {chr(c) for c in TTFont(io.BytesIO(base64.b64decode(encoded))).getBestCmap()}
    return covered


@needs_chromium
def test_korean_text_is_drawn_with_the_project_font(seen, snake_project):
    page = (snake_project / "reports" / "analysis.html").read_text(encoding="utf-8")
    covered = embedded_font_characters(page)
    text = re.sub(r"<[^>]+>", "", re.sub(r"<script.*?</script>|<style.*?</style>", "", page, flags=re.S))
    hangul = set(HANGUL.findall(text))
    assert len(hangul) > 300 and hangul <= covered  # the embedded NanumGothic has a glyph for every Hangul syllable
    uncovered = {c for c in set(text) - covered if not c.isspace()}
    assert not any(HANGUL.match(c) for c in uncovered)
    assert any(f["family"] == "NanumGothic" and f["status"] == "loaded" for f in seen["font_faces"])
    assert seen["body_font"].startswith("NanumGothic")
    for selector in ("h1", "blockquote.question", "div.answer p", "table.claims td"):
        used = seen["fonts"][selector]
        assert used["elements"] > 0 and used["fonts"].get(OUR_FONT, 0) > 0, (selector, used)
        # the browser drew these with the embedded font; another font only for a non-Hangul character it lacks
        # (e.g. U+2212 minus), never a replacement glyph for Hangul
        others = sum(n for font, n in used["fonts"].items() if font != OUR_FONT)
        assert others == 0 or (uncovered and others <= 0.01 * used["fonts"][OUR_FONT]), (selector, used, uncovered)
    assert any(HANGUL.search(a["text"]) for a in seen["answers"])


def test_english_answers_from_the_tiny_run(snake_project):
    """figures.lang: en gives the same answers in English: every placeholder filled, no Hangul left."""
    params = load_params(snake_project / "params.yaml")
    data = Data(snake_project / "data", params)
    claims = pd.read_csv(snake_project / "data/claims/claims.csv")
    for key in answers.ORDER:
        text = answers.answer(key, data, claims, "en").text
        assert text and "{" not in text and not HANGUL.search(text.replace("국어", "").replace("영어", "").replace("수학", "")), key


def test_snakemake_report_lists_every_figure_with_its_rule(snake_project, tmp_path):
    out = tmp_path / "report.zip"
    run_in_project(["snakemake", "--report", str(out)], snake_project)
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        text = "\n".join(z.read(n).decode("utf-8", "replace") for n in names if n.endswith((".html", ".js", ".json")))
    page = re.sub(r"<span[^>]*>|</span>", "", text)  # the rules' code is syntax-highlighted
    for name in FIGURES:  # every figure is a result, with its labels (data file) and the rule that made it
        assert any(n.endswith(f"/{name}.png") for n in names), name
        assert f'"figs/{name}.png": {{"name": "{name}.png"' in page and f'"figure": "{name}"' in page, name
    assert any(n.endswith("/analysis.html") for n in names)
    for rule in ("report", "train_copy", "claims", "gradnorm"):
        assert f'"{rule}"' in page, rule
    assert "blocklab report notebook --params" in page and "blocklab sweep train --params" in page  # the rules' code
    assert '"dpi"' in page  # the report rule's params (figures section)


def test_figures_keep_text_off_the_data_and_in_one_language():
    """Two figures: the copy-model legend sits below its axes (it covered the curves and the y label), and
    the Korean parameter-count figure has no English word in its title."""
    from blocklab.figures.params import block_breakdown_figure
    from blocklab.figures.residual_trained import residual_growth_figure

    layers = list(range(5))
    lm = pd.DataFrame({"model": "m", "prompt": "ko", "layer": layers, "norm_of_mean": [1, 2, 4, 8, 16.0],
                       "token_norm_p50": [1, 2, 4, 8, 16.0], "sqrt_ref_norm_of_mean": [1, 1.4, 1.7, 2, 2.2]})
    copy = pd.DataFrame([{"norm": n, "state": s, "seed": 0, "layer": l, "mean_token_norm": 5 + l * (n == "pre"),
                          "sqrt_ref_token_norm": 5 * (l + 1) ** 0.5}
                         for n in ("post", "pre") for s in ("init", "trained") for l in layers])
    fig = residual_growth_figure(lm, copy, "ko")
    fig.canvas.draw()
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent()
        assert legend.y1 <= ax.get_window_extent().y0, "legend overlaps its axes"
    blocks = pd.DataFrame([{"case": "grid", "variant": "modern", "ffn_kind": "swiglu", "d_model": 64, "ffn_ratio": 4.0,
                            "attention": 16384, "ffn": 49152, "norms": 128, "built_numel": 65664}])
    title = block_breakdown_figure(blocks, lang="ko").axes[0].get_title()
    assert "modern" not in title and not re.search("[A-Za-z]{5,}", title.replace("RMSNorm", "")), title


def test_the_notebook_kernel_runs_over_local_sockets_without_the_tcp_warning(tmp_path, capfd):
    """``report.kernel_config``: the analysis notebook's kernel talks over IPC sockets in a private directory, so the
    pipeline's output carries no "Kernel is running over TCP without encryption" warning. With the default
    (TCP) configuration the same notebook prints it: the test can fail."""
    import nbformat
    import papermill

    from blocklab.reporting.report import kernel_config

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "in.ipynb")
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    done = papermill.execute_notebook(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
                                      progress_bar=False, config=kernel_config(sockets))
    assert done.cells[0].outputs[0]["text"] == "42\n"
    assert "without encryption" not in "".join(capfd.readouterr())
    assert not list(sockets.iterdir())  # the kernel's sockets are gone with it
