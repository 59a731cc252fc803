/*
 * The compressed allreduce (sumo.h's sumo_allreduce_compressed) as execute.c runs it: a call
 * kind of its own (SUMO__CALL_COMPRESSED), validated on the one path like every collective,
 * with the checks of its options here.
 */
#ifndef SUMO_COMPRESSED_H
#define SUMO_COMPRESSED_H

#include "collectives/agree.h"

/* This rank's checks of the options (NULL: the caller passed none) for count elements; records
 * why and returns the code to announce. */
sumo_result sumo__compressed_check(sumo_comm *c, const sumo_compression *options, size_t count);

/* Runs the validated call (the buffers' table in c->x): announces the format and block size in
 * d's aux and a non-finite input as this rank's failure, then the data phase. */
sumo_result sumo__allreduce_compressed(sumo_comm *c, sumo__call_desc *d,
                                       const sumo_compression *options, const float *sendbuf,
                                       float *recvbuf);

#endif
