"""What a reader sees while and after the smoke runs: one progress line (the jobs done of all, the time left at the
pace of the jobs finished), the detail in a log file that is named, and `blocklab report inspect`'s few lines."""
from __future__ import annotations

import io
import subprocess
import sys

from blocklab import smoke
from blocklab.reporting.browser import summary_lines


def test_a_duration_is_said_in_seconds_minutes_or_hours():
    assert [smoke.duration(s) for s in (0, 44.6, 60, 190, 3599, 3600, 3900 + 59)] == [
        "0 s", "45 s", "1 min 00 s", "3 min 10 s", "59 min 59 s", "1 h 00 min", "1 h 05 min"]


def test_the_progress_line_counts_the_jobs_and_its_eta_follows_the_pace_of_those_finished():
    progress = smoke.Progress(started=0.0)
    assert progress.line(3.0) == "blocklab smoke: planning the jobs, 3 s so far, measuring this machine"
    # the Snakefile's onstart line (status.eta_line): its estimate counts down until a job finishes
    assert progress.feed("blocklab: about 0:10:00 on 2 lane(s) at load 7.5: training 0:00:04 (...)\n", 5.0)
    assert progress.line(65.0) == ("blocklab smoke: planning the jobs, 1 min 05 s so far, about 9 min 00 s left "
                                   "(the start's estimate)")
    assert not progress.feed("[Mon Dec  7 05:00:00 2026]\n", 70.0)  # chatter changes nothing
    assert not progress.feed("rule train_copy:\n", 70.0)
    # 2 of 10 done 100 s after the jobs could start: 50 s a job, 8 left, less the time since the last finished
    assert progress.feed("2 of 10 steps (20%) done\n", 105.0)
    assert progress.line(105.0) == ("blocklab smoke: 2 of 10 jobs done, 1 min 45 s so far, about 6 min 40 s left (at "
                                    "the pace of the 2 finished)")
    assert progress.left(125.0) == (380.0, "at the pace of the 2 finished")
    assert progress.left(1000.0)[0] == 0.0 and "any moment now" in progress.line(1000.0)
    progress.feed("9 of 10 steps (90%) done\n", 455.0)  # (455 - 5) / 9 = 50 s a job: one left
    assert progress.left(455.0) == (50.0, "at the pace of the 9 finished")
    progress.feed("10 of 10 steps (100%) done\n", 500.0)
    assert progress.line(500.0) == "blocklab smoke: 10 of 10 jobs done, 8 min 20 s so far"


def test_without_the_starts_estimate_the_pace_counts_from_the_start():
    progress = smoke.Progress(started=10.0)
    progress.feed("1 of 4 steps (25%) done", 40.0)
    assert progress.left(40.0) == (90.0, "at the pace of the 1 finished")


