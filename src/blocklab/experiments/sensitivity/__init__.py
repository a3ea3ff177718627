"""What document 000 leaves open: the copy-task sweep under other position signals, batch sizes and precisions at the
document's size, and a depth x learning-rate grid (the document's "the difference grows with depth").

A *cell* is one setting of the open choices, named ``{position}-b{batch}-L{depth}-lr{lr}-{precision}``; each of its
runs (norm x warm-up x seed) is an ordinary sweep run (``sweep.train_copy_run``: same code, artifacts, checkpoints,
resume, provenance) in ``data/sensitivity/runs/<cell>/<norm>-w<warmup>-s<seed>/``. A run identical to a main-sweep run
is not trained again: the plan points at ``data/sweep/runs/...`` instead. Runs at the document's size (its depth and
learning rate, i.e. ``copy_model.n_layers`` and ``sweep.lr``) train the full ``sweep.steps``; the other depth x lr cells
stop early once the loss has stayed below ``sensitivity.early_stop.loss_below`` for ``for_steps`` steps in a row.

Where each part is read:

- ``blocklab.study`` (params layer): cells, the plan, snapshots and the section's checks (re-exported here);
- ``aggregation``: the study's loss and summary tables, from runs or snapshots, and snapshots of finished runs;
- ``status``: which runs are finished, checkpointed or to do, and the hours left;
- ``commands``: ``sensitivity train``, ``sensitivity plan``, ``sensitivity gradnorm``, ``sensitivity snapshot``;
- ``blocklab.reporting.sensitivity`` (reporting layer): claim x setting, robustness, the figures, and the commands
  ``sensitivity aggregate``, ``sensitivity status`` and ``sensitivity figures``.
"""
from ...config import ConfigError
from ...study import (CELL_PATTERN, FIGURES, GRADNORM, PLAN, ROOT, RUN_KEY, RUNS, SNAPSHOT_FILES, TABLES, Cell,
                      aggregate_inputs, at_document_size, available_precisions, cell_params, check_problems,
                      default_cell, default_precision, early_stop_rule, plan, read_records, run_dirs, run_identity,
                      snapshots, unrecorded)
from .aggregation import (LOSS_AT, RECORD_FIELDS, aggregate, as_sweep_tables, gradnorm_by_choice, record_runs, relapse,
                          steps_to_learn)
from .commands import register
from .status import progress, projected_seconds

__all__ = [
    "CELL_PATTERN", "FIGURES", "GRADNORM", "LOSS_AT", "PLAN", "RECORD_FIELDS", "ROOT", "RUN_KEY", "RUNS",
    "SNAPSHOT_FILES", "TABLES", "Cell", "ConfigError", "aggregate", "aggregate_inputs", "as_sweep_tables",
    "at_document_size", "available_precisions", "cell_params", "check_problems", "default_cell", "default_precision",
    "early_stop_rule", "gradnorm_by_choice", "plan", "progress", "projected_seconds", "read_records", "record_runs",
    "register", "relapse", "run_dirs", "run_identity", "snapshots", "steps_to_learn", "unrecorded",
]
