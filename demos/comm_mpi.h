/* cw_comm over MPI point-to-point (MPI_Isend/MPI_Irecv on a duplicate of MPI_COMM_WORLD with
 * MPI_ERRORS_RETURN): what cw-vae --ranks hands cw_graph_compile. The library stays free of
 * MPI; only demos link it. A view is packed and moved in pieces of at most 4 MiB (MPI
 * messages of one tag, in order), the first behind a 16-byte header (the plan's 64-bit tag and
 * the payload's bytes) that the receiver checks: a rank's transient copy is one piece. */
#ifndef CW_COMM_MPI_H
#define CW_COMM_MPI_H

#include <stddef.h>

#include "convweave/convweave.h"

typedef struct comm_mpi comm_mpi;

/* MPI_Init_thread asking for MPI_THREAD_MULTIPLE (the plan calls from its comm stream's
 * thread, compile from the caller's): at least MPI_THREAD_SERIALIZED is needed, and calls
 * are then serialised by a mutex. Returns 0, or -1 with the reason in err. */
int comm_mpi_init(int *argc, char ***argv, char *err, size_t errlen);
/* MPI_Finalize; MPI_Abort(MPI_COMM_WORLD, code): ends every rank now. */
void comm_mpi_finalize(void);
void comm_mpi_abort(int code);

/* A communicator over every rank of MPI_COMM_WORLD (a duplicate: its own errors return)
 * and the cw_comm that forwards to it, in *comm (borrowing *out until comm_mpi_destroy). A
 * call that has not completed after timeout_s seconds fails with CW_ERR_COMM (its request
 * cancelled), so a peer that stopped calling cannot hang the rank. Returns 0, or -1 with
 * the reason in err. */
int comm_mpi_create(comm_mpi **out, cw_comm *comm, double timeout_s, char *err, size_t errlen);
/* With $CW_COMM_MPI_TRACE=PREFIX, every completed message is a line in the file PREFIX.RANK:
 * "comm_mpi: rank R send to P tag T bytes B" (or "recv from"). */
/* Frees the duplicate and the state. Accepts NULL. */
void comm_mpi_destroy(comm_mpi *c);
/* The last failed call's reason ("recv from rank 1, tag 7: ..."), or "" when none failed. */
const char *comm_mpi_last_error(const comm_mpi *c);
/* Messages and payload bytes this rank sent and received so far. */
void comm_mpi_counts(const comm_mpi *c, long long *sent, long long *recvd, long long *bytes_sent,
                     long long *bytes_recvd);

/* Packs the strided view (d, data) into dst, contiguous, outermost dim first; returns the
 * bytes written (numel * element size). unpack is its inverse. Exposed for the tests. */
size_t comm_mpi_pack(void *dst, const cw_tensor_desc *d, const void *data);
size_t comm_mpi_unpack(void *data, const cw_tensor_desc *d, const void *src);

#endif
