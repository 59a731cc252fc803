/* The MPI transport (transport_mpi.c); only files built with mpicc include this. */
#ifndef SUMO_TRANSPORT_MPI_H
#define SUMO_TRANSPORT_MPI_H

#include "transport/transport.h"

#include <mpi.h>

/* Collective over comm: duplicates it and, when every rank shares one node, maps the shared
 * window the collectives stage through. */
sumo_result sumo__mpi_transport_create(MPI_Comm comm, const sumo__env *env,
                                       sumo__transport **out, char *err, size_t errlen);

#endif
