"""A real Slurm over the lab's nodes: slurmctld on the host, one slurmd inside each lab node.

Every node has its own hostname, so each slurmd runs as ``slurmd -N nodeK`` with its
own port (``Port=`` per ``NodeName``, all on 127.0.0.1) and its own spool, pid and log
files (``%n`` in ``slurm.conf``). A lost node takes its slurmd with it; after
:meth:`Lab.lose_node` (which starts a fresh node of the same name),
:meth:`LabSlurm.start_slurmd` starts a new one there and the node returns to service.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.lab.cluster import Lab
from tests.slurm.cluster import SlurmCluster, free_port

SLURMD_TIMEOUT = 4  # seconds before slurmctld declares a silent node DOWN
MESSAGE_TIMEOUT = 3  # seconds for a reply: a ping of a lost node fails after it (Slurm's default: 10)


class LabSlurm(SlurmCluster):
    """:class:`tests.slurm.cluster.SlurmCluster` with one slurmd per lab node."""

    def __init__(self, lab: Lab, root: Path) -> None:
        super().__init__(root)
        self.lab = lab
        self.ports = {name: free_port() for name in lab.nodes}

    def _config(self) -> str:
        lines = [
            line
            for line in super()._config().splitlines()
            if not line.startswith(
                (
                    "NodeName=",
                    "PartitionName=",
                    "SlurmdPort=",
                    "SlurmdSpoolDir=",
                    "SlurmdPidFile=",
                    "SlurmdLogFile=",
                )
            )
        ]
        root = self.root
        lines += [
            f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmdPidFile={root}/slurmd-%n.pid",
            f"SlurmdLogFile={root}/log/slurmd-%n.log",
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            f"MessageTimeout={MESSAGE_TIMEOUT}",
            *(
                f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs=4 State=UNKNOWN"
                for name, port in self.ports.items()
            ),
            f"PartitionName=test Nodes={','.join(self.ports)} Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _start_slurmd(self) -> None:
        for name in self.lab.nodes:
            self.start_slurmd(name)

    def start_slurmd(self, name: str) -> None:
        """Start node ``name``'s slurmd inside it."""
        (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
        self.lab.nodes[name].run(
            ["/usr/sbin/slurmd", "-N", name, "-f", str(self.conf)], check=True, env=self.env
        )

    def _ready(self) -> bool:
        """Whether every lab node is idle (ready for jobs)."""
        listing = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=self.env
        ).stdout
        idle = [line.split()[0] for line in listing.splitlines() if line.split()[1:] == ["idle"]]
        return sorted(idle) == sorted(self.lab.nodes)

    def stop(self) -> None:
        """Stop every node's slurmd inside its node, then slurmctld (and munged if started here).

        Not by the slurmd pid files: they hold process ids of the nodes' PID namespaces,
        which on the host may name unrelated processes.
        """
        for node in self.lab.nodes.values():
            node.run(["pkill", "-KILL", "-x", "slurmd"], capture_output=True)
        super().stop()
