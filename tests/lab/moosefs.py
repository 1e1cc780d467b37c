"""A real distributed file system for the lab: MooseFS 3.0, started and stopped by the tests.

MooseFS splits the roles as Lustre does: a metadata master (Lustre's MDS), data servers
called chunkservers (OSSs) and FUSE clients with their own data and metadata caches
(``mfsmount``). A :class:`MooseFS` runs here:

- a network namespace of its own (MooseFS refuses loopback addresses): a veth pair
  with 10.77.0.1 and 10.77.0.2, both ends inside, nothing added to the machine's own;
- the master, on 10.77.0.1, its metadata on the machine's disk (it is not lost in
  the trials: a metadata server with its own durable storage);
- ``servers`` chunkservers, each a process tree of its own whose data directory is a
  ``nodecache`` mount (tests/lab/nodecache.c) of its disk under ``<root>/moosefs``:
  :meth:`lose_data_server` kills one with everything it had not fsync'd and starts a
  fresh one on the same disk. Chunkservers fsync a chunk when they close it
  (``HDD_FSYNC_BEFORE_CLOSE = 1``); every file is kept on ``goal`` chunkservers;
- one client per lab node, started by the node itself (:meth:`client_command`): what a
  node wrote and did not fsync stays in its ``mfsmount`` write cache, lost with the
  node. Clients do not flush at close (``mfsfsyncmintime``): only an fsync makes data
  leave the node, as on Lustre;
- a client of the machine at ``<root>/view`` with every cache off: what the file
  system holds, as a fresh client sees it.

Needs root, ``ip``, the MooseFS packages (``make install``) and the built nodecache.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import time
from pathlib import Path

MASTER_ADDRESS = "10.77.0.1"
PEER_ADDRESS = "10.77.0.2"
START_TIMEOUT = 20.0
MIN_FREE_BYTES = 1 << 30  # the space the file system must report before a test uses it
PROGRAMS = ("mfsmaster", "mfschunkserver", "mfsmount", "mfscheckfile", "mfssetgoal", "mfssettrashtime", "ip")
# the nodes' clients: no flush at close; a lost chunkserver is retried a while (seconds)
CLIENT_OPTIONS = "allow_other,mfsfsyncmintime=86400,mfsioretries=60"
# the machine's view: no data, attribute or directory-entry cache
VIEW_OPTIONS = (
    "mfscachemode=DIRECT,mfsattrcacheto=0,mfsentrycacheto=0,mfsdirentrycacheto=0,mfsnegentrycacheto=0"
)
_COUNTER = itertools.count(1)


class MooseFSError(RuntimeError):
    """The file system did not start or stop as asked."""


def moosefs_unavailable() -> str | None:
    """Why MooseFS cannot run here, or None."""
    for program in PROGRAMS:
        if shutil.which(program) is None:
            return f"{program} is not installed (run `make install`: MooseFS comes from apt)"
    if not Path("/var/lib/mfs/metadata.mfs.empty").exists():
        return "/var/lib/mfs/metadata.mfs.empty is missing (the moosefs-master package)"
    return None


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs)


class _Tree:
    """A process tree in its own session, killed at once by :meth:`kill`."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, 9)
        except ProcessLookupError:
            pass
        self.process.wait()


