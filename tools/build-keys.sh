# Sourced by tools/install.sh and tools/install-dedalus.sh (with $python and $MPICC set):
# what the wheelhouse key of a compiled wheel is made of, so that both key their folders
# alike: the Python tag, the MPI compiler's command line and the MPI version, and key_of,
# which hashes a build's settings.
py_tag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
mpi_id=$("$MPICC" -show 2>/dev/null | tr -s ' ' | md5sum | cut -c1-8)
mpi_version=$(mpichversion 2>/dev/null | head -1 | tr -cd '[:alnum:].' || true)
key_of() { printf '%s' "$*" | md5sum | cut -c1-12; }
