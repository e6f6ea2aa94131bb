"""The docs run over the README, and the check that every block not run says why; the
guides run in test_docs_guides.py and test_docs_guides_rest.py, beside it. What the run
does: tests/docs_pages.py."""

from __future__ import annotations

import pytest
from docs_pages import PAGES, REPO, blocks, page_id, run_page

pytestmark = pytest.mark.server


def test_every_block_that_is_not_run_says_why():
    for page in PAGES:
        for b in blocks(page):
            if b.not_run is not None:
                assert len(b.not_run) > 10, f"{page_id(page)}:{b.line}: say why"
            assert b.language in ("bash", "python", "yaml", "text", "json"), (
                f"{page_id(page)}:{b.line}: a block with no language is neither run nor "
                "checked: name it (bash, python, yaml; text for output)"
            )


def test_the_readme_runs(docs_reader):
    run_page(REPO / "README.md", docs_reader)
