"""The docs run over the slowest guides (tests/docs_pages.py: what it does; the rest in
test_docs_guides_rest.py, the README in test_docs.py, each beside the others)."""

from __future__ import annotations

import pytest
from docs_pages import GUIDES_FIRST, make_reader, page_id, run_page

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def reader(tmp_path_factory, built_once, minilm_dir, minilm_artifact, task_models, classifier_dir):
    return make_reader(
        tmp_path_factory, built_once, minilm_dir, minilm_artifact, task_models, classifier_dir
    )


@pytest.mark.parametrize("page", GUIDES_FIRST, ids=page_id)
def test_the_page_runs(page, reader):
    run_page(page, reader)
