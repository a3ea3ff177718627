"""Problem 9: standardizing scores per student (what layer norm does per token) versus per subject.

Standardizing uses the population standard deviation (ddof = 0), as the document does: A = (90, 80, 70) has
mean 80 and std sqrt(200/3) = 8.165, giving (1.225, 0, -1.225).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..model_config import ConfigError
from ..io import write_json, write_table
from ..params_file import load_params
from ..provenance import stamp


def standardize(values: pd.Series) -> pd.Series:
    """Subtract the mean, divide by the population std. A constant group has no spread: the result is NaN there."""
    return (values - values.mean()) / values.std(ddof=0)


def raw_scores(section: dict) -> pd.DataFrame:
    subjects = section["subjects"]
    rows = [(student, subject, float(score))
            for student, scores in section["scores"].items() for subject, score in zip(subjects, scores, strict=True)]
    return pd.DataFrame(rows, columns=["student", "subject", "raw"])


def standardized_scores(section: dict, pair: tuple[str, str] | None = None) -> pd.DataFrame:
    """Tidy frame, one row per (student, subject).

    per_student: standardized over the student's subjects (part a; what layer norm does to one token).
    per_subject_pair: standardized over the two students of ``pair`` within each subject (part b), NaN for others;
    ``pair`` defaults to the first two students. per_subject_all: the same over every student.
    student_mean / student_std: what per_student standardization removes (part c).
    """
    frame = raw_scores(section)
    students = list(section["scores"])
    pair = tuple(pair or students[:2])
    if len(pair) != 2 or not set(pair) <= set(students):
        raise ConfigError(f"pair must name two of the students {students}, got {list(pair)}")
    by_student = frame.groupby("student", sort=False)["raw"]
    in_pair = frame["student"].isin(pair)
    frame["per_student"] = by_student.transform(standardize)
    frame["per_subject_pair"] = frame[in_pair].groupby("subject", sort=False)["raw"].transform(standardize)
    frame["per_subject_all"] = frame.groupby("subject", sort=False)["raw"].transform(standardize)
    frame["in_pair"] = in_pair
    frame["student_mean"] = by_student.transform("mean")
    frame["student_std"] = by_student.transform(lambda v: v.std(ddof=0))
    return frame


def register(subparsers) -> None:
    p = subparsers.add_parser("problem9", help="problem 9: scores standardized per student and per subject")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True, help="CSV path; metadata JSON is written beside it")
    p.set_defaults(func=_main)


def _main(args) -> None:
    section = load_params(args.params)["problem9"]
    frame = standardized_scores(section)
    out = Path(args.out)
    write_table(frame, out)
    pair = frame.loc[frame["in_pair"], "student"].unique().tolist()
    write_json(stamp(artifact=out.name, params={"problem9": section}, pair=pair, std="population (ddof=0)"),
               out.with_suffix(".json"))
