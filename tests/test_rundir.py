"""A run's private directory (launcher/rundir.py):

1. a local launch never listens where another user can reach it: under a TMPDIR too long
   for a unix socket path it does not fall back to TCP on loopback; the socket goes to a
   short private directory of ours, or the launch refuses in one line;
2. the sweep of stale run directories judges a run by the lock it holds, not by its pid: a
   sweep from another PID namespace, where every pid of ours looks dead, leaves a live run's
   directory alone;
3. a crashed scheduler's run directory is removed by the next run; the sweep spares live runs
   and names not of ours.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from inferris_dist.launcher import rundir

from tests.helpers.external import CLI, ENV, REPO, Lines, cli, local_launch, long_spec, run_json
from tests.helpers.procs import all_gone, connect_as_nobody, wait_until

pytestmark = [pytest.mark.timeout(60), pytest.mark.procs]

PY = sys.executable


def demo():
    from inferris_dist.engine import load_workload
    return load_workload(REPO / "tests" / "data" / "golden" / "demo.spec.json").with_config(world_size=2)


def long_dir(tmp_path: Path, length: int = 150) -> Path:
    """A directory whose path is `length` characters long (at least 120): a TMPDIR under
    which `inferris-dist-PID-XXXX/s` cannot fit in a unix socket address."""
    base = str(tmp_path)
    d = Path(base + "/" + "t" * max(8, length - len(base) - 1))
    d.mkdir(mode=0o700)
    assert len(str(d)) >= 120
    return d


# -- /proc: what a process listens on ----------------------------------------------------------

def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def tcp_listeners() -> dict[int, str]:
    """Every listening TCP socket on the host (v4 and v6): inode -> local address."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":                                     # TCP_LISTEN
                found[int(f[9])] = f"{table}: {f[1]}"
    return found


def unix_listeners() -> dict[int, str]:
    """Every listening unix socket with a path: inode -> path."""
    found = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and int(f[3], 16) & 0x10000:              # __SO_ACCEPTCON: listening
            found[int(f[6])] = f[7]
    return found


def private_dir_of_ours(d: Path) -> None:
    st = os.lstat(d)
    assert stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode), d
    assert st.st_uid == os.getuid(), d
    assert stat.S_IMODE(st.st_mode) == 0o700, (d, oct(st.st_mode))


# -- 1. a long TMPDIR: never TCP -----------------------------------------------------------------

