"""Simulated nodes on one machine, sharing a file system through per-node caches.

A :class:`Lab` starts N nodes. Each node is a process tree in its own mount, UTS and
PID namespaces (``unshare``), with its own hostname (``node1``, ``node2``, ...), its own
tmpfs on ``/dev/shm`` and its own client cache of the shared file system: a
``nodecache`` FUSE mount of ``<root>/disk`` at ``<root>/pfs``, the same path on every
node. What a node wrote but did not fsync lives only in its cache and is gone when the
node dies. The host sees ``<root>/disk``: what a power loss leaves.

MPI jobs span the nodes through an ssh-like launcher (``nodeexec``) that enters a node:
MPICH's ``mpiexec -launcher-exec``, Open MPI's ``--mca plm_rsh_agent``. MPI traffic
goes over loopback (MPICH, UCX over TCP) or the machine's own address (Open MPI's
out-of-band channel refuses loopback alone); nothing leaves the machine.

Faults: :meth:`Job.kill_rank` (SIGKILL), :meth:`Job.stop_rank` (SIGSTOP),
:meth:`Lab.lose_node` (every process of the node, its ``/dev/shm`` and its unsynced
writes; a fresh node of the same name replaces it), :meth:`Lab.power_loss` (every
node); storage faults of one node: :meth:`Lab.freeze_storage` / :meth:`Lab.thaw_storage`
(its cache process stopped: every file operation through its ``pfs`` waits in the
kernel, as on a stuck OST) and :meth:`Lab.fail_writes` (its writes and fsyncs fail with
EIO). ``Lab(..., disk_size="8m")`` puts the disk on a tmpfs that small, so that a
test can fill it (ENOSPC). A job can stop one of its ranks at a named save/restore point
(``HPCKPT_FAULT=POINT:RANK:stop[:NTH]``); :meth:`Job.wait_stopped` returns it, so the
fault lands at exactly that point. Every fault is recorded in :attr:`Lab.events`.

Needs root (namespaces, FUSE). See docs/lab.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.lab.moosefs import MooseFS, moosefs_unavailable

REPO = Path(__file__).resolve().parents[2]
NODECACHE = REPO / "build" / "lab" / "nodecache"
UCX_NO_DISCONNECT = REPO / "build" / "lab" / "ucx_no_disconnect.so"  # see ucx_no_disconnect.c
NODEEXEC = Path(__file__).resolve().parent / "nodeexec"
ROOT_ENV = "HPCKPT_LAB_ROOT"
JOB_ENV = "HPCKPT_LAB_JOB"
START_TIMEOUT = 10.0
LEASE_ENV = "HPCKPT_LOCK_LEASE"


class LabError(RuntimeError):
    """The lab could not do what was asked (no root, no nodecache build, a node did not start)."""


FILESYSTEMS = ("nodecache", "moosefs")


def lab_unavailable(filesystem: str = "nodecache") -> str | None:
    """Why a lab on ``filesystem`` cannot run here, or None."""
    if os.geteuid() != 0:
        return "the lab needs root (namespaces and FUSE mounts)"
    for built in (NODECACHE, UCX_NO_DISCONNECT):
        if not built.exists():
            return f"{built} is not built (run `make install`)"
    for tool in ("unshare", "nsenter", "mpiexec"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing"
    if filesystem == "moosefs":
        return moosefs_unavailable()
    return None


def thread_states(pid: int) -> list[str]:
    """The scheduler state of each thread of process ``pid`` (``"T"``: stopped)."""
    states = []
    for thread in Path(f"/proc/{pid}/task").iterdir():
        try:  # a thread may end between the listing and the read
            states.append((thread / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue
    return states


@dataclass
class Event:
    """One injected fault: what, on which node and rank, and when (monotonic seconds)."""

    kind: str
    node: str
    rank: int | None = None
    point: str | None = None
    at: float = field(default_factory=time.monotonic)


class Node:
    """One simulated node: an ``unshare`` process tree (see the module docstring)."""

    def __init__(self, lab: Lab, index: int) -> None:
        self.lab = lab
        self.index = index
        self.name = name = f"node{index}"
        self.tmp = lab.root / "nodes" / f"{name}.tmp"  # the node's TMPDIR (see nodeexec)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        # distinct process ids on every node, kept by a replacement
        self.first_pid = first_pid = 100000 * index
        # while this file exists, the node's writes and fsyncs to pfs fail with EIO (nodecache.c)
        self.fail_file = lab.root / "nodes" / f"{name}.fail-writes"
        self.fail_file.unlink(missing_ok=True)
        if lab.moosefs is not None:
            client = lab.moosefs.client_command(lab.pfs)
        else:
            client = (
                f"NODECACHE_FAIL_WRITES={self.fail_file} {NODECACHE} {lab.disk} {lab.pfs} -f -o allow_other"
            )
        script = (
            f"hostname {name} && mount -t tmpfs -o size={lab.shm_size} tmpfs /dev/shm && "
            f"echo {first_pid} > /proc/sys/kernel/ns_last_pid && "
            f"{client} > {lab.root}/{name}.client.log 2>&1 & "
            "exec sleep infinity"
        )
        self._unshare = subprocess.Popen(
            [
                "unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                "bash", "-c", script,
            ],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.init_pid = self._wait_for_init()
        self._wait_for_mount()
        self.cache_pid = self._find_cache()
        self.frozen = False
        (lab.root / "nodes" / f"{name}.pid").write_text(str(self.init_pid))

    def _wait_for_init(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children")
            try:
                pids = children.read_text().split()
            except OSError:
                pids = []
            if pids:
                return int(pids[0])
            if self._unshare.poll() is not None:
                raise LabError(f"node {self.name} did not start: unshare exited {self._unshare.returncode}")
            time.sleep(0.02)
        raise LabError(f"node {self.name} did not start within {START_TIMEOUT} s")

    def _wait_for_mount(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        mounts = Path(f"/proc/{self.init_pid}/mountinfo")
        while time.monotonic() < deadline:
            if f" {self.lab.pfs} " in mounts.read_text():
                return
            time.sleep(0.02)
        log = (self.lab.root / f"{self.name}.client.log").read_text(errors="replace")
        raise LabError(
            f"node {self.name}: the shared file system was not mounted within {START_TIMEOUT} s: {log}"
        )

    def _find_cache(self) -> int:
        """The host process id of the node's file-system client, ``nodecache`` or ``mfsmount``
        (a descendant of its first process)."""
        pending = [self.init_pid]
        while pending:
            pid = pending.pop()
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            if command == str(NODECACHE).encode() or command.startswith(b"mfsmount"):  # it renames itself
                return pid
            pending.extend(map(int, children))
        raise LabError(f"node {self.name}: no file-system client process found")

    def signal_cache(self, signum: int, state: str | None) -> None:
        """Send ``signum`` to the node's cache process; wait until its state is ``state``
        (``"T"``: stopped; None: not stopped) so that the fault has landed on return."""
        os.kill(self.cache_pid, signum)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if all((now == "T") == (state == "T") for now in thread_states(self.cache_pid)):
                return
            time.sleep(0.005)
        raise LabError(f"node {self.name}: its nodecache did not {'stop' if state else 'continue'}")

    def run(self, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``command`` inside this node (in the caller's working directory)."""
        enter = [
            "nsenter", "-t", str(self.init_pid), "--mount", "--uts", "--pid", f"--wd={os.getcwd()}", "--"
        ]
        return subprocess.run(enter + command, **kwargs)

    def owns(self, pid: int) -> bool:
        """Whether process ``pid`` runs inside this node."""
        try:
            return os.stat(f"/proc/{pid}/ns/uts").st_ino == os.stat(f"/proc/{self.init_pid}/ns/uts").st_ino
        except OSError:
            return False

    def destroy(self) -> None:
        """Kill every process of the node at once: its cache and ``/dev/shm`` go with it.

        Only the node's first process is killed: ``unshare`` reaps it and exits (killed
        too, the orphan would wait for the machine's init to reap it, a second or more).
        """
        try:
            os.kill(self.init_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self._unshare.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._unshare.kill()
            self._unshare.wait()


class Lab:
    """N simulated nodes sharing ``pfs`` (see the module docstring). A context manager."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        nodes: int = 2,
        *,
        shm_size: str = "512m",
        disk_size: str | None = None,
        filesystem: str = "nodecache",
    ) -> None:
        reason = lab_unavailable(filesystem)
        if reason:
            raise LabError(reason)
        self.root = Path(root).resolve()
        self.filesystem = filesystem
        self.moosefs = MooseFS(self.root, NODECACHE) if filesystem == "moosefs" else None
        self.disk = self.moosefs.view if self.moosefs else self.root / "disk"
        self.pfs = self.root / "pfs"
        self.shm_size = shm_size
        for directory in (self.disk, self.pfs, self.root / "nodes"):
            directory.mkdir(parents=True, exist_ok=True)
        self.events: list[Event] = []
        self.nodes: dict[str, Node] = {}
        self._jobs = 0
        self._disk_mounted = False
        try:
            if self.moosefs is not None:
                self.moosefs.start()
            if disk_size is not None:  # a small disk, to be filled (ENOSPC); every node sees this tmpfs
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={disk_size}", "tmpfs", str(self.disk)],
                    check=True, capture_output=True, text=True,
                )
                self._disk_mounted = True
            for index in range(1, nodes + 1):
                node = Node(self, index)
                self.nodes[node.name] = node
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroy every node (frozen storage thawed first, so that its waiting writes end);
        unmount a small disk."""
        for node in self.nodes.values():
            if node.frozen:
                self.thaw_storage(node.name)
            node.destroy()
        self.nodes = {}
        if self.moosefs is not None:
            self.moosefs.close()
        if self._disk_mounted:
            subprocess.run(["umount", "--lazy", str(self.disk)], check=False)
            self._disk_mounted = False

    # --- jobs -------------------------------------------------------------------------------

    def open_mpi(
        self, mpiexec: str, command: list[str], ranks_per_node: int = 2, flags: tuple[str, ...] = ()
    ) -> list[str]:
        """An Open MPI ``mpiexec`` command line (the ULFM environment's) across the nodes.

        Ranks fill the nodes in order (``ppr:N:node``); oversubscription is allowed so
        that replacements for a lost node's ranks can be spawned on the others.
        """
        hosts = ",".join(f"{name}:{ranks_per_node}" for name in self.nodes)
        return [
            mpiexec, "--mca", "plm_rsh_agent", str(NODEEXEC), "--host", hosts,
            "--map-by", f"ppr:{ranks_per_node}:node:OVERSUBSCRIBE",
            "-n", str(ranks_per_node * len(self.nodes)),
            *flags, *command,
        ]

    def mpiexec(self, command: list[str], ranks_per_node: int = 2) -> list[str]:
        """An MPICH ``mpiexec`` command line running ``command`` across the nodes."""
        hosts = ",".join(f"{name}:{ranks_per_node}" for name in self.nodes)
        return [
            "mpiexec", "-launcher", "ssh", "-launcher-exec", str(NODEEXEC), "-hosts", hosts,
            "-n", str(ranks_per_node * len(self.nodes)),
            "-genv", "UCX_TLS", "tcp", "-genv", "UCX_NET_DEVICES", "lo",
            "-genv", "LD_PRELOAD", str(UCX_NO_DISCONNECT),
            *command,
        ]

    def start(self, command: list[str], env: dict[str, str] | None = None) -> Job:
        """Start ``command`` (an ``mpiexec`` line, or ``hpckpt run -- mpiexec ...``) on the host."""
        self._jobs += 1
        job_id = f"{os.getpid()}-{self._jobs}"
        # a relaunch on fresh nodes waits out the lock's lease of its predecessor: a short one here
        environment = {LEASE_ENV: "3", **os.environ, **(env or {}), ROOT_ENV: str(self.root), JOB_ENV: job_id}
        environment.pop("HPCKPT_RANKS_PER_NODE", None)
        process = subprocess.Popen(
            command,
            cwd=self.pfs,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        return Job(self, job_id, process)

    def run(self, command: list[str], env: dict[str, str] | None = None, timeout: float = 50) -> Job:
        """Run ``command`` to its end (see :meth:`start`); a timeout kills the whole job."""
        job = self.start(command, env)
        job.finish(timeout)
        return job

    # --- faults -----------------------------------------------------------------------------

    def node_of(self, pid: int) -> str:
        """The node process ``pid`` runs on."""
        for name, node in self.nodes.items():
            if node.owns(pid):
                return name
        raise LabError(f"process {pid} runs on no lab node")

    def lose_node(
        self, name: str, *, replace: bool = True, rank: int | None = None, point: str | None = None
    ) -> None:
        """Node ``name`` dies: every process, its ``/dev/shm``, its unsynced writes.

        With ``replace``, a fresh node of the same name (empty ``/dev/shm``, empty
        cache) takes its place, as a rebooted or spare node would.
        """
        self.events.append(Event("node loss", name, rank, point))
        self.nodes[name].destroy()
        if replace:
            self.nodes[name] = Node(self, self.nodes[name].index)

    def power_loss(self, *, rank: int | None = None, point: str | None = None) -> None:
        """Every node loses power at once; all come back empty."""
        self.events.append(Event("power loss", "all", rank, point))
        for node in self.nodes.values():
            node.destroy()
        for name in list(self.nodes):
            self.nodes[name] = Node(self, self.nodes[name].index)

    def lose_data_server(self, index: int) -> None:
        """MooseFS chunkserver ``index`` loses power (see :meth:`MooseFS.lose_data_server`)."""
        if self.moosefs is None:
            raise LabError("only a lab on MooseFS has data servers")
        self.events.append(Event("data server loss", f"cs{index}"))
        self.moosefs.lose_data_server(index)

    def freeze_storage(self, name: str) -> None:
        """Node ``name``'s storage stops answering: its cache process is stopped (SIGSTOP),
        so every file operation through its ``pfs`` (a write, an fsync, an open, a stat)
        waits in the kernel until :meth:`thaw_storage`, as on a stuck Lustre OST. The other
        nodes and the disk go on. Returns once the cache process has stopped."""
        node = self.nodes[name]
        self.events.append(Event("storage freeze", name))
        node.signal_cache(signal.SIGSTOP, "T")
        node.frozen = True

    def thaw_storage(self, name: str) -> None:
        """Node ``name``'s storage answers again (SIGCONT): the waiting operations go on."""
        node = self.nodes[name]
        self.events.append(Event("storage thaw", name))
        node.signal_cache(signal.SIGCONT, None)
        node.frozen = False

    def fail_writes(self, name: str, on: bool = True) -> None:
        """From now on (``on``) or no longer, every write and fsync through node ``name``'s
        ``pfs`` fails with EIO; reads and metadata operations go on."""
        if self.moosefs is not None:
            raise LabError("write errors are injected by nodecache only, not on MooseFS")
        fail_file = self.nodes[name].fail_file
        self.events.append(Event("write errors" if on else "write errors end", name))
        if on:
            fail_file.touch()
        else:
            fail_file.unlink(missing_ok=True)


@dataclass
class Rank:
    """One MPI rank of a lab job."""

    rank: int
    pid: int
    node: str

    @property
    def node_pid(self) -> int:
        """The rank's process id inside its node (its PID namespace)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
        raise LabError(f"process {self.pid} has no NSpid")


class Job:
    """A job started by :meth:`Lab.start`."""

    def __init__(self, lab: Lab, job_id: str, process: subprocess.Popen) -> None:
        self.lab = lab
        self.job_id = job_id
        self.process = process
        self.stdout = ""
        self.stderr = ""
        self.returncode: int | None = None

    def ranks(self) -> dict[int, Rank]:
        """The live ranks of this job, by rank (found by their environment)."""
        found = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:  # a process may end between the listing and the reads: it is no live rank then
                environ = Path(entry.path, "environ").read_bytes().split(b"\0")
                command = Path(entry.path, "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
            rank_text = variables.get(b"PMI_RANK", variables.get(b"OMPI_COMM_WORLD_RANK"))  # MPICH, Open MPI
            if variables.get(JOB_ENV.encode()) != self.job_id.encode() or rank_text is None:
                continue
            if b"python" not in command:
                continue
            pid = int(entry.name)
            try:
                node = self.lab.node_of(pid)
            except LabError:
                continue
            found[int(rank_text)] = Rank(int(rank_text), pid, node)
        return found

    def wait_stopped(self, timeout: float = 40) -> Rank:
        """Wait until a rank of this job has stopped itself (a ``stop`` fault); that rank."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rank in self.ranks().values():
                try:
                    state = Path(f"/proc/{rank.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if state == "T":
                    return rank
            if self.process.poll() is not None:
                self.finish(1)
                raise LabError(f"job {self.job_id} ended before any rank stopped:\n{self.stderr[-3000:]}")
            time.sleep(0.02)
        self.kill()
        raise LabError(f"job {self.job_id}: no rank stopped within {timeout} s:\n{self.stderr[-3000:]}")

    def kill_rank(self, rank: Rank, point: str | None = None) -> None:
        """SIGKILL one rank (also one that is stopped)."""
        self.lab.events.append(Event("rank kill", rank.node, rank.rank, point))
        os.kill(rank.pid, signal.SIGKILL)

    def stop_rank(self, rank: Rank) -> None:
        """SIGSTOP one rank: it stays alive and silent."""
        self.lab.events.append(Event("rank stop", rank.node, rank.rank))
        os.kill(rank.pid, signal.SIGSTOP)

    def finish(self, timeout: float = 50) -> None:
        """Wait for the job's end; on a timeout kill it and every rank, then raise."""
        try:
            self.stdout, self.stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise LabError(
                f"job {self.job_id} did not finish within {timeout} s; its stdout ends with:\n"
                f"{self.stdout[-2000:]}\nits stderr with:\n{self.stderr[-3000:]}"
            ) from None
        self.returncode = self.process.returncode

    def kill(self) -> None:
        """Kill the launcher's process group and every rank of the job."""
        for rank in self.ranks().values():
            try:
                os.kill(rank.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = self.process.communicate()
        self.stdout += out or ""
        self.stderr += err or ""
        self.returncode = self.process.returncode

