"""The docs run over the slowest guides (tests/docs_pages.py: what it does; the rest in
test_docs_guides_rest.py, the README in test_docs.py, each beside the others)."""

from __future__ import annotations

import pytest
from docs_pages import GUIDES_FIRST, page_id, run_page

pytestmark = pytest.mark.server


@pytest.mark.parametrize("page", GUIDES_FIRST, ids=page_id)
def test_the_page_runs(page, docs_reader):
    run_page(page, docs_reader)
