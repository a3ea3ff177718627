"""`blocklab review`: the block reviewer of document 004 (skill-transformer-block-reviewer).

It checks a transformer block against the 2026 defaults the document names (pre-norm, RMSNorm, SwiGLU, RoPE, GQA,
FFN expansion) and against its rules. Nothing is read from names: every fact comes from calling the block, or the
whole model around it, on chosen inputs.

    hf.py            a Hugging Face architecture from its own config class: shrunk, float64, at full depth, driven
                     whole; the full-size count on the meta device
    dataflow.py      one layer's structure from its live data flow (hooks, batched perturbations)
    architecture.py  every layer of each stack grouped into patterns, each read from the data flow and scaled back
                     to full size, and the review of a model
    rules.py         the 2026 checklist and the rules applied to a structure
    build.py, probe.py, structure.py, judge.py   a user's own block (`--module`): built at a chosen width, read by
                     the same data-flow reader and rules, plus what only a block needs (caller mask, memory, widths)
    report.py        findings, verdict, exit status;  command.py  the command line
    table.py         `--table`: architectures side by side, recorded as compact rows that `blocklab docs` renders

Rules: REJECT post-norm deeper than 12 blocks without warm-up; REJECT a decoder whose future leaks into its past;
FLAG FFN expansion below 2x, a missing residual, no normalization, a head count the config contradicts,
cross-attention that ignores the memory; WARN hard-coded widths and masks that only the caller applies;
CANNOT REVIEW (exit 4) a block without a recognisable token mixer or feed-forward network, an architecture
transformers cannot build or run tiny, or one past the memory cap. Deviations from the 2026 defaults are INFO.
"""
from .architecture import review_architecture, review_model
from .command import register, run_review
from .judge import ROLES, review_module
from .report import EXIT_CANNOT, EXIT_FLAG, EXIT_PASS, EXIT_REJECT, EXIT_USAGE, Finding, Review
from .structure import norm_kind

__all__ = ["EXIT_CANNOT", "EXIT_FLAG", "EXIT_PASS", "EXIT_REJECT", "EXIT_USAGE", "Finding", "ROLES", "Review",
           "norm_kind", "register", "review_architecture", "review_model", "review_module",
           "run_review"]
