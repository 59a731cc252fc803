/* The TCP transport (transport/transport_tcp.c): processes on any machines, met through a
 * caller's key-value store, over one TCP connection per pair of ranks. */
#ifndef SUMO_TRANSPORT_TCP_H
#define SUMO_TRANSPORT_TCP_H

#include "transport/transport.h"

#include "sumo_tcp.h"

/* Collective over the options' ranks (validated by the caller). On failure no socket is left
 * open, and err says why. */
sumo_result sumo__tcp_transport_create(const sumo_tcp_options *options, const sumo__env *env,
                                       sumo__transport **out, char *err, size_t errlen);

#endif
