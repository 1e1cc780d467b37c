"""A real single-node Slurm cluster (munge, slurmctld, slurmd) in a temporary directory.

Used by the tests in this folder; also runnable by hand to try the job scripts::

    python -m tests.slurm.cluster /tmp/slurm     # starts it, prints SLURM_CONF, waits for Ctrl-C

Installs ``slurm-wlm`` and ``munge`` with apt-get when they are missing and this is root
on Debian/Ubuntu; :func:`unavailable` says why a cluster cannot be had otherwise. The
daemons use ports of their own and a ``slurm.conf`` under the temporary directory, so a
site's Slurm (if any) is never touched. The node declares more CPUs than the machine has
(``config_overrides``) so that 4-rank jobs fit on a 2-core machine.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "munged")
CPUS = 8
KILL_WAIT = 5  # seconds between SIGTERM and SIGKILL when Slurm ends a job


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here (None when it can), installing it if needed."""
    if all(shutil.which(name) or Path("/usr/sbin", name).exists() for name in DAEMONS):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return (
            "Slurm is not installed and cannot be (needs root and apt-get: apt-get install slurm-wlm munge)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]
    result = subprocess.run(install, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env)
        result = subprocess.run(install, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        return f"apt-get install slurm-wlm munge failed: {result.stderr.strip()[-500:]}"
    return None


def free_port() -> int:
    """A port of 127.0.0.1 free now, below the kernel's ephemeral range: a port that
    ``bind(0)`` hands out can be taken by any client connection (MPI, MooseFS) before the
    daemon binds it, and a lab slurmd once failed to bind its port so ("Address already
    in use") and then refused the job's launch.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.Random().sample(range(max(1024, low - 12288), low), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port of 127.0.0.1 in the 200 tried below {low}")


class SlurmCluster:
    """Start with :meth:`start`, stop with :meth:`stop`; :attr:`env` reaches it from commands."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.host = socket.gethostname()
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._started_munge = False

    def start(self, timeout: float = 60) -> SlurmCluster:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self.conf.write_text(self._config())
        sbin = "/usr/sbin"
        subprocess.run([f"{sbin}/slurmctld", "-c", "-f", str(self.conf)], check=True, env=self.env)
        self._start_slurmd()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready():
                return self
            time.sleep(0.5)
        logs = "\n".join(path.read_text()[-2000:] for path in (self.root / "log").glob("*.log"))
        self.stop()
        raise RuntimeError(f"the Slurm nodes did not become idle within {timeout:g} s; logs:\n{logs}")

    def _start_slurmd(self) -> None:
        subprocess.run(["/usr/sbin/slurmd", "-f", str(self.conf)], check=True, env=self.env)

    def _ready(self) -> bool:
        """Whether the node is idle (ready for jobs)."""
        state = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.env
        ).stdout
        return state.strip() == "idle"

    def stop(self) -> None:
        """Stop the daemons started here (by their pid files), then munged if started here."""
        for name in ("slurmd", "slurmctld"):
            _kill_pid_file(self.root / f"{name}.pid")
        if self._started_munge:
            _kill_pid_file(Path("/run/munge/munged.pid"))

    def _start_munge(self) -> None:
        probe = subprocess.run(["munge", "-n"], capture_output=True)
        if probe.returncode == 0:
            return  # a munged is running already (the machine's own)
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        if not Path("/etc/munge/munge.key").exists():
            subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
            shutil.chown("/etc/munge/munge.key", "munge", "munge")
        subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
        self._started_munge = True
        for _ in range(50):
            if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("munged started but `munge -n` still fails")

    def _config(self) -> str:
        root = self.root
        return f"""\
ClusterName=hpckpt-test
SlurmctldHost={self.host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmctldDebug=verbose
SlurmdLogFile={root}/log/slurmd.log
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={KILL_WAIT}
MinJobAge=600
JobRequeue=1
SchedulerParameters=sched_interval=1
NodeName={self.host} CPUs={CPUS} State=UNKNOWN
PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
"""


def _kill_pid_file(path: Path, timeout: float = 10) -> None:
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, IndexError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


if __name__ == "__main__":
    reason = unavailable()
    if reason:
        sys.exit(reason)
    cluster = SlurmCluster(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hpckpt-slurm")).start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
