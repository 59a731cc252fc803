/*
 * Join tickets in a store: how a process asks to join a running elastic job, with no store
 * operation beyond set, get and set_once (so the directory store serves as well as torch's).
 * A joiner takes the lowest free ticket by set_once on join/ticket/<k>, k = 1, 2, ... upward,
 * with a value of its own (a nonce), and holds k when the value that stands is its own; the
 * tickets taken are therefore always 1..n with no gap. The members count them at a commit
 * point, write each new holder's place under join/place/<k>, and the holder waits for it;
 * join/closed says the job has ended, so holders stop waiting. Keys under the job's root.
 */
#ifndef SUMO_TRANSPORT_TICKETS_H
#define SUMO_TRANSPORT_TICKETS_H

#include "common/common.h"

#include "sumo_shm.h"

#include <stddef.h>
#include <stdint.h>

/* The most tickets one job hands out. */
#define SUMO__MAX_TICKETS (1 << 20)

/* Takes the lowest free ticket into *ticket. SUMO_ERR_SYSTEM when the store fails or no
 * nonce can be drawn, SUMO_ERR_INVALID_USAGE when the job's tickets are all taken. */
sumo_result sumo__ticket_take(const sumo_store *st, const char *root, int *ticket, char *why,
                              size_t why_bytes);

/* The tickets taken so far, known to be at least `from` (the count of a commit before):
 * scans upward from from + 1 while the keys are there. */
sumo_result sumo__tickets_count(const sumo_store *st, const char *root, int from, int *count,
                                char *why, size_t why_bytes);

/* Writes ticket's place (the members' text, at most 240 bytes). */
sumo_result sumo__ticket_place(const sumo_store *st, const char *root, int ticket,
                               const char *text, char *why, size_t why_bytes);

/* Waits for ticket's place until deadline_ns and copies it into text (NUL-terminated, then
 * removed from the store where it has remove). SUMO_ERR_PEER_FAILURE once join/closed is
 * there, SUMO_ERR_TIMEOUT at the deadline, SUMO_ERR_SYSTEM when the store fails. */
sumo_result sumo__ticket_wait(const sumo_store *st, const char *root, int ticket,
                              int64_t deadline_ns, char *text, size_t bytes, char *why,
                              size_t why_bytes);

/* Marks the job ended for holders still waiting. */
sumo_result sumo__tickets_close(const sumo_store *st, const char *root, char *why,
                                size_t why_bytes);

#endif
