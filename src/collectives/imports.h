/*
 * Buffers shared between the processes of one node by their kernel table (sumo_ext.h's share,
 * open_shared, close_shared: CUDA IPC for device memory), so that ranks in separate processes
 * run the direct algorithms on them as threads of one process do.
 *
 * Before its agreement a rank exports its send and receive buffers (sumo__imports_export) and
 * writes their handles on its board (the transport's per-rank area every rank maps); the
 * announcement that follows orders those writes before any peer's reads, and says in its
 * flags whether the export succeeded. After an agreement where every rank's buffers are
 * shared, a rank reaches a peer's buffer through sumo__imports_peer: the peer's handle, opened
 * once and kept per communicator and peer (a peer that announces another allocation replaces
 * the least recently used of its imports), closed when the communicator is freed.
 *
 * A board is rewritten only at the writer's next call, which it starts after the direct
 * algorithm's final barrier, so after every peer has read it (every direct path ends with
 * a barrier, and resolves its peers' buffers before it).
 */
#ifndef SUMO_IMPORTS_H
#define SUMO_IMPORTS_H

#include "collectives/comm.h"

/* Exports sendbuf (NULL: none to send) and recvbuf through the call's table and writes their
 * handles on this rank's board. Returns whether both are shared; when not, c->share_why says
 * why. */
bool sumo__imports_export(sumo_comm *c, const void *sendbuf, size_t send_bytes,
                          const void *recvbuf, size_t recv_bytes);

/* Rank k's send (recv false) or receive buffer, which it announced at `address`, as this
 * rank's kernels reach it: the address itself on this rank, else inside the peer's allocation
 * opened here. A handle that cannot be opened, or a board that does not hold the announced
 * address, is a failure that breaks the communicator (the peers are already inside the
 * direct algorithm). */
sumo_result sumo__imports_peer(sumo_comm *c, int k, bool recv, uint64_t address, void **out);

#endif
