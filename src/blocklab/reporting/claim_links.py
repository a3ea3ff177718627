"""Claim ids the pages name: every one must be a claim of claims.yaml.

A page names a claim by its id in a code span (`lit-deepnorm-nowarm`, often linked: [`d000-depth-gap`](doc000.md)).
A generated block names the ids its code builds (the lab's blocks build `lit-<fix>-nowarm` for every norm position
declared a fix for post-norm); a hand-written sentence names the ids its author typed. An id no claim has (a new
position's `lit-peri-nowarm` before its claim is written in claims.yaml, or a claim renamed) is a dangling link:
``dangling`` lists them, and tests/test_claim_links.py fails on any page that holds one.
"""
from __future__ import annotations

import re

from .claims import load_claims

# a claim id in a code span: the documents' (d000-, d004-), the literature's (lit-) and a problem part's (p11c-)
CLAIM_ID = re.compile(r"`((?:d\d{3}|lit|p\d+[a-z]?)-[a-z0-9]+(?:-[a-z0-9]+)*)`")


def claim_ids() -> set[str]:
    """Every claim id of claims.yaml (validated as it loads)."""
    return {claim["id"] for claim in load_claims()}


def dangling(text: str, ids: set[str] | None = None) -> list[str]:
    """The claim ids ``text`` names that no claim has, each once, in the order they first appear."""
    known = claim_ids() if ids is None else ids
    return list(dict.fromkeys(m[1] for m in CLAIM_ID.finditer(text) if m[1] not in known))
