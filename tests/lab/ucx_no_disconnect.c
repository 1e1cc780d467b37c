/*
 * A workaround for the lab's MPI jobs (LD_PRELOAD), not part of hpckpt.
 *
 * MPICH 4.0's MPI_Finalize closes every UCX endpoint with ucp_disconnect_nb, a
 * flushing close that needs the peer to answer; a peer that finished first has already
 * destroyed its UCX worker, so over UCX's TCP transport about one lab job in six hung
 * in MPI_Finalize after all its work was done (openucx/ucx#8738, "TCP transport hangs
 * during cleanup"). MPI_Finalize runs after a PMI barrier, when every MPI operation
 * has completed, so nothing is left to flush: this library skips the flushing close
 * (a forced close is refused for MPICH's endpoints) and ucp_worker_destroy, which
 * MPI_Finalize calls next, destroys the endpoints without waiting for any peer.
 */
#include <ucp/api/ucp.h>

ucs_status_ptr_t ucp_disconnect_nb(ucp_ep_h ep) {
    (void)ep;
    return UCS_OK;
}
