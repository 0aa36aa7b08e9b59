"""A serving process's collector: start-up's objects frozen, young passes spaced."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.support.heap import OLDER_THRESHOLDS, YOUNG_THRESHOLD, settle_heap

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_settle_heap_freezes_startup_objects_and_spaces_passes() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
