#!/bin/bash
# Your own MPI application with mpirun, for machines without Slurm: relaunched after a
# crashed rank, resuming from the newest checkpoint. The command after the script is what
# runs on every rank:
#
#   HPCKPT_PYTHON=/path/to/.venv/bin/python HPCKPT_NP=8 bash jobs/app-mpirun.sh /path/to/.venv/bin/python my_solver.py --ckpt /scratch/run1
#
# Settings from the environment:
#   HPCKPT_PYTHON    Python with hpckpt installed, for hpckpt run (default: python3 on PATH)
#   HPCKPT_NP        ranks (default 4)
#   HPCKPT_RESTARTS  relaunches after a crash (default 3)
#   MPIRUN           the launcher and its options (default: mpirun)
# SIGTERM or SIGUSR1 to this script reach the ranks; an application using
# hpckpt.slurm.JobControl then saves and exits with status 75, which is not relaunched.
set -euo pipefail
if [ $# -eq 0 ]; then
    echo "app-mpirun.sh: give the application's command after the script: bash jobs/app-mpirun.sh python my_app.py ..." >&2
    exit 2
fi
python=${HPCKPT_PYTHON:-python3}
read -r -a mpirun <<< "${MPIRUN:-mpirun}"
exec "$python" -m hpckpt run --max-restarts "${HPCKPT_RESTARTS:-3}" --delay 1 -- "${mpirun[@]}" -n "${HPCKPT_NP:-4}" "$@"
