"""The stability lab (`blocklab lab`): document 000's copy-task stress test for any block.

``spec``: profiles, the block (a built-in norm position, a user's module, a Hugging Face decoder layer) and the stack it
is trained in, validated before any compute; ``run``: one run and its outcome, the gradient per block at init;
``report``: the tables, rates with intervals, the figure and the page; ``command``: the command line and the Snakemake
jobs (workflow/rules/lab.smk).
"""
