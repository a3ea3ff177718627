"""A lab run's outcome from its loss curve: learned, never, collapsed or diverged (read by the runs and the records)."""
from __future__ import annotations

import math

# Outcome thresholds, in units of chance (ln V, the loss of a model that learned nothing), the sweep's own: a run has
# learned when its loss falls below 0.1 ln V; it is back at chance at 0.9 ln V; it ends collapsed when it had learned and
# its last loss is above half of chance.
LEARNED, CHANCE, ENDS_COLLAPSED = 0.1, 0.9, 0.5
OUTCOMES = ("learned", "never", "collapsed", "diverged")
COLUMNS = ["block", "n_layers", "warmup", "seed", "outcome", "final_loss", "step_learned", "step_collapsed"]


def outcome(steps: list[int], losses: list[float], vocab_size: int, diverged_step: int | None) -> dict:
    """The run's outcome and its two steps: the first step below LEARNED·ln V, the first step after it back at
    CHANCE·ln V (set also when the run recovered: its outcome then stays learned)."""
    chance = math.log(vocab_size)
    learned = next((s for s, x in zip(steps, losses) if x < LEARNED * chance), None)
    back = None
    if learned is not None:
        back = next((s for s, x in zip(steps, losses) if s > learned and x >= CHANCE * chance), None)
    final = losses[-1] if losses else float("nan")
    if diverged_step is not None:
        kind = "diverged"
    elif learned is None:
        kind = "never"
    elif final > ENDS_COLLAPSED * chance:
        kind = "collapsed"
        back = back or next(s for s, x in zip(steps, losses) if s > learned and x > ENDS_COLLAPSED * chance)
    else:
        kind = "learned"
    return {"outcome": kind, "final_loss": final, "step_learned": learned, "step_collapsed": back}


def learned(steps: list[int], losses: list[float], vocab_size: int, diverged_step: int | None) -> bool:
    """Whether the run's outcome is ``learned`` (the one reading the lab's tables and the LR study share)."""
    return outcome(steps, losses, vocab_size, diverged_step)["outcome"] == "learned"
