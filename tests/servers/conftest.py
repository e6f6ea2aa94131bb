"""Fixtures the server tests share: what a reader of the docs has (tests/docs_pages.py),
made once per docs file."""

from __future__ import annotations

import pytest
from docs_pages import make_reader


@pytest.fixture(scope="module")
def docs_reader(
    tmp_path_factory, built_once, minilm_dir, minilm_artifact, task_models, classifier_dir
):
    return make_reader(
        tmp_path_factory, built_once, minilm_dir, minilm_artifact, task_models, classifier_dir
    )
