#include "transport/shm.h"

#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* A sleeping waiter wakes at least this often to look at its deadline and the abort flag. */
#define SLEEP_SLICE_NS (20 * 1000 * 1000)
/* Yields before the first sleep. A futex hand-off costs tens of microseconds (the sleeper
 * must be woken and scheduled); when ranks outnumber cores, a yield hands the core straight
 * to the peer we wait for, and when they don't it returns at once, so this bounded phase is
 * cheap either way (4 ranks on 2 cores: 4 KiB allreduce 240 us -> 10 us). */
#define YIELD_LIMIT 100

size_t sumo__shm_ctl_bytes(int size)
{
    return sizeof(sumo__shm_ctl) + (size_t)size * sizeof(sumo__shm_desc);
}

void sumo__shm_ctl_init(sumo__shm_ctl *ctl, int size)
{
    atomic_store(&ctl->arrived, 0);
    atomic_store(&ctl->generation, 0);
    atomic_store(&ctl->sleepers, 0);
    atomic_store(&ctl->abort_flag, 0);
    ctl->size = size;
}

uint32_t sumo__shm_default_spin_limit(int ranks_sharing_cores)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    /* More ranks than cores: a spinning rank always keeps a peer off a core. Otherwise the
     * first wait decides (spin_for_caller), from the thread that waits. */
    return ranks_sharing_cores <= cores ? 0 : 50;
}

/* Spinning pays only while the peer we wait for runs on another core. A thread bound to one
 * core (mpirun's binding, sumo's pinned workers) has its peers elsewhere, and there a short spin
 * loses: with another busy process on a core, each early yield hands that process a whole
 * slice. A thread free to move (torchrun's ranks, a progress thread nobody pinned) may share a
 * core with the peer, and there a long spin burns the slice the peer needs. Measured on 2 cores
 * with one busy process beside, P 2, sum, three runs each (sumo bench, bench/shm_allreduce):
 * bound, 1 MiB: 4.07, 3.98 and 0.06 ms spinning 200, 0.04 to 0.05 ms spinning 20000; free,
 * 16 MiB: 6.4 to 8.3 ms spinning 200, 10.3 to 42.9 ms spinning 20000 (1 MiB: 0.26 to 0.30
 * against 0.29 to 2.9 ms). With nothing else running the count made no difference. */
static uint32_t spin_for_caller(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) == 1) return 20000;
    return 200;
}

static long futex_wait(_Atomic uint32_t *word, uint32_t value, int64_t timeout_ns)
{
    struct timespec ts = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
    /* Not FUTEX_PRIVATE: the word may live in memory shared between processes. */
    return syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, value, &ts, NULL, 0);
}

