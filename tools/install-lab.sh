#!/usr/bin/env bash
# Build the multi-node lab's two small programs into build/lab/ (what `make install` runs):
#   nodecache           a node's client cache of the shared file system (FUSE; tests/lab/nodecache.c)
#   ucx_no_disconnect.so  the MPI_Finalize workaround for MPICH over UCX TCP (tests/lab/ucx_no_disconnect.c)
# As root on Debian/Ubuntu it installs fuse3, libfuse3-dev and libucx-dev when missing, and
# MooseFS (moosefs-master, moosefs-chunkserver, moosefs-client: the lab's real distributed
# file system, tests/lab/moosefs.py) and iproute2.
# Idempotent: rebuilds only when a source is newer than its program.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$repo/build/lab
say() { printf 'install-lab: %s\n' "$*"; }

need=()
pkg-config --exists fuse3 2>/dev/null || need+=(libfuse3-dev)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
[ -e /usr/include/ucp/api/ucp.h ] || need+=(libucx-dev)
command -v mfsmaster >/dev/null 2>&1 || need+=(moosefs-master)
command -v mfschunkserver >/dev/null 2>&1 || need+=(moosefs-chunkserver)
command -v mfsmount >/dev/null 2>&1 || need+=(moosefs-client)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && [ -z "${HPCKPT_SKIP_APT:-}" ] && command -v apt-get >/dev/null; then
        say "apt-get install ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${need[@]}" >/dev/null
    else
        say "missing ${need[*]}: the lab tests (tests/lab) will say so and skip" >&2
        exit 0
    fi
fi
mkdir -p "$out"
if [ ! -x "$out/nodecache" ] || [ "$repo/tests/lab/nodecache.c" -nt "$out/nodecache" ]; then
    say "build $out/nodecache"
    cc -O2 -Wall -o "$out/nodecache" "$repo/tests/lab/nodecache.c" $(pkg-config --cflags --libs fuse3) -lpthread
fi
if [ ! -e "$out/ucx_no_disconnect.so" ] || [ "$repo/tests/lab/ucx_no_disconnect.c" -nt "$out/ucx_no_disconnect.so" ]; then
    say "build $out/ucx_no_disconnect.so"
    cc -O2 -Wall -shared -fPIC -o "$out/ucx_no_disconnect.so" "$repo/tests/lab/ucx_no_disconnect.c"
fi
say "ready ($out)"
