"""Docs that cannot drift: the README's and docs/' generated blocks are what the recorded data gives, every
relative link resolves (to a file, and to a heading where it names one), and every `blocklab` command, option and
`make` target the pages show exists."""
import io
import re
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from blocklab.cli import COMMANDS, build_parser
from blocklab.reporting import docs
from blocklab.records import DYNAMICS, GALLERY, INFERENCE, LAB_LR_RUNS, LAB_RUNS, REVIEWER, SENSITIVITY

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / GALLERY
PAGES = docs.pages(ROOT)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
SPAN = re.compile(r"`(blocklab [^`]+)`")


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_pages_are_the_ones_a_newcomer_reads():
    names = {_rel(p) for p in PAGES}
    assert {"README.md", "performance/README.md", "docs/doc000.md", "docs/doc004.md", "docs/open-questions.md",
            "docs/reproducibility.md", "docs/cost.md", "docs/scale-out.md", "docs/slurm.md"} <= names
    assert len((ROOT / "README.md").read_text(encoding="utf-8").split()) <= 1500  # a README read in minutes (wc -w)


def test_every_generated_block_is_what_the_data_gives():
    """`blocklab docs --check`: regenerate every block from records/gallery and performance/measured; nothing may differ."""
    stale = docs.update(ROOT, DATA, check=True)
    assert not stale, f"run `blocklab docs` and commit: {[_rel(p) for p in stale]}"
    names = [name for page in PAGES for name in docs.blocks(page.read_text(encoding="utf-8"))]
    assert {"claims-summary", "claims-000", "claims-004", "sensitivity-choices", "bench-latest"} <= set(names)


def test_the_readmes_run_times_are_generated_from_recorded_measurements_naming_the_machine(tmp_path):
    """How long `make run` and `make smoke` take is the run-times block, made from performance/measured/
    pipeline_times.csv: every measured row names its machine and date, the README states no duration by hand, and a
    new measurement changes the block."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "run-times" in docs.blocks(readme)
    times = pd.read_csv(ROOT / docs.PIPELINE_TIMES, keep_default_na=False)
    measured = times[times["basis"] == "measured"]
    assert set(times["what"]) == {"make run", "make smoke", "blocklab report recorded"}  # the last: said by the command
    assert set(times["cores"]) <= {"shared", "idle"}
    assert (measured["machine"].str.len() > 0).all() and (measured["date"].str.len() == 10).all()
    block = docs.run_times(DATA, ROOT)
    shown = measured[measured["what"].isin(["make run", "make smoke"])]  # `report recorded` says its own cost
    for row in shown.sort_values("date").groupby(["what", "cores"]).tail(1).itertuples():
        assert f"{row.machine}, {row.date}" in block, row
    assert not [n for n in docs.hand_numbers(readme) if re.search(r"\d(min|h|s|hours|minutes|seconds)$", n)]
    (tmp_path / "performance" / "measured").mkdir(parents=True)
    shared_smoke = measured[(measured["what"] == "make smoke") & (measured["cores"] == "shared")]
    newer = pd.concat([times, shared_smoke.tail(1).assign(
        date="2099-01-01", wall_s=61, machine="a machine of the future")])
    newer.to_csv(tmp_path / docs.PIPELINE_TIMES, index=False)
    assert "1 min 1 s on 2 shared cores (a machine of the future, 2099-01-01" in docs.run_times(DATA, tmp_path)
    # `blocklab report recorded` says its cost before it starts from the same rows, every one named
    from blocklab.reporting.report import recorded_cost

    said = recorded_cost(ROOT)
    for row in times[times["what"] == "blocklab report recorded"].itertuples():
        assert f"({row.machine}, {row.load}, {row.date})" in said, row
    assert recorded_cost(tmp_path / "nowhere") == "not measured yet"


def test_a_changed_table_changes_its_blocks_and_check_fails(tmp_path):
    """The check is not vacuous: one verdict changed in a copy of the data changes the README's block, and the
    command's --check exits 1 on it."""
    from blocklab.cli import main

    root = tmp_path / "project"
    for page in PAGES:
        (root / _rel(page)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, root / _rel(page))
    shutil.copytree(ROOT / "performance" / "measured", root / "performance" / "measured")
    shutil.copytree(DATA, root / GALLERY, dirs_exist_ok=True)
    for recorded in (SENSITIVITY, DYNAMICS, INFERENCE, REVIEWER, LAB_RUNS, Path(LAB_LR_RUNS).parent):  # recorded runs
        shutil.copytree(ROOT / recorded, root / recorded, dirs_exist_ok=True)
    shutil.copyfile(ROOT / "params.yaml", root / "params.yaml")  # the event thresholds the dynamics block judges with
    (root / "configs").mkdir(exist_ok=True)
    shutil.copyfile(ROOT / "configs" / "decide_plan.yaml", root / "configs" / "decide_plan.yaml")  # the plan's rows
    assert main(["docs", "--root", str(root), "--check"]) == 0
    claims_file = root / GALLERY / "claims" / "claims.csv"
    claims = pd.read_csv(claims_file, dtype=str, keep_default_na=False)
    first = claims.index[claims["verdict"] == "reproduced"][0]
    claims.loc[first, "verdict"] = "not reproduced"
    claims.to_csv(claims_file, index=False)
    assert main(["docs", "--root", str(root), "--check"]) == 3  # a table unlike its manifest: refused as damaged
    from blocklab.integrity import record_snapshot

    record_snapshot(claims_file.parents[1])  # a deliberate change is recorded (as `blocklab gallery` does)
    assert main(["docs", "--root", str(root), "--check"]) == 1
    summary = docs.render((root / "README.md").read_text(encoding="utf-8"), claims_file.parents[1], root)
    # the documents' claims are counted apart from the project's; the changed claim is listed by its id
    assert claims.loc[first, "source"] == "document"
    counts = ((claims["verdict"] == "not reproduced") & (claims["source"] == "document")).sum()
    assert f"are the documents'**: **" in summary and f"**{counts} not reproduced**" in summary
    assert f"`{claims.loc[first, 'id']}`" in summary
    assert main(["docs", "--root", str(root)]) == 0 and main(["docs", "--root", str(root), "--check"]) == 0


