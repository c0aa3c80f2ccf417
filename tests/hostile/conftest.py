"""A real ``receiver serve --role intake`` process for the hostile-input tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.helpers import ReceiverProcess
from tests.support.hostile import intake_config, running


@pytest.fixture(scope="module")
def intake_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReceiverProcess]:
    """One intake process for a whole module."""
    config = intake_config(tmp_path_factory.mktemp("intake"))
    with running(ReceiverProcess(config, role="intake")) as proc:
        yield proc
