"""Core leases across real processes: distinct groups, a clear error naming the workers and
their deployment when none is free, a group freed by a killed process is leased again, a
replacement that waits for a group a dead worker's child still holds, a pinned process's
affinity and threads. The lease rules that need no second process are
tests/unit/test_cores.py."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

from neuronserve import cores


def _lease_and_wait(directory, cpw, n_cores, conn, owner="test", deployment=None):
    if deployment:
        os.environ[cores.DEPLOYMENT_ENV] = deployment
    groups = cores.plan_groups(list(range(n_cores)), cpw)
    try:
        lease = cores.acquire(groups, "cpu", owner=owner, directory=directory)
        conn.send(("ok", lease.group.index, lease.cores))
    except cores.NoFreeCoreGroup as e:
        conn.send(("error", str(e), None))
        return
    # Hold the lease until the parent says so. A pipe, not an Event: a child killed
    # while waiting on an Event can leave its lock held and hang the parent.
    conn.poll(60)


def _spawn(directory, cpw, n_cores, owner="test", deployment=None):
    parent, child = mp.Pipe()
    p = mp.get_context("fork").Process(
        target=_lease_and_wait, args=(directory, cpw, n_cores, child, owner, deployment)
    )
    p.start()
    assert parent.poll(30), "child did not report its lease"
    p.conn = parent
    return p, parent.recv()


def _release(procs):
    for p in procs:
        with contextlib.suppress(OSError):  # killed already
            p.conn.send("release")
        p.join(10)


def test_leases_are_distinct_and_extra_worker_fails(tmp_path):
    procs = []
    try:
        results = []
        for _ in range(2):
            p, r = _spawn(tmp_path, 2, 4)
            procs.append(p)
            results.append(r)
        assert [r[0] for r in results] == ["ok", "ok"]
        assert sorted(r[2] for r in results) == [(0, 1), (2, 3)]
        p, third = _spawn(tmp_path, 2, 4)
        procs.append(p)
        assert third[0] == "error"
        assert "2 group(s) of 2 core(s)" in third[1]
        assert "Run at most 2 worker(s)" in third[1]
        assert "cores_per_worker" in third[1]
        assert f"pid {procs[0].pid}" in third[1]  # names who holds the groups
    finally:
        _release(procs)


def test_a_full_host_names_the_workers_and_whose_deployment_they_serve(tmp_path):
    """The message a worker that finds no free group logs: which model and process holds
    each group, whether it belongs to this deployment or another, and what to do."""
    procs = []
    try:
        p, _ = _spawn(tmp_path, 1, 2, "torchserve:art", "/runs/earlier")
        procs.append(p)
        q, _ = _spawn(tmp_path, 1, 2, "torchserve:minilm", "/runs/now")
        procs.append(q)
        r, other = _spawn(tmp_path, 1, 2, "torchserve:minilm", "/runs/now")
        procs.append(r)
        assert other[0] == "error"
        msg = other[1]
        assert (
            f"pid {p.pid} (torchserve:art) of another deployment (run directory /runs/earlier)"
            in msg
        )
        assert f"pid {q.pid} (torchserve:minilm) of this deployment" in msg
        assert "Stop the other deployment(s) (/runs/earlier" in msg
        _release(procs[2:])
        # only this deployment's workers: more workers than groups, one model per group
        s, _ = _spawn(tmp_path / "b", 1, 2, "torchserve:art", "/runs/now")
        t, _ = _spawn(tmp_path / "b", 1, 2, "torchserve:minilm", "/runs/now")
        procs[2:] = [s, t]
        u, mine = _spawn(tmp_path / "b", 1, 2, "torchserve:minilm", "/runs/now")
        procs.append(u)
        assert "of another deployment" not in mine[1] and "Run at most 2 worker(s)" in mine[1]
        assert "Every model of a deployment starts its own workers" in mine[1]
    finally:
        _release(procs)


def test_killed_holder_frees_its_group(tmp_path):
    a, ra = _spawn(tmp_path, 1, 2)
    b, rb = _spawn(tmp_path, 1, 2)
    procs = [a, b]
    try:
        assert {ra[2], rb[2]} == {(0,), (1,)}
        os.kill(a.pid, signal.SIGKILL)
        a.join(10)
        c, rc = _spawn(tmp_path, 1, 2)
        procs.append(c)
        assert rc[0] == "ok" and rc[2] == ra[2]  # the replacement gets the freed group
    finally:
        _release(procs)


def test_pin_cpu_sets_affinity_and_threads():
    def child(conn):
        import torch

        cores.pin_cpu((0,))
        conn.send(
            (
                sorted(os.sched_getaffinity(0)),
                torch.get_num_threads(),
                os.environ["OMP_NUM_THREADS"],
            )
        )

    parent, c = mp.Pipe()
    p = mp.get_context("fork").Process(target=child, args=(c,))
    p.start()
    assert parent.poll(60)
    assert parent.recv() == ([0], 1, "1")
    p.join(10)


def test_a_replacement_waits_for_a_group_whose_holder_died(tmp_path):
    groups = cores.plan_groups([0], 1)
    dead = subprocess.Popen(["true"])  # a process that has exited: its pid names nobody
    dead.wait()
    # the lock still held after its recorded holder died (a child of a killed worker
    # keeping the descriptor while it exits): held here for 1.5 s by another process
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.ftruncate(fd, 0); os.write(fd, ('{\"pid\": %s}' % sys.argv[2]).encode())\n"
            "print('held', flush=True); time.sleep(1.5)\n",
            str(tmp_path / "cpu-core-0.lock"),
            str(dead.pid),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    with cores.acquire(groups, "cpu", directory=tmp_path):
        waited = time.monotonic() - t0
    holder.wait(10)
    assert 0.5 < waited < cores.RELEASE_WAIT_S  # waited for the release instead of failing
