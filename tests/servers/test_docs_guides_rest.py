"""The docs run over every guide test_docs_guides.py does not run (tests/docs_pages.py:
what it does)."""

from __future__ import annotations

import pytest
from docs_pages import GUIDES_FIRST, PAGES, page_id, run_page

pytestmark = pytest.mark.server


@pytest.mark.parametrize("page", [p for p in PAGES[1:] if p not in GUIDES_FIRST], ids=page_id)
def test_the_page_runs(page, docs_reader):
    run_page(page, docs_reader)
