#!/usr/bin/env bash
# The demo behind `make demo`: the heat solver on NP ranks (default 4), once without
# failures and once with rank 2 SIGKILLed mid-run under `hpckpt run`; the two final
# checksums must be equal. Prints what happened and PASS or FAIL.
# PY (default python3) is the environment's Python; its directory comes first on PATH, as
# in a shell where that environment is activated, so its own mpiexec (PyPI's MPICH in
# tools/install-wheels.sh's environment) launches the ranks when it has one.
set -uo pipefail
PY=${PY:-python3}
NP=${NP:-4}
case $PY in */*) PATH=$(cd "$(dirname "$PY")" && pwd):$PATH ;; esac
echo "demo: $("$PY" -c 'import mpi4py.MPI as m; print(*m.Get_library_version().split()[:3])') ($(command -v mpiexec))"
work=$(mktemp -d "${TMPDIR:-/tmp}/hpckpt-demo.XXXXXX")
heat=("$PY" -m hpckpt.examples.heat --n 512 --iters 400 --every 50)

echo "demo: 1. fault-free: mpiexec -n $NP ${heat[*]} --dir $work/clean"
mpiexec -n "$NP" "${heat[@]}" --dir "$work/clean" > "$work/clean.out" 2>&1
clean_status=$?
cat "$work/clean.out"

echo
echo "demo: 2. rank 2 is SIGKILLed at iteration 275; hpckpt run relaunches the job"
echo "      $PY -m hpckpt run --max-restarts 3 -- mpiexec -n $NP ${heat[*]} --dir $work/crash --crash-at-iter 275 --crash-rank 2"
"$PY" -m hpckpt run --max-restarts 3 --delay 1 -- \
    mpiexec -n "$NP" "${heat[@]}" --dir "$work/crash" --crash-at-iter 275 --crash-rank 2 \
    > "$work/crash.out" 2> "$work/crash.err"
crash_status=$?
grep '^hpckpt run:' "$work/crash.err"
cat "$work/crash.out"

checksum() { sed -n 's/^heat: done .*checksum=\([0-9a-f]*\)$/\1/p' "$1"; }
clean_sum=$(checksum "$work/clean.out")
crash_sum=$(checksum "$work/crash.out")
attempts=$(grep -c '^hpckpt run: attempt [0-9]*/[0-9]*:' "$work/crash.err")
resumed=$(sed -n 's/^heat: done .*resumed_from=\([a-z0-9]*\) .*/\1/p' "$work/crash.out")
saving=$(sed -n 's/^heat: .* checkpoints saved in \([0-9.]* s\) of \([0-9.]* s\)$/\1 of \2/p' "$work/crash.out")

echo
echo "demo: summary"
echo "  fault-free checksum:   ${clean_sum:-missing} (exit $clean_status)"
echo "  with a crash:          ${crash_sum:-missing} (exit $crash_status)"
echo "  attempts:              $attempts"
echo "  resumed from step:     ${resumed:-none}"
echo "  time spent saving:     ${saving:-unknown} (last attempt)"
echo "  checkpoints in:        $work"
if [ "$clean_status" = 0 ] && [ "$crash_status" = 0 ] && [ -n "$clean_sum" ] && [ "$clean_sum" = "$crash_sum" ] \
    && [ "$attempts" -ge 2 ] && [ "$resumed" != none ]; then
    echo "demo: PASS"
else
    echo "demo: FAIL"
    exit 1
fi
