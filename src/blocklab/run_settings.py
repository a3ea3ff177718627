"""The run settings of params.yaml as typed, frozen objects: the copy task, the copy-task model and the sweep; a run's
name; the one vocabulary of a run's outcome.

Each section's fields and types are written down once, here, instead of string keys into nested dicts in every module
that reads them. Parsed from a params dict that has already been validated (``params_file.load_params``: the schema
refuses unknown or missing keys and wrong types, the cross-field checks run before any compute), so parsing only names
the fields and checks nothing again. A study that trains with other settings (``studies.cells.cell_params``) hands a
modified params dict: each object is parsed from whatever dict a function is given.

The params level: it imports nothing of the package, so every layer can use it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CopyTask:
    """``copy_task``: the sequences to copy, and how many a step trains on."""
    vocab_size: int
    seq_len: int
    batch_size: int

    @classmethod
    def from_params(cls, params: dict) -> CopyTask:
        return cls(**params["copy_task"])


@dataclass(frozen=True)
class CopyModel:
    """``copy_model``: the copy-task model, less what each run chooses (its norm position) or the task fixes."""
    d_model: int
    n_heads: int
    n_layers: int
    ffn_kind: str
    ffn_ratio: float
    norm_kind: str
    position: str
    init: str

    @classmethod
    def from_params(cls, params: dict) -> CopyModel:
        return cls(**params["copy_model"])


@dataclass(frozen=True)
class Sweep:
    """``sweep``: the runs of document 000's sweep and how each trains.

    ``precision`` defaults to fp32, as a params dict written before the setting existed meant it.
    """
    norms: tuple[str, ...]
    warmups: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: int
    lr: float
    checkpoint_every: int
    compile: bool
    fast_path: bool
    batched: str | bool  # auto | true | false
    precision: str = "fp32"

    @classmethod
    def from_params(cls, params: dict) -> Sweep:
        section = params["sweep"]
        return cls(**{**section, "norms": tuple(section["norms"]), "warmups": tuple(section["warmups"]),
                      "seeds": tuple(section["seeds"])})


def run_name(norm: str, warmup: int, seed: int) -> str:
    """A copy-task run's directory name, in the main sweep and in every study: ``pre-w0-s0``."""
    return f"{norm}-w{warmup}-s{seed}"


# ---- a training run's outcome: one vocabulary, and the words of the three judges mapped onto it ------------------------
# Three judges name a copy-task run's outcome from its loss curve, each for its own question and with its own
# thresholds in units of chance (ln V): the sweep (training.sweep.classify: its best and last loss), the stability lab
# (lab.outcomes.outcome: the first step below 0.1 ln V, the last loss) and the dynamics study
# (studies.dynamics.plan.OUTCOMES: streaks below and above thresholds, spikes). Their words stay in their tables (the
# recorded runs hold them); this is what each means in the one vocabulary, OUTCOMES (docs/outputs.md#outcomes).
OUTCOMES = ("learned", "partial", "never learned", "collapsed", "diverged")
OUTCOME_WORDS = {
    "sweep": {"learned": "learned", "partial": "partial", "stuck": "never learned", "collapsed": "collapsed",
              "diverged": "diverged"},  # diverged: a run's meta.json status
    "lab": {"learned": "learned", "never": "never learned", "collapsed": "collapsed", "diverged": "diverged"},
    "dynamics": {"stable": "learned", "spiked": "learned", "never learned": "never learned", "collapsed": "collapsed"},
}


def outcome(judge: str, word: str) -> str:
    """``word`` of ``judge`` (sweep, lab, dynamics) in the one vocabulary: ``outcome("lab", "never")`` is "never
    learned"."""
    try:
        return OUTCOME_WORDS[judge][word]
    except KeyError:
        raise ValueError(f"{judge!r} does not judge a run {word!r}; allowed: "
                         + "; ".join(f"{j}: {', '.join(w)}" for j, w in OUTCOME_WORDS.items())) from None
