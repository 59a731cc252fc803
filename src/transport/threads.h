/* The threads transport's constructor (transport/threads.c). */
#ifndef SUMO_THREADS_H
#define SUMO_THREADS_H

#include "transport/transport.h"

/* Makes the nranks ranks of one group: fills tps[0..nranks), with env's deadline and log level. */
sumo_result sumo__threads_transport_create(int nranks, const sumo__env *env,
                                           sumo__transport **tps);

#endif