class MooseFS:
    """A MooseFS cluster under ``root`` (see the module docstring). Start with :meth:`start`."""

    def __init__(self, root: Path, nodecache: Path, *, servers: int = 2, goal: int = 2) -> None:
        self.root = root / "moosefs"
        self.view = root / "view"
        self.nodecache = nodecache
        self.servers = servers
        self.goal = goal
        self.netns = f"hpckpt-lab-{os.getpid()}-{next(_COUNTER)}"
        self._netns_made = False
        self._master: _Tree | None = None
        self._data_servers: dict[int, _Tree] = {}
        self._view_mounted = False

    # --- start and stop ------------------------------------------------------------------

    def start(self) -> None:
        """Start the network namespace, the master, the chunkservers and the machine's view;
        return once a file written with fsync has ``goal`` copies."""
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "master").mkdir(parents=True)
        self.view.mkdir(parents=True, exist_ok=True)
        self._make_netns()
        shutil.copy("/var/lib/mfs/metadata.mfs.empty", self.root / "master" / "metadata.mfs")
        (self.root / "exports.cfg").write_text("* / rw,alldirs,maproot=0:0\n")
        master_cfg = self.root / "master.cfg"
        master_cfg.write_text(
            "WORKING_USER = root\nWORKING_GROUP = root\n"
            f"DATA_PATH = {self.root / 'master'}\nEXPORTS_FILENAME = {self.root / 'exports.cfg'}\n"
            + "".join(f"{name}_LISTEN_HOST = {MASTER_ADDRESS}\n" for name in ("MATOML", "MATOCS", "MATOCL"))
        )
        master = self.in_netns(["mfsmaster", "-c", str(master_cfg), "-f"])
        self._master = _Tree(master, self.root / "master.log")
        for index in range(1, self.servers + 1):
            self._start_data_server(index)
        self._mount_view()
        self._wait_ready()

    def close(self) -> None:
        """Stop everything and remove the network namespace (the data stays under root)."""
        if self._view_mounted:
            subprocess.run(["umount", "--lazy", str(self.view)], check=False, capture_output=True)
            self._view_mounted = False
        for tree in self._data_servers.values():
            tree.kill()
        self._data_servers = {}
        if self._master is not None:
            self._master.kill()
            self._master = None
        if self._netns_made:
            subprocess.run(["ip", "netns", "del", self.netns], check=False, capture_output=True)
            self._netns_made = False

    def _make_netns(self) -> None:
        _run(["ip", "netns", "add", self.netns])
        self._netns_made = True
        for command in (
            "ip link set lo up",
            "ip link add v0 type veth peer name v1",
            f"ip addr add {MASTER_ADDRESS}/24 dev v0",
            f"ip addr add {PEER_ADDRESS}/24 dev v1",
            "ip link set v0 up",
            "ip link set v1 up",
        ):
            _run(["ip", "netns", "exec", self.netns, *command.split()])

    def in_netns(self, command: list[str]) -> list[str]:
        """``command`` run in the file system's network namespace (and nothing else of it)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *command]

    def _start_data_server(self, index: int) -> None:
        """Chunkserver ``index``: its data directory is its own nodecache over its disk."""
        home = self.root / f"cs{index}"
        disk, data, var = home / "disk", home / "data", home / "var"
        for directory in (disk, data, var):
            directory.mkdir(parents=True, exist_ok=True)
        (home / "hdd.cfg").write_text(f"{data}\n")
        cfg = home / "cs.cfg"
        cfg.write_text(
            "WORKING_USER = root\nWORKING_GROUP = root\n"
            f"DATA_PATH = {var}\nHDD_CONF_FILENAME = {home / 'hdd.cfg'}\n"
            f"MASTER_HOST = {MASTER_ADDRESS}\nCSSERV_LISTEN_HOST = {PEER_ADDRESS}\n"
            f"CSSERV_LISTEN_PORT = {9430 + index}\nHDD_FSYNC_BEFORE_CLOSE = 1\n"
        )
        script = (
            f"{self.nodecache} {disk} {data} -f -o allow_other & "
            f"until grep -q ' {data} ' /proc/self/mountinfo; do sleep 0.02; done; "
            f"exec mfschunkserver -c {cfg} -f"
        )
        command = self.in_netns(["unshare", "--mount", "--propagation", "private", "bash", "-c", script])
        self._data_servers[index] = _Tree(command, self.root / f"cs{index}.log")

    def _mount_view(self) -> None:
        self.mount(self.view, VIEW_OPTIONS)
        self._view_mounted = True

    def mount(self, mountpoint: Path, options: str = CLIENT_OPTIONS) -> None:
        """Mount a client of the machine at ``mountpoint`` (``umount`` it when done),
        retrying while the master starts to listen."""
        command = self.in_netns(["mfsmount", str(mountpoint), "-H", MASTER_ADDRESS, "-o", options])
        log = self.root / "mounts.log"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            with open(log, "ab") as out:  # the daemon keeps no pipe of ours open
                done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            if done.returncode == 0:
                return
            time.sleep(0.2)
        raise MooseFSError(
            f"a client did not mount at {mountpoint} within {START_TIMEOUT} s: {log.read_text()[-2000:]}"
        )

    def _wait_ready(self) -> None:
        """Wait until a probe file written with fsync has ``goal`` valid copies and the file
        system reports free space; set the goal of everything and a trash time of 0
        (deleted files free their chunks at once)."""
        in_netns = self.in_netns
        _run(in_netns(["mfssetgoal", "-r", str(self.goal), str(self.view)]))
        _run(in_netns(["mfssettrashtime", "-r", "0", str(self.view)]))
        probe = self.view / ".probe"
        deadline = time.monotonic() + START_TIMEOUT
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with open(probe, "wb") as handle:
                    handle.write(b"probe")
                    handle.flush()
                    os.fsync(handle.fileno())
                last = _run(in_netns(["mfscheckfile", str(probe)])).stdout
                space = os.statvfs(self.view)
                free = space.f_bavail * space.f_frsize  # reported by the master a moment after registration
                if f"chunks with {self.goal} cop" in last and free >= MIN_FREE_BYTES:
                    probe.unlink()
                    return
                last += f"; {free} bytes free"
            except (OSError, subprocess.CalledProcessError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise MooseFSError(f"MooseFS did not keep {self.goal} copies within {START_TIMEOUT} s: {last}")

    def _check_alive(self) -> None:
        trees = {"master": self._master, **{f"cs{i}": tree for i, tree in self._data_servers.items()}}
        for name, tree in trees.items():
            if tree is not None and not tree.alive():
                log = tree.log.read_text(errors="replace")[-2000:]
                raise MooseFSError(f"MooseFS {name} exited {tree.process.returncode}:\n{log}")

    # --- the lab's use -------------------------------------------------------------------

    def client_command(self, mountpoint: Path) -> str:
        """The shell command a node runs (in the background) to mount its own client."""
        return " ".join(
            self.in_netns(["mfsmount", str(mountpoint), "-f", "-H", MASTER_ADDRESS, "-o", CLIENT_OPTIONS])
        )

    def lose_data_server(self, index: int) -> None:
        """Chunkserver ``index`` loses power: it and its cache die (what it had not fsync'd
        is gone); a fresh one starts on the same disk."""
        self._data_servers[index].kill()
        self._start_data_server(index)
