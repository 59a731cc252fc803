/* The communicator's record of sumo_mem_alloc's memory (collectives/memory.c). */
#ifndef SUMO_MEMORY_H
#define SUMO_MEMORY_H

#include "collectives/comm.h"

/* At destroy: drops the records, freeing the plain memory the transport does not own (the
 * transport's destroy releases its shared memory). */
void sumo__mem_forget(sumo_comm *comm);

#endif