void sumo__shm_wake(sumo__shm *shm, _Atomic uint32_t *word)
{
    /* The caller's store to word must be visible before we read sleepers (a store-load
     * order x86 does not give for free); the waiter does the mirror image (increment
     * sleepers, then re-read word), so one of the two always sees the other. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&shm->ctl->sleepers) != 0)
        syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void sumo__shm_abort(sumo__shm *shm, int rank)
{
    uint32_t expected = 0;
    /* The first rank to abort is the one named in everyone's message. */
    atomic_compare_exchange_strong(&shm->ctl->abort_flag, &expected, (uint32_t)rank + 1);
    /* Sleepers wake within a slice anyway; this makes it immediate for barrier sleepers. */
    syscall(SYS_futex, (uint32_t *)&shm->ctl->generation, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void sumo__shm_depart(sumo__shm *shm, int rank)
{
    atomic_store(&shm->ctl->desc[rank].gone, 1);
    uint32_t expected = 0;
    atomic_compare_exchange_strong(&shm->ctl->departed, &expected, (uint32_t)rank + 1);
    syscall(SYS_futex, (uint32_t *)&shm->ctl->generation, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The rank whose departure makes this wait hopeless, or -1. */
static int departed_peer(const sumo__shm_ctl *ctl, int peer)
{
    if (peer >= 0) return atomic_load(&ctl->desc[peer].gone) ? peer : -1;
    return (int)atomic_load(&ctl->departed) - 1;
}

static sumo_result peer_left(sumo__transport *tp, const char *what, int who)
{
    return SUMO__FAIL(tp, SUMO_ERR_PEER_FAILURE,
                      "%s: rank %d left the group (its handle was destroyed) while rank %d "
                      "still waited on it; this communicator is unusable",
                      what, who, tp->rank);
}

static sumo_result peer_failed(sumo__transport *tp, const sumo__shm *shm, const char *what)
{
    return SUMO__FAIL(tp, SUMO_ERR_PEER_FAILURE,
                      "%s: rank %d aborted the group (it failed, timed out waiting, or left); "
                      "this communicator is unusable",
                      what, (int)atomic_load(&shm->ctl->abort_flag) - 1);
}

sumo_result sumo__shm_wait_change(sumo__transport *tp, sumo__shm *shm, _Atomic uint32_t *word,
                                  uint32_t value, int peer, int64_t deadline_ns, const char *what)
{
    sumo__shm_ctl *ctl = shm->ctl;
    /* One rank's waits never run at once (its handle orders its calls), so this is no race. */
    if (shm->spin_limit == 0) shm->spin_limit = spin_for_caller();
    for (uint32_t spin = 0; spin < shm->spin_limit; spin++) {
        if (atomic_load_explicit(word, memory_order_acquire) != value) return SUMO_SUCCESS;
        cpu_relax();
    }
    for (int y = 0; y < YIELD_LIMIT && sumo__now_ns() < deadline_ns; y++) {
        if (atomic_load_explicit(word, memory_order_acquire) != value) return SUMO_SUCCESS;
        if (atomic_load(&ctl->abort_flag)) return peer_failed(tp, shm, what);
        if (departed_peer(ctl, peer) >= 0) break;
        sched_yield();
    }
    for (;;) {
        if (atomic_load_explicit(word, memory_order_acquire) != value) return SUMO_SUCCESS;
        if (atomic_load(&ctl->abort_flag)) return peer_failed(tp, shm, what);
        int who = departed_peer(ctl, peer);
        /* A departing rank changes the word before it leaves, so the word is read again after
         * the departure was seen: a change it made on its way out still counts. */
        if (who >= 0) {
            if (atomic_load_explicit(word, memory_order_seq_cst) != value) return SUMO_SUCCESS;
            return peer_left(tp, what, who);
        }
        if (shm->watch) {
            char why[128];
            who = shm->watch(shm, peer, why, sizeof why);
            /* As for a departure: what the rank did before it died still counts. */
            if (who >= 0) {
                atomic_store(&ctl->desc[who].dead, 1);
                if (atomic_load_explicit(word, memory_order_seq_cst) != value) return SUMO_SUCCESS;
                return SUMO__FAIL(tp, SUMO_ERR_PEER_FAILURE,
                                  "%s: rank %d %s while rank %d waited on it; this communicator "
                                  "is unusable",
                                  what, who, why, tp->rank);
            }
        }
        int64_t now = sumo__now_ns();
        if (now >= deadline_ns) {
            sumo__shm_abort(shm, tp->rank);
            return SUMO__FAIL(tp, SUMO_ERR_TIMEOUT,
                              "%s: rank %d waited %.3f s for its peers (deadline reached; raise it "
                              "with sumo_comm_set_timeout or SUMO_TIMEOUT)",
                              what, tp->rank, (double)tp->timeout_ns / 1e9);
        }
        atomic_fetch_add(&ctl->sleepers, 1);
        /* futex re-checks *word == value atomically, so a wake between our load and the
         * sleep is not lost. */
        int64_t slice = SUMO__MIN(deadline_ns - now, (int64_t)SLEEP_SLICE_NS);
        if (atomic_load(word) == value) futex_wait(word, value, slice);
        atomic_fetch_sub(&ctl->sleepers, 1);
    }
}

sumo_result sumo__shm_barrier(sumo__transport *tp, sumo__shm *shm)
{
    sumo__shm_ctl *ctl = shm->ctl;
    if (atomic_load(&ctl->abort_flag)) return peer_failed(tp, shm, "barrier");
    uint32_t gen = atomic_load_explicit(&ctl->generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&ctl->arrived, 1, memory_order_acq_rel) + 1 == (uint32_t)shm->size) {
        atomic_store_explicit(&ctl->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&ctl->generation, gen + 1, memory_order_release);
        sumo__shm_wake(shm, &ctl->generation);
        return SUMO_SUCCESS;
    }
    return sumo__shm_wait_change(tp, shm, &ctl->generation, gen, -1,
                                 sumo__now_ns() + tp->timeout_ns, "barrier");
}

void sumo__shm_busy(sumo__shm *shm, bool busy)
{
    atomic_store_explicit(&shm->ctl->desc[shm->rank].busy, busy, memory_order_release);
}

sumo_result sumo__shm_settle(sumo__transport *tp, sumo__shm *shm)
{
    sumo__shm_ctl *ctl = shm->ctl;
    int64_t deadline = sumo__now_ns() + tp->timeout_ns;
    /* Peers leave promptly: the caller raised the abort flag, which every wait looks at. No
     * futex here, so the peers' leaving needs no wake. */
    for (int r = 0; r < shm->size; r++) {
        while (r != shm->rank && atomic_load_explicit(&ctl->desc[r].busy, memory_order_acquire) &&
               !atomic_load(&ctl->desc[r].gone) && !atomic_load(&ctl->desc[r].dead)) {
            char why[128];
            if (shm->watch && shm->watch(shm, r, why, sizeof why) == r) break;
            /* Logged, not recorded: the failure the caller reads is the collective's. */
            if (sumo__now_ns() >= deadline) {
                SUMO__LOG(tp->log_level, SUMO__LOG_WARN, "rank %d: rank %d was still inside the "
                          "failed collective at the deadline; its output is left as it is",
                          shm->rank, r);
                return SUMO_ERR_TIMEOUT;
            }
            sched_yield();
        }
    }
    return SUMO_SUCCESS;
}

sumo_result sumo__shm_announce(sumo__transport *tp, sumo__shm *shm, const void *record, void *all,
                               size_t bytes)
{
    sumo__shm_desc *desc = shm->ctl->desc;
    if (bytes > sizeof desc[0].payload[0])
        return SUMO__FAIL(tp, SUMO_ERR_INTERNAL, "announce of %zu bytes", bytes);
    unsigned slot = shm->announces++ & 1u;
    memcpy(desc[shm->rank].payload[slot], record, bytes);
    SUMO__CHECK(sumo__shm_barrier(tp, shm));
    for (int r = 0; r < shm->size; r++)
        memcpy((unsigned char *)all + (size_t)r * bytes, desc[r].payload[slot], bytes);
    return SUMO_SUCCESS;
}

/* ---- shrink --------------------------------------------------------------------------------- */

/* Waits in a shrink poll at this pace: a shrink follows a failure, so a few milliseconds do not
 * count, and polling needs no wake-up protocol between the ranks of a broken group. */
#define SHRINK_SLICE_NS (2 * 1000 * 1000)
#define CLAIM_ROUND_SHIFT 11

/* Whether rank r can no longer enter a shrink: it left the group or its process ended. */
static bool shrink_dead(sumo__shm *shm, int r)
{
    if (atomic_load(&shm->ctl->desc[r].gone)) return true;
    char why[128];
    return shm->watch != NULL && shm->watch(shm, r, why, sizeof why) == r;
}

/* Whether rank r is out of round: not among the previous round's survivors, dead, or absent
 * past the deadline. The previous verdict stays in place until this round is decided. */
static bool shrink_out(sumo__shm *shm, int r, uint32_t round, bool late)
{
    if (round > 1 && !sumo__shrink_member(&shm->ctl->verdict, r)) return true;
    if (shrink_dead(shm, r)) return true;
    return late && atomic_load_explicit(&shm->ctl->desc[r].shrink_round, memory_order_acquire) < round;
}

/* The verdict of round as this rank reads it from the control block. */
static sumo_result shrink_read(sumo__transport *tp, sumo__shm *shm, uint32_t round,
                               sumo__shrink_verdict *out, void **handoff)
{
    sumo__shm_ctl *ctl = shm->ctl;
    *out = ctl->verdict;
    if (handoff) *handoff = ctl->handoff;
    if (out->round != round || !sumo__shrink_member(out, shm->rank))
        return SUMO__FAIL(tp, SUMO_ERR_PEER_FAILURE,
                          "shrink: rank %d was left out of the survivors of round %u (it came "
                          "after the deadline, or was taken for dead)",
                          shm->rank, round);
    out->rank = 0;
    for (int r = 0; r < shm->rank; r++) out->rank += sumo__shrink_member(out, r);
    return SUMO_SUCCESS;
}

sumo_result sumo__shm_shrink_agree(sumo__transport *tp, sumo__shm *shm, uint32_t round,
                                   uint64_t value, int64_t deadline_ns,
                                   sumo_result (*decide)(void *ctx, const sumo__shrink_verdict *v,
                                                         void **handoff),
                                   void *ctx, sumo__shrink_verdict *out, void **handoff)
{
    sumo__shm_ctl *ctl = shm->ctl;
    int me = shm->rank, size = shm->size;
    if (round == 0 || round >= (1u << (32 - CLAIM_ROUND_SHIFT)) || size > 64 * SUMO__SHRINK_WORDS)
        return SUMO__FAIL(tp, SUMO_ERR_INTERNAL, "shrink round %u of %d ranks", round, size);
    uint32_t decided = atomic_load_explicit(&ctl->decided_round, memory_order_acquire);
    if (round > 1 && decided < round - 1)
        return SUMO__FAIL(tp, SUMO_ERR_INVALID_USAGE,
                          "shrink: rank %d entered round %u before round %u was decided", me,
                          round, round - 1);
    if (round > 1 && decided == round - 1 && !sumo__shrink_member(&ctl->verdict, me))
        return SUMO__FAIL(tp, SUMO_ERR_PEER_FAILURE,
                          "shrink: rank %d is not among the survivors of round %u", me, round - 1);
    ctl->desc[me].shrink_value = value;
    atomic_store_explicit(&ctl->desc[me].shrink_round, round, memory_order_release);
    for (;;) {
        if (atomic_load_explicit(&ctl->decided_round, memory_order_acquire) >= round)
            return shrink_read(tp, shm, round, out, handoff);
        bool late = sumo__now_ns() >= deadline_ns;
        /* The decider is the lowest rank still in the round, once nobody else may still come:
         * every rank has entered it or is out. */
        bool lowest = true, all_in = true;
        for (int r = 0; r < size && (lowest || all_in); r++) {
            if (r == me) continue;
            bool out_of_round = shrink_out(shm, r, round, late);
            if (r < me && !out_of_round) lowest = false;
            if (!out_of_round &&
                atomic_load_explicit(&ctl->desc[r].shrink_round, memory_order_acquire) < round)
                all_in = false;
        }
        uint32_t claim = atomic_load(&ctl->claim);
        int claimant = (int)(claim & ((1u << CLAIM_ROUND_SHIFT) - 1)) - 1;
        /* A claim of this round by a rank that is still alive stands: wait for its verdict. A
         * dead claimant's is taken over (it published nothing, or decided_round would say so). */
        bool claimed = (claim >> CLAIM_ROUND_SHIFT) == round && claimant != me &&
                       !shrink_dead(shm, claimant);
        if (lowest && all_in && !claimed) {
            uint32_t mine = (round << CLAIM_ROUND_SHIFT) | (uint32_t)(me + 1);
            if (atomic_compare_exchange_strong(&ctl->claim, &claim, mine)) {
                sumo__shrink_verdict v = {.round = round, .value = UINT64_MAX};
                for (int r = 0; r < size; r++) {
                    if (r != me && (shrink_out(shm, r, round, false) ||
                                    atomic_load_explicit(&ctl->desc[r].shrink_round,
                                                         memory_order_acquire) < round))
                        continue;
                    v.members[r / 64] |= (uint64_t)1 << (r % 64);
                    v.size++;
                    v.value = SUMO__MIN(v.value, ctl->desc[r].shrink_value);
                }
                void *given = NULL;
                if (decide) SUMO__CHECK(decide(ctx, &v, &given));
                ctl->verdict = v;
                ctl->handoff = given;
                atomic_store_explicit(&ctl->decided_round, round, memory_order_release);
                continue;
            }
        }
        if (sumo__now_ns() >= deadline_ns + tp->timeout_ns)
            return SUMO__FAIL(tp, SUMO_ERR_TIMEOUT,
                              "shrink: rank %d had no verdict for round %u within twice the "
                              "deadline (%.3f s)",
                              me, round, 2 * (double)tp->timeout_ns / 1e9);
        struct timespec ts = {.tv_sec = 0, .tv_nsec = SHRINK_SLICE_NS};
        nanosleep(&ts, NULL);
    }
}

bool sumo__shm_region_tables(sumo__shm_region *g, int size)
{
    g->owner_address = calloc((size_t)size, sizeof *g->owner_address);
    g->owner_bytes = calloc((size_t)size, sizeof *g->owner_bytes);
    g->mapped = calloc((size_t)size, sizeof *g->mapped);
    if (g->owner_address && g->owner_bytes && g->mapped) return true;
    sumo__shm_region_tables_free(g);
    return false;
}

void sumo__shm_region_tables_free(sumo__shm_region *g)
{
    free(g->owner_address);
    free(g->owner_bytes);
    free(g->mapped);
    g->owner_address = NULL;
    g->owner_bytes = NULL;
    g->mapped = NULL;
}

/* The region of list holding [address, address + bytes) of rank's process, or NULL. */
static const sumo__shm_region *region_of(const sumo__shm_region *list, int rank,
                                         uint64_t address, size_t bytes)
{
    for (const sumo__shm_region *g = list; g; g = g->next) {
        if (g->mapped == NULL) continue;
        if (sumo__shm_range_inside(g->owner_address[rank], g->owner_bytes[rank], address, bytes))
            return g;
    }
    return NULL;
}

bool sumo__shm_region_shares(const sumo__shm_region *list, int rank, const void *buf, size_t bytes)
{
    return region_of(list, rank, (uint64_t)(uintptr_t)buf, bytes) != NULL;
}

void *sumo__shm_region_peer(const sumo__shm_region *list, int rank, uint64_t address)
{
    /* The collectives ask only for addresses their owner said were shared. A buffer starts
     * inside its region, but its start is also the end of the region mapped just below it,
     * which the kernel often places there: the region holding a byte at address wins, and one
     * that merely ends there serves only an empty buffer at its end. */
    const sumo__shm_region *g = region_of(list, rank, address, 1);
    if (g == NULL) g = region_of(list, rank, address, 0);
    return g ? g->mapped[rank] + (address - g->owner_address[rank]) : NULL;
}

sumo__shm_region *sumo__shm_region_take(sumo__shm_region **list, const void *user)
{
    for (sumo__shm_region **at = list; *at; at = &(*at)->next) {
        sumo__shm_region *g = *at;
        if (g->user != user) continue;
        *at = g->next;
        return g;
    }
    return NULL;
}