def _layer(indices, mixer="attention", position="rope", window=None, moe=None):
    return {"indices": indices, "mixer": mixer, "position": position, "attention": "GQA", "query_heads": 4,
            "kv_heads": 2, "sliding_window": window, "qk_norm": False, "ffn": "swiglu", "ffn_ratio": 3.0, "moe": moe}


def test_the_reviewers_table_is_rendered_from_its_recorded_file(tmp_path):
    """docs/reviewer.md's tables: `blocklab docs` draws them from records/reviewer/<name>.json (what `blocklab review
    --table ... --json` records); a changed record changes the block, a file that is not such a record is named."""
    import json

    from blocklab.model_config import ConfigError

    stack = {"reviewable": True, "residual": "sequential", "norm_placement": "pre", "norm_kind": "rmsnorm",
             "attention": "GQA", "query_heads": 4, "kv_heads": 2, "qk_norm": False, "position": "rope",
             "ffn": "swiglu", "ffn_ratio": 3.0, "causal": True, "rotary_fraction": 1.0,
             "layers": [_layer([0, 1, 2, 4, 5, 6]), _layer([3, 7], position="none")]}
    table = {"command": "blocklab review --table toy --json records/reviewer/architectures.json",
             "generated": "2026-12-03 18:00 UTC", "libraries": {"transformers": "5.24.0"},
             "records": [{"subject": "toy", "verdict": "pass", "exit_status": 0, "usage_error": None,
                          "parameters": 1234, "stacks": {"": stack}}]}
    (tmp_path / REVIEWER).mkdir(parents=True)
    (tmp_path / REVIEWER / "architectures.json").write_text(json.dumps(table))
    page = "<!-- generated: reviewer-architectures -->\n<!-- /generated -->\n"
    text = docs.render(page, DATA, tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| toy |"))
    # the six RoPE layers and the two NoPE ones: what sets each pattern apart, its count, its indices
    assert row == ("| toy | **sequential** | **pre** | **rmsnorm** | **GQA 4/2** | no | **rope** | **swiglu (3.00x)** | "
                   "yes | attention x6 (0-2, 4-6), NoPE x2 (3, 7) | 1,234 | pass |")
    assert table["command"] in text and "transformers 5.24.0" in text and "2026-12-03 18:00 UTC" in text
    stack["layers"] = [_layer(list(range(8)), window=4096)]
    (tmp_path / REVIEWER / "architectures.json").write_text(json.dumps(table))
    assert "| uniform, window 4096 |" in docs.render(page, DATA, tmp_path)
    del table["records"]
    (tmp_path / REVIEWER / "architectures.json").write_text(json.dumps(table))
    with pytest.raises(ConfigError, match="architectures.json: no 'records'"):
        docs.render(page, DATA, tmp_path)


def test_an_unknown_block_name_is_an_error():
    with pytest.raises(KeyError, match="claims-sumary.*allowed"):
        docs.render("<!-- generated: claims-sumary -->\n<!-- /generated -->\n", DATA, ROOT)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_resolves():
    broken = []
    checked = 0
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{_rel(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{_rel(page)}: {target} (no heading #{anchor} in {_rel(dest)})")
    assert checked > 40 and not broken, "\n".join(broken)


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor():
    assert _slug("The sweep: norm position × warm-up") == "the-sweep-norm-position--warm-up"
    assert "choices-the-document-leaves-open" in _anchors(ROOT / "docs" / "doc000.md")
    assert "no-such-heading" not in _anchors(ROOT / "docs" / "doc000.md")


def _commands() -> list[tuple[str, str]]:
    """(page, command line) for every `blocklab ...` in a code block or an inline code span of the pages."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in FENCE.findall(text):
            for line in block.splitlines():
                code = line.split(" #")[0]
                for part in re.split(r"[;&|]+", code):
                    part = part.strip()
                    if part.startswith("blocklab "):
                        found.append((_rel(page), part))
        for span in SPAN.findall(FENCE.sub("", text)):
            found.append((_rel(page), span))
    return found


def _options(parser, prefix="") -> dict[str, set[str]]:
    """{command words ("sweep train", "review"): its options}, through the groups."""
    found = {}
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in subparsers.choices.items():
        if any(a.__class__.__name__ == "_SubParsersAction" for a in sub._actions):
            found |= _options(sub, f"{prefix}{name} ")
        else:
            found[prefix + name] = set(sub._option_string_actions)
    return found


def test_every_blocklab_command_and_option_the_pages_show_exists():
    options = _options(build_parser(None))
    assert set(options) == set(COMMANDS)
    groups = {command.split()[0] for command in options if " " in command}
    wrong, seen = [], set()
    for page, line in _commands():
        words = shlex.split(line.replace("...", ""))[1:]
        if not words or words[0].startswith("-"):  # `blocklab --help`
            assert all(w in ("--help", "-h") for w in words), (page, line)
            continue
        if words[0] in groups and words[1:2] in ([], ["--help"]):  # `blocklab sensitivity` names a group
            seen.add(words[0])
            continue
        command = " ".join(words[:2]) if words[0] in groups else words[0]
        if command not in options:
            wrong.append(f"{page}: `{line}`: no command {command!r}")
            continue
        seen.add(command)
        for word in words[len(command.split()):]:
            option = word.split("=")[0].strip("[]")
            if option.startswith("-") and option not in options[command]:
                wrong.append(f"{page}: `{line}`: {command} has no option {option}")
    assert not wrong, "\n".join(wrong)
    assert len(seen) >= 8, seen  # the pages do show commands: the parser above is not checking nothing


def test_every_make_target_the_pages_show_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    shown = {t for page in PAGES for t in re.findall(r"`make ([a-z][\w-]*)`", page.read_text(encoding="utf-8"))}
    shown |= {t for page in PAGES for block in FENCE.findall(page.read_text(encoding="utf-8"))
              for t in re.findall(r"^make ([a-z][\w-]*)", block, re.M)}
    assert {"run", "test", "smoke"} <= shown and shown <= targets, shown - targets


def test_the_readmes_parameter_table_names_real_keys_and_their_defaults():
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z_.]+)` \| `?([^|`]+)`? \|", readme, re.M)
    assert len(rows) >= 6
    for key, default in rows:
        value = params
        for part in key.split("."):
            assert part in value, f"README names {key}, which params.yaml does not have"
            value = value[part]
        if default.strip() != "the recorded runs":
            assert yaml.safe_load(default) == value, (key, default, value)
        else:
            assert value, key


def test_the_default_collapse_rate_counts_the_gallery_main_sweep_seeds_only_when_it_is_the_default_setting(tmp_path):
    """Seeds 1 and 2 of the default collapse setting are main-sweep runs, in no dynamics snapshot: the docs judge them
    on the gallery's recorded sweep losses (the rules read the loss alone), and not when the gallery ran another cell."""
    from blocklab.reporting.docs import _dynamics_events

    root = tmp_path / "project"
    shutil.copytree(ROOT / DYNAMICS, root / DYNAMICS)
    shutil.copytree(DATA, root / GALLERY)
    shutil.copyfile(ROOT / "params.yaml", root / "params.yaml")
    default = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["dynamics"]["collapse"]["settings"][0]
    runs, judged, _, _ = _dynamics_events(root)
    mine = lambda frame: set(frame.loc[frame["setting"] == default, "run"])  # noqa: E731
    sweep = pd.read_csv(DATA / "sweep" / "summary.csv")
    from_sweep = set(sweep.loc[(sweep["norm"] == "post") & (sweep["warmup"] == 400), "run"])
    recorded = mine(pd.concat([pd.read_csv(f) for f in (ROOT / DYNAMICS).glob("*/runs.csv")]))
    assert mine(runs) == recorded | from_sweep  # the gallery's sweep adds what no snapshot records, each counted once
    assert len(runs) == len(judged) and runs.set_index(["setting", "run"]).index.is_unique

    gallery_params = root / GALLERY / "params.yaml"
    edited = yaml.safe_load(gallery_params.read_text(encoding="utf-8"))
    edited["copy_task"]["batch_size"] *= 2  # the gallery's run would be another cell: its sweep is not the default's
    for family in ("sensitivity", "dynamics"):  # out of the pipeline, as in the document's setup (docs/dynamics.md)
        edited.get(family, {})["in_report"] = False
    gallery_params.write_text(yaml.safe_dump(edited), encoding="utf-8")
    runs, _, _, _ = _dynamics_events(root)
    assert mine(runs) == recorded


def test_the_fitting_ranking_reads_recorded_runs_only_not_the_gallery(tmp_path):
    """The inferred-setup ranking was fixed on recorded runs (records/inference/sweep-b32 holds the batch-32 main sweep's,
    the default until batch 64 was): redrawing the gallery at another batch must not move it."""
    from blocklab.reporting.docs import RANKING_SNAPSHOTS, _ranking

    root = tmp_path / "project"
    for d in RANKING_SNAPSHOTS:
        shutil.copytree(ROOT / d, root / d)
    shutil.copytree(DATA, root / GALLERY)
    before, dirs = _ranking(root / GALLERY, root)
    assert [d.relative_to(root).as_posix() for d in dirs] == list(RANKING_SNAPSHOTS)
    b32 = before.set_index("setting").loc["learned-b32-L24-lr0.001-fp32"]
    assert b32["seeds"] == 3  # seeds 1 and 2 only exist in the batch-32 main sweep's record
    losses = root / GALLERY / "sweep" / "losses.csv"
    frame = pd.read_csv(losses)
    frame.assign(loss=frame["loss"] * 3).to_csv(losses, index=False)  # another gallery run
    after, _ = _ranking(root / GALLERY, root)
    pd.testing.assert_frame_equal(before, after)


def test_a_claim_not_reproduced_says_what_the_other_settings_gave_and_with_how_many_seeds():
    """The README's "not reproduced" lines say, per verdict, what the claim x setting table found at the other
    recorded settings (one seed each there: a value is inconclusive, a range is judged seed by seed)."""
    from blocklab.reporting.docs import _other_settings

    rows = [("learned-b64-L24-lr0.001-fp32", True, "not reproduced"), ("learned-b16-L24-lr0.001-fp32", False, "reproduced"),
            ("learned-b32-L24-lr0.001-bf16", False, "inconclusive"), ("sinusoidal-b32-L24-lr0.001-fp32", False, "inconclusive"),
            ("sinusoidal-b16-L24-lr0.001-fp32", False, "not reproduced")]
    table = pd.DataFrame([{"id": "x", "setting": s, "default": d, "verdict": v, "seeds": 1} for s, d, v in rows])
    assert _other_settings(table, "x") == ("at the 4 other recorded settings (one seed each): reproduced at learned-b16; "
                                           "not reproduced at 1; inconclusive at 2")
    none = table.assign(verdict="inconclusive", seeds=[3, 1, 1, 2, 1])
    assert _other_settings(none, "x") == ("at the 4 other recorded settings (1–2 seeds): reproduced at none; "
                                          "inconclusive at 4")
    assert _other_settings(table, "y") == "" and _other_settings(None, "x") == ""


def test_the_gallerys_claims_table_is_what_its_own_data_gives():
    """Every verdict, measurement and margin of records/gallery/claims/claims.csv is re-derived from the tables the
    gallery ships (a table a check reads but the gallery left out, such as the held-out losses, would change rows)."""
    from blocklab.params_file import load_params
    from blocklab.reporting import claims

    data = ROOT / GALLERY
    again = claims.evaluate(data, load_params(data / "params.yaml"))
    again = pd.read_csv(io.StringIO(again.to_csv(index=False))).set_index("id")  # as written to and read from CSV
    shipped = pd.read_csv(data / "claims" / "claims.csv").set_index("id")
    assert list(again.index) == list(shipped.index)
    for column in ("verdict", "measured", "margin", "off_world", "p_reproduced_if_true", "p_rejected_if_off",
                   "p_reproduced_if_off"):
        differ = [i for i in shipped.index if str(again.loc[i, column]) != str(shipped.loc[i, column])]
        assert not differ, (column, differ[:3])



def test_the_gallerys_claim_by_setting_table_is_what_the_studys_snapshots_give(tmp_path):
    """records/gallery/sensitivity/claims_by_setting.csv (and the summary beside it) re-aggregated from the study's
    snapshots in records/sensitivity with the gallery's gradient table, by the package's own command (the gallery
    README's recipe): a change to a claim's rule that was not carried into this table fails here (it once lagged
    the error-rate texts by 40 margins)."""
    import subprocess

    gallery = ROOT / GALLERY
    params = yaml.safe_load((gallery / "params.yaml").read_text(encoding="utf-8"))
    (tmp_path / "data" / "sensitivity").mkdir(parents=True)
    shutil.copy(gallery / "sensitivity" / "gradnorm.csv", tmp_path / "data" / "sensitivity" / "gradnorm.csv")
    import sys

    subprocess.run([str(Path(sys.executable).with_name("blocklab")), "sensitivity", "aggregate", "--params", str(gallery / "params.yaml"),
                    "--root", str(tmp_path), "--from", *[str(ROOT / s) for s in params["sensitivity"]["from_snapshots"]]],
                   check=True, cwd=ROOT, capture_output=True)
    for table in ("summary.csv", "claims_by_setting.csv"):
        again = pd.read_csv(tmp_path / "data" / "sensitivity" / table)
        shipped = pd.read_csv(gallery / "sensitivity" / table)
        pd.testing.assert_frame_equal(again, shipped, check_exact=True, obj=table)

# ---- no hand-written measured numbers ---------------------------------------------------------------------

# Pages a command writes whole from recorded runs, each with the line that says so (scanned by the command's tests,
# not here: their numbers change whenever a run is recorded).
WRITTEN_BY_A_COMMAND = {"docs/lab/STATUS.md": "Generated by `blocklab lab-job record"}
HAND_PAGES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
              if _rel(p) not in WRITTEN_BY_A_COMMAND]
RULE_CONVENTIONS = {"95%", "99%", "5%", "0.975", "1.96", "0.8", "0.2", "0.05"}  # the rules' levels; the learned threshold
# tests/hand_numbers.yaml's size when it was last shrunk: the allow-list may only shrink (lower this with it).
HAND_NUMBERS_AT_MOST = 596


def _allowed() -> dict:
    return yaml.safe_load((ROOT / "tests" / "hand_numbers.yaml").read_text(encoding="utf-8"))


def _settings() -> set[float]:
    """Every number the parameter files set (a learning rate 1e-3 on a page is a setting, not a measurement)."""
    found = set()

    def walk(node):
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            found.add(float(node))

    for name in ("params.yaml", "configs/tiny.yaml"):
        walk(yaml.safe_load((ROOT / name).read_text(encoding="utf-8")))
    return found


def _stray_numbers(rel: str, text: str) -> list[str]:
    """The measured-looking numbers ``text`` (page ``rel``) states by hand that neither the documents write
    (claims.yaml), nor the rules define, nor the parameter files set (in scientific notation), nor
    tests/hand_numbers.yaml allows for that page with its reason."""
    from blocklab.reporting import claims

    quoted = docs.document_numbers(claims.load_claims())
    ok = RULE_CONVENTIONS | set(_allowed()["pages"].get(rel, {}).get("numbers", []))
    settings = _settings()
    # a number the documents write passes only where the sentence says it is the document's (a measured value that
    # happens to equal one, "the loss was 4.16", is a measurement like any other)
    return [n for n, before in docs.hand_number_spans(text)
            if n not in ok and not (n in quoted and docs.QUOTES_DOCUMENT.search(before))
            and not (re.fullmatch(r"\d+(?:\.\d+)?e[-+]?\d+", n) and float(n) in settings)
            and not (re.fullmatch(r"step\d+", n) and float(n[4:]) in settings)]  # a budget a parameter file sets


def test_no_hand_written_sentence_states_a_measured_number():
    """Every measured number a reader sees in README.md and every page under docs/ (sub-folders too) is in a generated
    block (made by the code from recorded data), quoted from the documents, or on the page's reasoned allow-list
    (tests/hand_numbers.yaml, which may only shrink: its size is recorded there and here); every allow-list entry
    gives its reason and is still on its page. A page a command writes whole says so."""
    listed = _allowed()
    allowed = listed["pages"]
    size = sum(len(entry["numbers"]) for entry in allowed.values())
    assert size == listed["count"], f"tests/hand_numbers.yaml holds {size} numbers; set its count to {size}"
    assert size <= HAND_NUMBERS_AT_MOST, (f"tests/hand_numbers.yaml grew to {size} (at most {HAND_NUMBERS_AT_MOST}): "
                                          "generate the number (`blocklab docs`) instead of allowing it")
    assert set(allowed) <= {_rel(p) for p in HAND_PAGES}, "an allow-list entry for a page that is not scanned"
    assert {_rel(p) for p in HAND_PAGES} >= {"README.md", "docs/extra-seeds/cost.md", "docs/lab/cost.md",
                                            "docs/lab/README.md", "docs/gallery/README.md", "docs/HISTORY.md"}
    for rel, line in WRITTEN_BY_A_COMMAND.items():
        assert line in (ROOT / rel).read_text(encoding="utf-8"), rel
    for page in HAND_PAGES:
        rel = _rel(page)
        text = page.read_text(encoding="utf-8")
        assert not _stray_numbers(rel, text), (rel, _stray_numbers(rel, text))
        if rel in allowed:
            assert allowed[rel]["why"].strip(), rel
            stale = set(allowed[rel]["numbers"]) - set(docs.hand_numbers(text))
            assert not stale, f"{rel}: no longer on the page, remove from tests/hand_numbers.yaml: {sorted(stale)}"


def test_a_number_planted_by_hand_fails_and_one_in_a_generated_block_does_not(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    planted = readme.replace("## The parameters you change first",
                             "Post-norm collapsed in 23 % of runs, 0.4321 at step 300, 3 of 7 seeds, ×2.5 slower.\n\n"
                             "## The parameters you change first")
    assert set(_stray_numbers("README.md", planted)) == {"23%", "0.4321", "3of7", "×2.5"}
    inside = readme.replace("<!-- /generated -->", "0.4321\n<!-- /generated -->", 1)
    assert _stray_numbers("README.md", inside) == []
    # settings and counts of files are not measurements: whole numbers alone pass, and so do the parameters' values
    assert _stray_numbers("README.md", readme + "\n24 blocks, 1,200 steps, seeds 0-8, 12 runs, lr 1e-3, step 300.\n") == []


@pytest.mark.parametrize("page", ["README.md", "docs/extra-seeds/cost.md", "docs/lab/cost.md", "docs/gallery/README.md"])
def test_a_run_count_a_learning_rate_and_an_event_step_planted_in_any_page_fail(page):
    """The numbers that passed before every page was read: a count written k/n, a value in scientific notation that
    no parameter sets, an event's step; in README.md and in pages of docs/' sub-folders alike."""
    assert page in {_rel(p) for p in HAND_PAGES}
    text = (ROOT / page).read_text(encoding="utf-8")
    planted = text + "\nPost-norm learned in 7/9 runs at lr 5e-4 and collapsed at step 467.\n"
    assert set(_stray_numbers(page, planted)) - set(_stray_numbers(page, text)) == {"7/9", "5e-4", "step467"}


@pytest.mark.parametrize("page", ["README.md", "docs/lab.md", "docs/lab/README.md"])
@pytest.mark.parametrize("planted,token", [
    ("Post-norm learned in seven of nine seeds.", "sevenofnine"),
    ("It collapsed after 467 steps.", "step467"),
    ("It collapsed at step 450.", "step450"),
    ("The gap was -0.25 nats.", "-0.25"),
    ("Kept, they made it 12 times slower.", "12times"),
    ("The final loss was `0.0123`.", "0.0123"),
    ("The final loss was .0123 nats.", ".0123"),
    ("Post-norm ended at 4.16 in every run.", "4.16"),
])
def test_each_form_of_a_hand_written_measured_number_fails(page, planted, token):
    """The forms that used to pass: a count in words, "N steps", a step that is a multiple of 50 but no budget, an
    ASCII minus, "N times", a number set in a code span, a decimal without its leading zero, and a value that equals
    one the documents write (4.16 is the document's ln 64) but is said of a run, not quoted from the document."""
    text = (ROOT / page).read_text(encoding="utf-8")
    got = set(_stray_numbers(page, text + "\n\n" + planted + "\n")) - set(_stray_numbers(page, text))
    assert got == {token}, (planted, got)
    # the document's own number, quoted as the document's, still passes
    if token == "4.16":
        assert "4.16" in docs.document_numbers(__import__("blocklab.reporting.claims", fromlist=["x"]).load_claims())
        quoted = text + "\n\nThe document says post-norm then stays near 4.16.\n"
        assert "4.16" not in _stray_numbers(page, quoted)


def test_the_decide_lanes_queue_is_the_plans_lab_rows_and_the_plan_names_real_claims():
    """configs/decide_queue.txt (what scripts/decide_lanes.sh trains) is the lab rows of configs/decide_plan.yaml, in the
    plan's order; every claim a row names is in the claims table; a row of an unknown kind is refused by name."""
    from blocklab.reporting import decide

    queue = [line.strip() for line in (ROOT / "configs/decide_queue.txt").read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    assert queue == decide.queue_lines(ROOT)
    ids = set(pd.read_csv(DATA / "claims" / "claims.csv")["id"])
    named = {c for row in decide.plan_rows(ROOT) for c in row["claims"]}
    assert named <= ids, sorted(named - ids)
    block = decide.plan_block(DATA, ROOT)
    assert block.count("\n| ") == len(decide.plan_rows(ROOT)) + 1  # a row per planned row, after the header


def test_the_answer_to_11c_is_rendered_from_claims_and_follows_their_verdicts(tmp_path):
    """README's and open-questions' answer to problem 11 (다) is made from the claims table only: each sentence names
    its row and verdict, and the conclusion changes when the verdicts do (the hand-written answer had said
    the failure was not post-norm's, against the data)."""
    (tmp_path / "claims").mkdir()
    claims = pd.read_csv(DATA / "claims" / "claims.csv")
    shipped = docs.answer_11c(DATA, ROOT)
    for cid in docs.ANSWER_11C:
        assert f"`{cid}`" in shipped
    assert "only post-norm failed" in shipped and "not of post-norm as such" not in shipped
    # the sentences say no more than their rows: "the same cells" and "warm-up did not remove it" are gone
    assert "the same cells" not in shipped and "did not remove" not in shipped
    verdict = claims.set_index("id")["verdict"]
    started = verdict["p11c-post-norm-warm-starts-at-24"]
    assert ("warm-up let post-norm start at lr 1e-3" in shipped.lower()) == (started == "reproduced")
    claims.loc[claims["id"] == "p11c-post-norm-warm-starts-at-24", "verdict"] = "inconclusive"
    claims.to_csv(tmp_path / "claims" / "claims.csv", index=False)
    assert "these runs do not decide (inconclusive)" in docs.answer_11c(tmp_path, ROOT)
    claims.loc[claims["id"] == "p11c-post-norm-nowarm-fails-at-24", "verdict"] = "not reproduced"
    claims.to_csv(tmp_path / "claims" / "claims.csv", index=False)
    changed = docs.answer_11c(tmp_path, ROOT)
    assert "only post-norm failed" not in changed and "no conclusion about post-norm as such" in changed
    assert "**not reproduced** ([`p11c-post-norm-nowarm-fails-at-24`]" in changed


def test_the_reports_detector_numbers_are_the_gallery_datas_and_docs_dynamics_quotes_the_same():
    """The report's detector rates come from the gallery's data alone (``answers.detector_table``: the
    pipeline's detectors.csv, or the gallery's aggregated dynamics tables), and docs/dynamics.md's generated block,
    which also reads the snapshots in records/dynamics/, states the same hits, windows, false alarms and intervals."""
    from blocklab.reporting import answers, claims
    from blocklab.params_file import load_params

    keys = ["detector", "resolution"]
    numbers = ["events", "events_evaluable", "hits", "hit_low", "hit_high", "windows", "false_alarms", "fa_low",
               "fa_high", "runs_with_fa", "runs"]
    report = answers.detector_table(claims.Data(DATA, load_params(DATA / "params.yaml")))
    page = docs._detector_tables(DATA, ROOT)["detectors"]
    assert not report.empty
    shared = [c for c in numbers if c in report.columns and c in page.columns]
    assert {"hits", "windows", "false_alarms", "fa_high"} <= set(shared)
    got = report.set_index(keys)[shared].sort_index()
    want = page.set_index(keys)[shared].sort_index()
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_the_gallery_names_its_data_in_the_pipeline_layout_not_the_drawing_machines_paths(tmp_path):
    """The gallery's figure pages and sidecars once named /work/... of the machine that drew them. They name the
    data/ layout (``io.data_layout``), which ``blocklab gallery`` writes (``style.relative_sidecar``) and whose tables
    the gallery keeps; a figure drawn from recorded files names them by their path in the repository."""
    import json

    from blocklab.figures.style import relative_sidecar
    from blocklab.io import data_layout

    sidecars = sorted(p for p in (ROOT / "docs" / "gallery").rglob("*.json") if p.with_suffix(".png").is_file())
    assert len(sidecars) > 10
    for sidecar in sidecars:
        sources = json.loads(sidecar.read_text(encoding="utf-8"))["sources"]
        # the data/ layout, or a path of this repository (the lab's figure names its recorded runs and tables)
        assert sources and all(s.startswith("data/") or (not Path(s).is_absolute() and (ROOT / s).exists())
                               for s in sources), (_rel(sidecar), sources)
    page = (ROOT / "docs" / "gallery" / "README.md").read_text(encoding="utf-8")
    data_lines = [line for line in page.splitlines() if line.startswith("Data: ")]
    assert data_lines and all(re.fullmatch(r"Data: (`data/[^`/][^`]*`(, )?)+\.", line) for line in data_lines), data_lines
    # the generator's rewrite: under the data directory -> data/..., anything else as given
    drawn = tmp_path / "drawn.json"
    drawn.write_text(json.dumps({"figure": "x.png", "sources": [str(tmp_path / "run" / "data" / "sweep" / "losses.csv"),
                                                                 "elsewhere.csv"]}), encoding="utf-8")
    assert relative_sidecar(drawn, tmp_path / "run" / "data")["sources"] == ["data/sweep/losses.csv", "elsewhere.csv"]
    assert json.loads(drawn.read_text(encoding="utf-8"))["sources"][0] == "data/sweep/losses.csv"
    assert data_layout("data/sweep/summary.csv", "data") == "data/sweep/summary.csv"


def test_docs_holds_pages_and_pictures_and_the_records_have_one_home_in_the_code():
    """The recorded runs and tables live in records/ (``blocklab.records``), docs/ holds pages and
    pictures (and each picture's JSON sidecar); the package names those locations only through ``blocklab.records``."""
    from blocklab import records

    kept = {".md", ".png"}  # scripts live in scripts/
    strays = [_rel(p) for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix not in kept
              and not (p.suffix == ".json" and p.with_suffix(".png").is_file())]
    assert not strays, strays
    assert not list((ROOT / "docs").rglob("*.parquet")) and not list((ROOT / "docs").rglob("*.csv"))
    for name in ("GALLERY", "SENSITIVITY", "DYNAMICS", "INFERENCE", "LAB_RUNS"):
        assert (ROOT / getattr(records, name)).is_dir(), name
    old = re.compile("[\x22']docs/(gallery/data|sensitivity/|dynamics/|inference/|lab/runs|reviewer/)"
                     "|\x22docs\x22 / \x22(gallery\x22 / \x22data|sensitivity|dynamics|inference|reviewer)\x22")
    package = ROOT / "src" / "blocklab"
    literal = [f"{_rel(p)}:{n}" for p in package.rglob("*.py") for n, line in
               enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if old.search(line)]
    assert not literal, literal


def test_the_depth_grid_block_shows_every_seed_of_a_cell(tmp_path):
    """With two seeds a cell, the steps-to-learn table shows both, in seed order (a dict keyed by lr once kept only
    the last seed's), and a missing seed is a dash, not another seed's value."""
    rows = [(2, 1e-3, 0, 104.0), (2, 1e-3, 1, 103.0), (24, 1e-3, 0, None), (24, 1e-3, 1, 900.0), (2, 3e-3, 0, 50.0)]
    frame = pd.DataFrame([{"family": "depth_lr", "norm": "post", "warmup": 0, "depth": d, "lr": lr, "seed": s,
                           "steps_to_learn": k, "outcome": "learned" if k else "stuck", "run_dir": f"r{i}",
                           "wall_time_s": 3600.0, "machine": "m"} for i, (d, lr, s, k) in enumerate(rows)])
    (tmp_path / "sensitivity").mkdir()
    frame.to_csv(tmp_path / "sensitivity" / "summary.csv", index=False)
    block = docs.sensitivity_depth_lr(tmp_path, tmp_path)
    assert "seeds 0, 1 in that order" in block
    assert "| 2 | 104, 103 | 50, — |" in block and "| 24 | never, 900 | —, — |" in block, block
    assert "5 runs, 5.00 h of run time (m)." in block


# ---- pages, code, records and file names speak of the project alone ------------------------------------------------

# A work item, a session or a stop by its number ("issue N", "session-N", "stop N", "issueN_x.sh"): history lives
# in git's commit messages and in docs/HISTORY.md, by date and commit. Matched over the whole text, not line by line:
# Markdown and comments wrap anywhere, so "issue" may end one line and its number start the next.
HISTORY_WORD = re.compile(
    r"(?<![a-z])(?:issues?|sessions?|stop)(?:[_-]|\s+(?:#\s+)?)?#?\d+"  # "stops 200 steps" is English; a number on
    # a comment's next line ("# 4") is seen. And the work's own calendar (a result dated by the work's schedule, not by
    # its commit and date): a reader knows commits and dates, not how the work was scheduled
    r"|\b(?:this|last|previous|next|landed)\s+(?:stop|session)s?\b|\bproject\s+lead\b", re.I)
# In a page (Markdown) also the organisational words the pattern below lists, numbered or not. A page says what the project measured, where (the machine) and when (the date), and for what
# was not measured, the command that measures it. A login session (`nice` and autogroups) and pytest's are not the work's.
PROCESS_WORD = re.compile(r"\b(?:issues?|tickets?|sprints?|work\s+items?|helpers?)\b"
                          r"|\b(?P<ordinary>(?:login|pytest|test)\s+)?sessions?\b"  # "ordinary": passes
                          r"|\b(?:lent|lend|lends|lending)\b|\bdevice\s+tool\b|\bengineers?\b"
                          r"|\bwho\s+decides\b|\bwe\s+were\s+asked\b|\bproject\s+lead\b", re.I)
BINARY = {".png", ".pdf", ".parquet", ".pt", ".ttf", ".gz", ".zip"}


def _tracked(root: Path) -> list[str]:
    """The repository's files, relative to ``root``: git's list where there is one, else every file but caches."""
    import subprocess

    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        return [name for name in listed.stdout.splitlines() if (root / name).is_file()]
    skip = {".git", ".venv", "data", ".snakemake", ".dvc", "__pycache__"}
    return [_rel(p) for p in root.rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts)]


def _mentions(name: str, text: str) -> list[str]:
    """``name:line: words`` for each reference ``HISTORY_WORD`` finds in ``text`` and, in a page (``.md``), each word
    ``PROCESS_WORD`` finds outside those: matched over the whole text (a phrase wrapped over a line break is one
    phrase), at the line where it starts, its whitespace shown as single spaces."""
    spans = [m.span() for m in HISTORY_WORD.finditer(text)]
    if name.endswith(".md"):
        spans += [m.span() for m in PROCESS_WORD.finditer(text)
                  if not m.group("ordinary") and not any(a <= m.start() < b for a, b in spans)]
    return [f"{name}:{text.count(chr(10), 0, a) + 1}: {' '.join(text[a:b].split())}" for a, b in sorted(spans)]


def _history_mentions(root: Path, names: list[str]) -> list[str]:
    """Every file name, and every place in a text file, that names a work item, session or stop by its number; and in
    a page (``.md``), every word of how the work was organised (``PROCESS_WORD``)."""
    found = [f"{name} (file name)" for name in names if HISTORY_WORD.search(name)]
    for name in names:
        if Path(name).suffix in BINARY:
            continue
        try:
            text = (root / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += _mentions(name, text)
    return found


def test_pages_code_records_and_file_names_name_no_issue_session_or_stop_number():
    """No "issue N", "session N" or "stop N" (N a number) anywhere a reader or a maintainer looks: README, docs/ (every page, sub-
    folders too), records/, src/ (code, comments, docstrings, claims.yaml, answers.yaml), scripts/, tests/, the
    workflow, the benchmark's folder, the parameters, or any file's name."""
    names = _tracked(ROOT)
    assert "README.md" in names and "src/blocklab/reporting/claims.yaml" in names
    assert not _history_mentions(ROOT, names), "\n".join(_history_mentions(ROOT, names))


def test_the_history_check_sees_a_number_in_a_page_a_comment_and_a_file_name(tmp_path):
    word = "iss" + "ue"  # spelt in two parts so that this file passes its own check
    (tmp_path / "docs" / "extra").mkdir(parents=True)
    (tmp_path / "docs" / "extra" / "page.md").write_text(f"Fixed in {word} 62.\n", encoding="utf-8")
    (tmp_path / "code.py").write_text(f"x = 1  # see se{'ss'}ion-9\n", encoding="utf-8")
    (tmp_path / f"scripts_{word}44_seeds.sh").write_text("true\n", encoding="utf-8")
    (tmp_path / "clean.md").write_text("Issued 3 times; the run stops 200 steps early? no: stopped. The stop rule "
                                       "fired; a pytest session's run.\n", encoding="utf-8")
    (tmp_path / "records.csv").write_text(f"2026-12-05,abc,\"th{'is'} st{'op'}'s code; whole run 700 s\"\n", encoding="utf-8")
    names = [_rel_to(p, tmp_path) for p in sorted(tmp_path.rglob("*")) if p.is_file()]
    found = _history_mentions(tmp_path, names)
    assert [f.split(":")[0].split(" ")[0] for f in found] == ["scripts_" + word + "44_seeds.sh", "code.py",
                                                               "docs/extra/page.md", "records.csv"]  # clean.md passes


def test_a_numbered_reference_or_a_process_phrase_split_over_a_line_break_is_seen(tmp_path):
    """A reference wrapped over a line break ("issue" at a line's end, its number on the next; "stop" and its number;
    "lead" and "engineer") is seen at the line where it starts, in a page and in code; the organisational words of a
    page are seen numbered or not, and the ordinary senses of "stop", "session" and "lead" pass."""
    word, sess, stop = "iss" + "ue", "ses" + "sion", "st" + "op"  # spelt in two parts so that this file passes its own check
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        f"The grid has nine seeds a cell since {word}\n44, and the run before it (stop\n  31) is recorded.\n\n"
        f"The rule was fixed by the lead\nengineer. It has not run on a GPU: no {sess} so far\nwas lent one.\n",
        encoding="utf-8")
    (tmp_path / "code.py").write_text(f"# measured in {sess}\n# 12 of the lab\nx = 1\n", encoding="utf-8")
    (tmp_path / "clean.md").write_text(
        "The run stops\n200 steps early when the loss is not finite; the lead time is the onset minus the first firing.\n"
        f"`nice` ranks processes inside one login\n{sess}; the tiny DAG runs once per pytest {sess}.\n", encoding="utf-8")
    names = ["clean.md", "code.py", "docs/page.md"]
    found = _history_mentions(tmp_path, names)
    assert found == [f"code.py:1: {sess} # 12", f"docs/page.md:1: {word} 44", f"docs/page.md:2: {stop} 31",
                     "docs/page.md:6: engineer", f"docs/page.md:6: {sess}", "docs/page.md:7: lent"], found
    # the line-by-line check this replaced saw none of the wrapped references
    assert not [line for name in names for line in (tmp_path / name).read_text(encoding="utf-8").splitlines()
                if re.search(r"(?<![a-z])(?:issues?|sessions?|stop)[ _-]?#?\d+", line, re.I)]


def _rel_to(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def test_a_number_after_a_code_span_that_runs_over_a_line_break_is_still_seen():
    """Markdown lets a code span run over a line break; the checker strips it whole, so a measured number after it (in
    the same line as its closing backtick) is not paired into a false span and hidden."""
    text = "stops with `a ...;\n  b`. Measured gain here: 1.65× the fp32 path (`x.csv`)."
    assert docs.hand_numbers(text) == ["1.65"]
    assert docs.hand_numbers("`one\nspan` only, and `another`") == []