def _child(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


CHATTER = """
import sys
print("blocklab: about 0:00:30 on 2 lane(s): training 0:00:01")
for done in range(1, 4):
    for i in range(50):
        print(f"rule job{done}: line {i} of a job's chatter")
    print(f"{done} of 3 steps ({done * 33}%) done")
"""


def test_the_output_goes_to_the_log_and_the_terminal_gets_the_progress_line(tmp_path):
    log, shown = tmp_path / "logs/smoke.log", io.StringIO()
    log.parent.mkdir()
    assert smoke.Watched(_child(CHATTER), log, stream=shown).wait() == 0
    lines = shown.getvalue().splitlines()
    assert len(lines) <= 3 and lines[-1].startswith("blocklab smoke: 3 of 3 jobs done, "), lines  # not a terminal
    assert "chatter" not in shown.getvalue()
    kept = log.read_text()
    assert kept.count("a job's chatter") == 150 and "3 of 3 steps (99%) done" in kept


def test_a_failed_run_shows_the_logs_last_lines_and_names_it(tmp_path):
    log, shown = tmp_path / "smoke.log", io.StringIO()
    script = CHATTER + "print('MissingInputException: no data/x.csv'); sys.exit(1)\n"
    assert smoke.Watched(_child(script), log, stream=shown).wait() == 1
    said = shown.getvalue().splitlines()
    assert "MissingInputException: no data/x.csv" in said
    assert said[-1] == (f"blocklab smoke: Snakemake stopped (exit status 1); above, the last {smoke.TAIL_ON_ERROR} "
                        f"lines of its output; all of it: {log}")
    assert len(said) <= smoke.TAIL_ON_ERROR + 4


def test_an_interrupt_ends_with_snakemakes_resume_line(tmp_path):
    log, shown = tmp_path / "smoke.log", io.StringIO()
    script = CHATTER + ("print('blocklab: interrupted; kept 3 finished runs and 0 checkpoints; resume with "
                        "`blocklab smoke --keep /tmp/x`'); sys.exit(1)\n")
    assert smoke.Watched(_child(script), log, stream=shown).wait() == 1
    assert shown.getvalue().splitlines()[-1].startswith("blocklab: interrupted; kept 3 finished runs")


def test_smoke_takes_the_reports_language(tmp_path):
    """`blocklab smoke --lang en`: the scratch copy's params.yaml is the tiny configuration with figures.lang: en."""
    import shutil

    import yaml

    from blocklab.cli import build_parser
    from blocklab.params_file import load_params

    args = build_parser(["smoke"]).parse_args(["smoke", "--lang", "en"])
    assert args.lang == "en"
    tiny = smoke.PROJECT / "configs/tiny.yaml"
    shutil.copy(tiny, tmp_path / "params.yaml")
    smoke.set_lang(tmp_path / "params.yaml", "en")
    english, korean = load_params(tmp_path / "params.yaml"), load_params(tiny)
    assert english["figures"]["lang"] == "en" and korean["figures"]["lang"] == "ko"
    assert {**english, "figures": korean["figures"]} == korean
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["figures"]["lang"] == "en"


def test_report_inspect_says_what_it_saw_in_a_few_lines():
    seen = {"title": "blocklab analysis", "missing_figures": 1, "visible_code_elements": 0, "text_has_code": False,
            "figures": [{"figure": "loss_curves", "complete": True, "width": 900, "height": 500, "shown": 800},
                        {"figure": "problem9_scores", "complete": False, "width": 0, "height": 0, "shown": 0}],
            "answers": [{"key": "p9a", "verdict": "reproduced"}, {"key": "p11a", "verdict": "inconclusive"},
                        {"key": "p9b", "verdict": "reproduced"}],
            "sections": ["p9", "p11"], "toc_links": ["#sec-p9", "#sec-p11", "#sec-claims"], "toc_targets_missing": 0,
            "claims_rows": 46, "claims_coloured": 46,
            "fonts": {"h1": {"elements": 1, "fonts": {"NanumGothic (web font)": 18}},
                      "table.claims td": {"elements": 300, "fonts": {"NanumGothic (web font)": 9000,
                                                                     "DejaVu Sans": 3}}},
            "height": 24000}
    lines = summary_lines(seen, "reports/analysis.html", 1200)
    assert len(lines) <= 12 and not any(line.lstrip().startswith(("{", '"')) for line in lines)
    text = "\n".join(lines)
    for said in ("figures: 2 shown, 1 not loaded (problem9_scores); 1 missing", "answers: 3 (reproduced 2, "
                 "inconclusive 1)", "claims table: 46 rows, each coloured by its verdict", "code: none shown",
                 "DejaVu Sans drew some of table.claims td", "24,000 px"):
        assert said in text, (said, text)
    assert lines[-1].startswith("wrong: 1 figure not loaded; 1 figure missing") and "--json" in lines[-1]
    seen |= {"missing_figures": 0, "figures": seen["figures"][:1]}
    assert summary_lines(seen)[-1].startswith("nothing wrong found")
    assert summary_lines({"title": "x"})[-1].startswith("nothing wrong found")  # what an older page check returns


def test_a_real_snakemake_run_reads_as_one_line_with_its_output_in_the_log(tmp_path):
    """Snakemake's own lines through a pipe (a 3-job workflow): the progress line counts its jobs, the log holds them."""
    (tmp_path / "Snakefile").write_text('rule all:\n    input: "a.txt", "b.txt"\n'
                                        'rule make:\n    output: "{x}.txt"\n    shell: "echo made > {output}"\n')
    child = subprocess.Popen([smoke.snakemake_command(), "--cores", "1"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    shown = io.StringIO()
    assert smoke.Watched(child, tmp_path / "smoke.log", stream=shown).wait() == 0
    assert shown.getvalue().splitlines()[-1].startswith("blocklab smoke: 3 of 3 jobs done, ")
    assert "rule make:" in (tmp_path / "smoke.log").read_text() and "rule make" not in shown.getvalue()
