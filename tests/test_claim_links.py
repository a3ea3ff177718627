"""Every claim id a page names is a claim of claims.yaml: a dangling claim link (a new position's `lit-peri-nowarm`
before its claim is written, a renamed claim) fails here."""
from __future__ import annotations

from pathlib import Path

from blocklab.reporting import claim_links, docs

ROOT = Path(__file__).resolve().parents[1]


def test_every_claim_id_a_page_names_is_a_claim():
    """README.md, performance/README.md, docs/ and the records' pages (docs.pages: the pages `blocklab docs` renders):
    every `d000-…`, `d004-…`, `lit-…` and `p11c-…` id in a code span is one of claims.yaml's."""
    ids = claim_links.claim_ids()
    found = {page.relative_to(ROOT).as_posix(): claim_links.dangling(page.read_text(encoding="utf-8"), ids)
             for page in docs.pages(ROOT)}
    assert not {page: bad for page, bad in found.items() if bad}, "claim ids that no claim of claims.yaml has"


def test_a_dangling_claim_link_fails_and_a_real_one_does_not():
    """The checker sees a linked id no claim has, a bare one, and one split from its link, and passes real ids."""
    ids = claim_links.claim_ids()
    assert {"lit-sandwich-nowarm", "d000-depth-gap", "p11c-post-norm-warm-fails-at-high-lr"} <= ids
    page = ("- `sandwich`: 4 of 4 learned ([`lit-sandwich-nowarm`](lab.md)).\n"
            "- `peri`: no run recorded yet ([`lit-peri-nowarm`](lab.md)).\n"
            "The gap (`d000-depth-gap`) and `p11c-post-norm-warm-fails`, with `lit-peri-nowarm` again.\n")
    assert claim_links.dangling(page) == ["lit-peri-nowarm", "p11c-post-norm-warm-fails"]
    assert claim_links.dangling("[`lit-sandwich-nowarm`](lab.md), `d000-depth-gap`, `blocklab docs`") == []
