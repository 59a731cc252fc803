/*
 * A key-value store in a directory, the rendezvous sumo_comm_create_shm needs (what torch's
 * TCPStore is to torchrun), for tests and benchmarks that fork their ranks: set writes the
 * value to a temporary file and renames it into place, so a reader sees a whole value or
 * none; get polls for the file with a short sleep until its deadline.
 */
#ifndef SUMO_TEST_FILE_STORE_H
#define SUMO_TEST_FILE_STORE_H

#include "sumo_shm.h"

typedef struct file_store {
    char dir[200];
    /* Test switch: get never finds anything (a store that never delivers). */
    int never;
    sumo_store store; /* ctx points at this struct */
} file_store;

/* dir must exist (and outlive the store's use). Returns 0, or -1 when dir is too long. */
int file_store_init(file_store *fs, const char *dir);

#endif
