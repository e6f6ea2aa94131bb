"""Core leases in one process: core groups planned from a core list, a live holder
refused at once, overlapping plans never sharing a core. Leases across real processes
are tests/servers/test_leases.py."""

import time

import pytest

from neuronserve import cores

# Each child leases from the same directory and reports what it got.


def test_plan_groups():
    assert [g.cores for g in cores.plan_groups([0, 1, 2, 3], 2)] == [(0, 1), (2, 3)]
    assert [g.label for g in cores.plan_groups([4, 5, 6, 7, 8], 2)] == ["4-5", "6-7"]
    with pytest.raises(cores.NoFreeCoreGroup, match="only 2 core"):
        cores.plan_groups([0, 1], 4)


def test_parse_core_list():
    assert cores.parse_core_list("0-2,5") == [0, 1, 2, 5]


def test_a_live_holder_fails_the_next_worker_at_once(tmp_path):
    groups = cores.plan_groups([0], 1)
    with cores.acquire(groups, "cpu", directory=tmp_path):
        t0 = time.monotonic()
        with pytest.raises(cores.NoFreeCoreGroup):
            cores.acquire(groups, "cpu", directory=tmp_path)
        assert time.monotonic() - t0 < 1  # its holder lives: nothing to wait for


def test_overlapping_plans_do_not_share_cores(tmp_path):
    groups_of_one = cores.plan_groups([0, 1], 1)
    groups_of_two = cores.plan_groups([0, 1], 2)
    with (
        cores.acquire(groups_of_one, "cpu", directory=tmp_path),
        pytest.raises(cores.NoFreeCoreGroup),
    ):
        cores.acquire(groups_of_two, "cpu", directory=tmp_path)
