"""The leftover-worker check (tests/helpers/procs.py, run by conftest.py) can fail: a worker
forked by a template whose template is killed is re-parented to the test process and found."""
from __future__ import annotations

import os
import signal

import pytest

from inferris_dist.launcher import fork_workers

from tests.helpers.external import stand_in_template
from tests.helpers.procs import leftover_workers

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]


def test_a_forked_worker_left_behind_is_found(tmp_path):
    template = stand_in_template(tmp_path)
    workers = fork_workers(template, lambda r: [str(r)], b"s3cret", [0], tmp_path)
    pid = workers[0].pid
    try:
        os.kill(template.proc.pid, signal.SIGKILL)      # the template dies without killing its child
        template.proc.wait(10)
        found = leftover_workers(timeout=1.0)
        assert pid in found, f"the orphaned fork {pid} was not found: {found}"
        assert b"inferris_dist.launcher.template" in found[pid]
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)                              # ours now (the subreaper): reap it
        except (ProcessLookupError, ChildProcessError):
            pass
        template.proc = None
        template.close()
    assert pid not in leftover_workers(timeout=10.0)