def test_a_launch_under_a_long_tmpdir_listens_on_no_tcp_port(tmp_path, procs):
    spec = long_spec(tmp_path, 100)
    want = run_json(spec, "--world-size", 2)
    tmpdir = long_dir(tmp_path)
    proc = subprocess.Popen([*CLI, "launch", "--spec", str(spec), "--world-size", "2", "--json",
                             "--fault", "all:delay@0+:0.01"],
                            env={**ENV, "TMPDIR": str(tmpdir)}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    procs.append(proc)
    out = Lines(proc.stdout)
    out.until(r'"step": 5\b', 30)                         # well under way (about 2 s of steps)
    ours = socket_inodes(proc.pid)
    tcp = {i: a for i, a in tcp_listeners().items() if i in ours}
    assert tcp == {}, f"the scheduler listens on TCP: {tcp}"
    unix = [p for i, p in unix_listeners().items() if i in ours]
    assert len(unix) == 1, unix
    path = Path(unix[0])
    assert len(unix[0]) < 108
    private_dir_of_ours(path.parent)
    assert path.parent.parent != tmpdir                   # the short place, not the run directory
    run_dirs = [p for p in tmpdir.iterdir() if p.name.startswith(f"inferris-dist-{proc.pid}-")]
    assert len(run_dirs) == 1                             # the run directory stayed where it was
    private_dir_of_ours(run_dirs[0])
    if os.getuid() == 0:                                  # another user cannot even connect
        assert connect_as_nobody(unix[0]) == "denied"
    rest, err = proc.communicate(timeout=50)
    assert proc.returncode == 0, err.decode()
    got = "\n".join(out.lines + [out.buf.decode()]) + rest.decode()
    assert got.splitlines() == want
    assert not path.parent.exists()                       # removed with the run
    assert not run_dirs[0].exists()


def test_a_process_group_under_a_long_tmpdir_binds_a_short_private_socket(tmp_path, monkeypatch):
    from inferris_dist.scheduler.group import ProcessGroup
    from inferris_dist.scheduler.options import LaunchOptions
    monkeypatch.setattr(tempfile, "tempdir", str(long_dir(tmp_path)))
    workload = demo()
    with ProcessGroup(workload, LaunchOptions(world_size=2)) as group:
        assert group.address.startswith("ipc://"), group.address
        path = group.address[len("ipc://"):]
        assert len(path) <= 100
        private_dir_of_ours(Path(path).parent)
        private_dir_of_ours(group.log_dir)
        assert str(group.log_dir).startswith(tempfile.tempdir)
    rundir.sweep_stale(tempfile.tempdir)                   # a next run in the same process
    assert not Path(path).parent.exists()


def test_without_a_short_private_place_the_launch_refuses_in_one_line(tmp_path):
    tmpdir = long_dir(tmp_path)
    script = ("import sys; import inferris_dist.launcher.rundir as r; r.short_roots = lambda: []; "
              "from inferris_dist.cli.main import main; sys.exit(main(sys.argv[1:]))")
    for extra in ([], ["--json"]):
        done = subprocess.run([PY, "-c", script, "launch", "--world-size", "2", *extra],
                              env={**ENV, "TMPDIR": str(tmpdir)}, cwd=REPO, capture_output=True,
                              text=True, timeout=50)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert "tcp://" not in done.stdout + done.stderr
        said = (done.stdout + done.stderr).strip().splitlines()
        hits = [line for line in said if "too long for a unix socket" in line]
        assert hits, said
        assert "TMPDIR" in hits[0]
    assert [p.name for p in tmpdir.iterdir()] == []        # nothing left behind


def test_short_private_directories_are_checked(tmp_path):
    run = rundir.make_run_dir(long_dir(tmp_path))
    try:
        with pytest.raises(OSError, match="too long for a unix socket"):
            rundir.socket_path(run, "s", 100, roots=[str(tmp_path / ("x" * 120))])
        open_dir = tmp_path / "open"                       # writable by all, not sticky: refused
        open_dir.mkdir()
        open_dir.chmod(0o777)
        with pytest.raises(OSError, match="too long for a unix socket"):
            rundir.socket_path(run, "s", 100, roots=[str(open_dir)])
        short = Path(tempfile.mkdtemp(prefix="ifd-", dir="/tmp"))   # short, whatever tmp_path is
        link = short / "link"                              # a symlink is followed to where it leads
        link.symlink_to(short)
        path = rundir.socket_path(run, "s", 400, roots=[str(link)])
        assert path.parent == run                          # short enough: in the run directory
        path = rundir.socket_path(run, "s", 100, roots=[str(link)])
        assert path.parent.parent == short
        private_dir_of_ours(path.parent)
        assert rundir.socket_path(run, "s", 100) == path   # asked again: the same place
    finally:
        rundir.remove_run_dir(run)
    assert not run.exists() and not path.parent.exists()
    shutil.rmtree(short)


# -- 2. liveness is a lock, not a pid ------------------------------------------------------------

SWEEP = "import sys; from inferris_dist.launcher.rundir import sweep_stale; print(sweep_stale(sys.argv[1]))"


def sweep_in_new_pid_namespace(root: Path) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(["unshare", "-p", "-f", "--mount-proc", PY, "-c", SWEEP, str(root)],
                              cwd=REPO, env=ENV, capture_output=True, text=True, timeout=30)
    except OSError as e:
        pytest.skip(f"unshare: {e}")
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"cannot make a PID namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return done


def test_a_live_runs_directory_survives_a_sweep_from_another_pid_namespace(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = rundir.make_run_dir()
    try:
        assert live.parent == tmp_path
        (live / "rank0.log").write_text("still needed")
        done = sweep_in_new_pid_namespace(tmp_path)
        assert live.exists(), f"swept from another PID namespace: {done.stdout}"
        assert (live / "rank0.log").exists()
    finally:
        rundir.remove_run_dir(live)
    assert not live.exists()


def test_a_live_process_groups_directory_survives_it_too(tmp_path, monkeypatch):
    from inferris_dist.scheduler.group import ProcessGroup
    from inferris_dist.scheduler.options import LaunchOptions
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    workload = demo()
    with ProcessGroup(workload, LaunchOptions(world_size=2)) as group:
        sweep_in_new_pid_namespace(tmp_path)
        assert group.log_dir.exists()
        assert Path(group.address[len("ipc://"):]).exists()   # in the run directory, or a short one
        group.restart([1], [], 0)                         # the socket is still there to join
        assert group.dead_ranks() == set()


def test_a_directory_whose_holder_was_killed_is_swept(tmp_path):
    holder = subprocess.Popen(
        [PY, "-c", "import time; from inferris_dist.launcher.rundir import make_run_dir; "
                   "print(make_run_dir(), flush=True); time.sleep(60)"],
        cwd=REPO, env={**ENV, "TMPDIR": str(tmp_path)}, stdout=subprocess.PIPE, text=True)
    try:
        made = Path(holder.stdout.readline().strip())
        assert made.parent == tmp_path and made.is_dir()
        assert rundir.sweep_stale(tmp_path) == []          # its holder lives: kept
        assert made.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    assert rundir.sweep_stale(tmp_path) == [made]
    assert not made.exists()


@pytest.mark.parametrize("use_template", [True, False])
def test_no_worker_or_template_holds_the_runs_lock(tmp_path, monkeypatch, use_template):
    """flock locks belong to the open file: a worker or template that inherited the lock's fd
    would keep a dead scheduler's directory locked. Only the scheduler holds it."""
    from inferris_dist.scheduler.group import ProcessGroup
    from inferris_dist.scheduler.options import LaunchOptions
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    workload = demo()
    with ProcessGroup(workload, LaunchOptions(world_size=2, use_template=use_template)) as group:
        lock = str(group.log_dir / rundir.LOCK)
        pids = [p for ps in group.rank_pids.values() for p in ps]
        template = getattr(group.members, "template", None)
        if use_template:
            assert template is not None
            pids.append(template.pid)
        assert len(pids) >= 2
        holders = []
        for pid in pids + [os.getpid()]:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    if os.readlink(fd) == lock:
                        holders.append(pid)
                except OSError:
                    pass
        assert holders == [os.getpid()]


def test_a_killed_scheduler_leaves_a_directory_the_next_sweep_removes(tmp_path, procs):
    spec = long_spec(tmp_path, 100)
    proc = subprocess.Popen([*CLI, "launch", "--spec", str(spec), "--world-size", "2",
                             "--fault", "all:delay@0+:0.01"],
                            env={**ENV, "TMPDIR": str(tmp_path)}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    procs.append(proc)
    Lines(proc.stdout).until(r"rank workers up in", 30)
    run_dir = next(p for p in tmp_path.iterdir() if p.name.startswith(f"inferris-dist-{proc.pid}-"))
    assert rundir.sweep_stale(tmp_path) == []              # alive: kept
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    # its workers die with it; then nothing holds the lock
    assert wait_until(lambda: rundir.sweep_stale(tmp_path) == [run_dir], 10)
    assert not run_dir.exists()


def test_old_style_directories_are_judged_by_pid(tmp_path):
    live = tmp_path / f"inferris-dist-{os.getpid()}-abcdefgh"
    dead = tmp_path / f"inferris-dist-{2 ** 22 + 12345}-abcdefgh"
    for d in (live, dead):
        d.mkdir()
    assert rundir.sweep_stale(tmp_path) == [dead]
    assert live.exists()


def test_a_new_style_directory_without_its_lock_is_left_alone(tmp_path):
    """Being made (the lock is put in place already held) or broken by hand: never judged by pid."""
    d = tmp_path / f"inferris-dist-{2 ** 22 + 12345}-abcdefgh{rundir.SUFFIX}"
    d.mkdir()
    assert rundir.sweep_stale(tmp_path) == []
    assert d.exists()


# -- 3. a crashed scheduler's run directory ------------------------------------------------------

def test_a_killed_schedulers_run_directory_is_swept_by_the_next_run(tmp_path, procs):
    proc, address = local_launch(["--spec", long_spec(tmp_path), "--world-size", 2,
                                  "--fault", "all:delay@0+:0.01"])
    procs.append(proc)
    run_dir = Path(address[len("ipc://"):]).parent
    assert run_dir.name.startswith(f"inferris-dist-{proc.pid}-")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert run_dir.exists()                               # nobody could remove it
    assert not all_gone(proc.pids, 5)                     # its workers died with it
    done = cli("launch", "--world-size", 1)
    assert done.returncode == 0
    assert not run_dir.exists()


def test_sweeping_spares_live_runs_and_other_names(tmp_path):
    live = tmp_path / f"inferris-dist-{os.getpid()}-abc"
    dead_pid = 2 ** 22 + 12345                            # beyond pid_max: never alive
    dead = tmp_path / f"inferris-dist-{dead_pid}-abc"
    other = tmp_path / "inferris-dist-xyz"
    for d in (live, dead, other):
        d.mkdir()
    assert rundir.sweep_stale(tmp_path) == [dead]
    assert live.exists() and other.exists() and not dead.exists()
