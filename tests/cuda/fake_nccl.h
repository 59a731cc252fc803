/*
 * test_cuda: a fake NCCL for the host tests of the NCCL transport (nccl.c) and of two levels
 * with NCCL between the nodes (hier.c): in-process mailboxes behind the same call table the
 * real NCCL fills.
 */
#ifndef SUMO_TEST_FAKE_NCCL_H
#define SUMO_TEST_FAKE_NCCL_H

#include "cuda_test.h"
#include "nccl_api.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

/* The fake: each rank's "stream" is a queue of operations run in order whenever it is queried
 * (copies, sends into mailboxes, receives from them, allgathers and one-byte allreduces that
 * complete once every rank has contributed). "Device" memory is the emulated arena. */
enum { FK_COPY, FK_SEND, FK_RECV, FK_GATHER, FK_REDUCE1 };

typedef struct fk_op {
    struct fk_op *next;
    int kind, peer;
    void *dst;
    const void *src;
    size_t bytes;
    bool contributed;
    long gen;
} fk_op;

typedef struct fk_msg {
    struct fk_msg *next;
    size_t bytes;
    unsigned char data[];
} fk_msg;

typedef struct fk_net fk_net;
typedef struct fk_rank {
    fk_net *net;
    int rank;
    fk_op *head, *tail;
    long collectives;
} fk_rank;

struct fk_net {
    int P;
    pthread_mutex_t lock;
    fk_msg *mhead[MAXP][MAXP], *mtail[MAXP][MAXP];
    unsigned char slots[2][MAXP][256];
    int arrived[2], consumed[2];
    fk_rank ranks[MAXP];
    int hang_rank, error_rank;
    bool bad_count;
    atomic_int aborts[MAXP], destroys[MAXP], staged_copies;
};

/* The call table over the fake: a rank (&net->ranks[r]) is both its communicator and its
 * stream. */
extern const sumo_cuda__nccl_api FAKE;

/* A network of P ranks, none hanging or failing; free what is still queued with
 * fk_net_free. */
void fk_net_init(fk_net *n, int P);
void fk_net_free(fk_net *n);

#endif
