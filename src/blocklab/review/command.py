"""`blocklab review`: the command line of the block reviewer."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from ..model_config import ConfigError
from ..io import write_json
from ..model import hf_config
from ..provenance import stamp
from . import hf, table
from .architecture import hf_layer_class, model_type_of, review_architecture
from .build import DEFAULT_WIDTH, _parameters, resolve
from .judge import ROLES, review_module
from .report import EXIT_USAGE, Review

CAUSAL_ARGS = ("is_causal", "tgt_mask", "tgt_is_causal")  # a forward taking one of these is a decoder's

EXIT_HELP = """exit status:
  0  pass (info notes only: deviations from the 2026 defaults)
  1  flags or warnings (e.g. FFN expansion below 2x, hard-coded widths, causal mask left to the caller,
     a head count that differs from the config's, a sub-layer without a residual)
  2  reject (post-norm deeper than 12 blocks without warm-up; a decoder whose future leaks into its past, even
     where the rest cannot be read: a measured leak outranks exit 4)
  3  bad arguments only: unknown model_type, unreadable or invalid config file (or value), unimportable module, a
     block that cannot be built or called, an unwritable --json path (unknown options are caught by the top-level
     parser, which exits 2)
  4  cannot review: no layer with attention and a feed-forward network in the data flow, an architecture
     transformers cannot build or run tiny, or past --max-memory-gb; the reason is printed (never a pass)

--hf-config SOURCE: a config.json, a shipped name (llama3-8b, qwen3-vl-4b-text) or any model_type transformers
  knows (mistral, qwen3, gemma2, gpt_neox, gpt2, falcon, phi, bert, t5, ...), at its config class's defaults. `llama`
  alone is Llama 3 8B (the shipped llama3-8b: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads,
  vocab 128256, rope_theta 500000, RMSNorm eps 1e-5); --table llama keeps transformers' LlamaConfig defaults (Llama 2
  7B's shape). The review's second line names the config reviewed and its shape. The architecture's own config
  class is shrunk (width 32, 4 query heads, vocabulary 128, every other width with them) at the config's depth,
  built in float64 and driven whole; every layer is probed, and each distinct layer pattern read in full.
  Parameters are counted at the config's full size on the meta device.

supported --module targets (--module IMPORTS the module and RUNS its code, the block's constructor and forward: review
only code you trust; a module is looked up in the current folder too, and path/to/file.py:Class imports that file):
  a transformers layer class, e.g. transformers.models.llama.modeling_llama:LlamaDecoderLayer: built inside its
      own model from its config class and reviewed as --hf-config does (--role encoder/decoder picks the stack
      of an encoder-decoder)
  torch.nn:TransformerEncoderLayer / TransformerDecoderLayer  built as cls(d_model, nhead=4,
      dim_feedforward=4*d_model, dropout=0, batch_first=True, **kwargs)
  a class taking a config object (first argument named cfg/config/args/params), e.g. nanoGPT's Block or
      blocklab.model.blocks:EncoderBlock: built as cls(ConfigClass(<width>=..., <heads>=4, <dropout>=0,
      **kwargs)), the config class being the argument's annotation, else the one config dataclass with a width
      field in the block's module, else blocklab's ModelConfig
  a class taking d_model (or dim / embed_dim / hidden_size) and optionally nhead / n_heads / num_heads
  a factory function, called with d_model=... when it accepts it, else with no arguments
Calls: encoder and decoder roles call block(x); cross calls block(x, memory). x is (batch, time, d_model).
A caller-supplied causal mask is tried through tgt_mask / src_mask (torch's additive float mask) or is_causal.

--json FILE keys: verdict, exit_status, structure {residual, norm_placement, norm_kind, mixer, attention,
  query_heads, kv_heads, sliding_window, qk_norm, position, ffn, ffn_ratio, moe, causal, cross_attention, layers}
  (one entry per stack, keyed 'encoder' and 'decoder', for an encoder-decoder; layers: one entry per distinct
  layer pattern with its full-size indices), parameters (the whole model at full size), facts, findings.
  With --table: the table's record (command, generated, records: one per architecture with its verdict, parameters
  and each stack's structure without evidence), which `blocklab docs` renders into docs/reviewer.md."""


def _usage_error(parser, message):
    parser.print_usage(sys.stderr)
    parser.exit(EXIT_USAGE, f"blocklab review: error: {message}\n")


def register(subparsers) -> None:
    from . import __doc__ as doc

    p = subparsers.add_parser(
        "review", help="review a transformer block (live module or Hugging Face architecture) against the 2026 "
                       "defaults", description=doc.split("\n\n")[0], epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--module", help="package.module:ClassOrFactory (looked up in the current folder too) or "
                                       "path/to/file.py:Class of the block to probe; this IMPORTS the module and "
                                       "RUNS its code (the constructor and forward): review only code you trust")
    what.add_argument("--hf-config", help="config.json path, a shipped name (llama3-8b, qwen3-vl-4b-text) or a "
                                          "transformers model_type (gpt2, t5, ...)")
    what.add_argument("model_type", nargs="?", metavar="MODEL_TYPE",
                      help="shorthand for --hf-config MODEL_TYPE: `blocklab review llama` (Llama 3 8B, the shipped "
                           "llama3-8b)")
    what.add_argument("--table", nargs="+", metavar="MODEL_TYPE",
                      help="print a markdown table of these architectures against the 2026 checklist (with --json: "
                           "record it, for blocklab docs)")
    p.add_argument("--role", choices=ROLES, help="encoder: block(x); decoder: masked block(x); cross: block(x, memory) "
                                                 "(--module: required unless its forward takes is_causal or tgt_mask: "
                                                 "then decoder)")
    p.add_argument("--attention", choices=hf.ATTENTION_BACKENDS, default="eager",
                   help="attention backend of a Hugging Face build (default eager; the verdict does not depend on it)")
    p.add_argument("--d-model", type=int, help=f"width to build the block at (default {DEFAULT_WIDTH})")
    p.add_argument("--depth", type=int, help="blocks in the intended stack (post-norm rule); default for a config: "
                                             "num_hidden_layers")
    p.add_argument("--warmup-steps", type=int, default=0, help="learning-rate warm-up of the intended training "
                                                               "(default 0: none)")
    p.add_argument("--kwargs", help="JSON object of constructor arguments (ModelConfig fields for a cfg class)")
    p.add_argument("--json", help="write the review as JSON here")
    p.add_argument("--max-memory-gb", type=float, default=None,
                   help="refuse (exit 4, with the reason) a tiny build or a batched probe that would need more than "
                        "this (default 4)")
    # this command's own exit 2 means 'reject', so its argument errors exit 3
    p.error = lambda message: _usage_error(p, message)
    p.set_defaults(func=_main)


def _parse_kwargs(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--kwargs is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--kwargs must be a JSON object, got {type(value).__name__}")
    return value


def run_review(args) -> Review:
    if getattr(args, "model_type", None):
        args.hf_config = args.model_type
    if sum(bool(getattr(args, k, None)) for k in ("module", "hf_config", "table")) != 1:
        raise ConfigError("give exactly one of --module, --hf-config or --table")
    for name in ("d_model", "depth"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.warmup_steps < 0:
        raise ConfigError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    attention = getattr(args, "attention", "eager")
    cap = getattr(args, "max_memory_gb", None)
    if cap is not None and not cap > 0:
        raise ConfigError(f"--max-memory-gb must be > 0, got {cap}")
    if getattr(args, "json", None):
        check_writable(args.json)
    if args.hf_config:
        named = hf_config.NAMED.get(args.hf_config)  # `blocklab review llama`: Llama 3 8B, as the README says
        return review_architecture(named or args.hf_config, attention=attention, depth=args.depth,
                                   warmup_steps=args.warmup_steps, max_memory_gb=cap,
                                   subject=f"{args.hf_config} = {named}" if named else None)
    target = resolve(args.module)
    if hf_layer_class(target):
        model_type = model_type_of(target)
        return review_architecture(model_type, attention=attention, depth=args.depth, warmup_steps=args.warmup_steps,
                                   only_layer_class=target, stack_role=args.role,
                                   subject=f"{args.module} (inside its {model_type} model)", max_memory_gb=cap)
    defaulted = None
    if not args.role:
        causal = [n for n in CAUSAL_ARGS if n in _parameters(getattr(target, "forward", target))]
        if not causal:
            raise ConfigError(f"--module needs --role, one of {list(ROLES)} (encoder: block(x); decoder: block(x) "
                              "must not read later positions; cross: block(x, memory))")
        args.role = defaulted = "decoder"
    review = review_module(target, args.role, d_model=args.d_model, depth=args.depth, warmup_steps=args.warmup_steps,
                         kwargs=_parse_kwargs(args.kwargs), subject=args.module, max_memory_gb=cap)
    if defaulted:
        review.add("role", "info", f"no --role given: reviewed as a decoder, as its forward takes a causal mask "
                   f"argument ({', '.join(causal)})", defaulted)
    return review


def check_writable(path: str) -> None:
    """--json's file can be written (its folder exists and is writable, the file itself is not a folder or
    read-only): checked before the review, so no verdict is printed for a run that then exits 3."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    problem = ("is a folder" if target.is_dir() else f"its folder {folder} does not exist" if not folder.is_dir()
               else "the file is not writable" if target.exists() and not os.access(target, os.W_OK)
               else f"its folder {folder} is not writable" if not os.access(folder, os.W_OK) else None)
    if problem:
        raise ConfigError(f"cannot write --json {path}: {problem}")


def _main(args) -> int:
    try:
        if getattr(args, "json", None):
            check_writable(args.json)
        if getattr(args, "table", None):
            reviews = table.run(args.table, getattr(args, "attention", "eager"), getattr(args, "max_memory_gb", None))
            print(f"`blocklab review --table {' '.join(args.table)}` ({dt.date.today().isoformat()}; bold: the "
                  "2026 default)\n")
            print(table.markdown([table.record(r) for r in reviews]))
            if args.json:
                write_json(stamp(**table.recorded(reviews, args.table, args.json)), args.json)
            return max(table.record(r)["exit_status"] for r in reviews)
        review = run_review(args)
    except (ConfigError, FileNotFoundError) as err:
        print(f"blocklab review: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:  # exit 1 would read as "flagged"
        print(f"blocklab review: error: cannot write {args.json}: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(review.text())
    if args.json:
        record = stamp(**review.to_dict(), arguments={k: v for k, v in vars(args).items() if k != "func"})
        try:
            write_json(record, args.json)
        except OSError as err:  # exit 1 would read as "flagged"
            print(f"blocklab review: error: cannot write {args.json}: {err}", file=sys.stderr)
            return EXIT_USAGE
    return review.exit_status
