/*
 * `sumo train`: data-parallel training on Fashion-MNIST with any aggregation method, on the
 * threads transport (default), under mpirun, or as the tasks of an srun step. A
 * comma-separated --reduce runs each method in turn with otherwise identical settings and
 * prints a comparison table.
 */
#include "train_options.h"
#include "commands.h"
#include "machine.h"

#include "train/checkpoint.h"
#include "train/trainer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef SUMO_HAVE_MPI
#include "sumo_mpi.h"
#endif
#include "launch.h"

void openblas_set_num_threads(int num_threads);


/* False when the path does not fit out. */
static bool method_log_path(const char *base, const char *method, bool several, char *out, size_t len)
{
    int n;
    const char *dot = strrchr(base, '.');
    if (!several) n = snprintf(out, len, "%s", base);
    else if (dot && strcmp(dot, ".csv") == 0) n = snprintf(out, len, "%.*s.%s.csv", (int)(dot - base), base, method);
    else n = snprintf(out, len, "%s.%s", base, method);
    return n >= 0 && (size_t)n < len;
}

/* A log that cannot be created would otherwise only show up as a missing file after the run:
 * find out before any training. An existing log is opened for appending, so a resume keeps
 * it; a new one is created (the trainer rewrites it from the start). */
static int check_writable(const char *path, const char *what)
{
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(stderr, "sumo train: %s: cannot open the %s: %s\n", path, what, strerror(errno));
        return 1;
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "sumo train: %s: cannot write the %s: %s\n", path, what, strerror(errno));
        return 1;
    }
    return 0;
}

static FILE *open_summary(const char *path)
{
    bool fresh = access(path, F_OK) != 0;
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(stderr, "sumo train: %s: cannot open the summary file: %s\n", path, strerror(errno));
        return NULL;
    }
    if (fresh)
        fprintf(f, "method,workers,batch,total_batch,optimizer,peak_lr,final_accuracy,best_accuracy,"
                   "steps_to_target,epochs_to_target,steps,rounds,bytes,bytes_per_step,"
                   "peak_bytes_in_flight,diverged,wall_s,"
                   "aggregation_s,compute_s,extra_memory_bytes,params,fnv1a,blas_core,kernel_isa\n");
    if (fflush(f) != 0) {
        fprintf(stderr, "sumo train: %s: cannot write the summary file: %s\n", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    return f;
}

/* Rows go out together at the end; a full disk shows up at the latest when the file is closed. */
static int write_summaries(FILE *f, const char *path, const char (*labels)[64],
                           const sumo__train_config *configs, const sumo__train_summary *sums, int n)
{
    for (int k = 0; k < n; k++) {
        const sumo__train_summary *s = &sums[k];
        const sumo__train_config *c = &configs[k];
        /* One worker exchanges nothing (its calls are counted all the same). */
        bool alone = c->workers == 1;
        fprintf(f, "%s,%d,%d,%d,%s,%.6g,%.4f,%.4f,%ld,%.3f,%ld,%llu,%llu,%.1f,%llu,%d,%.2f,%.3f,%.3f,%zu,%zu,"
                   "%016llx,%s,%s\n",
                labels[k], c->workers, c->batch, c->workers * c->batch,
                sumo_optimizer_kind_name(c->optim.kind), c->lr * c->lr_scale, s->final_accuracy,
                s->best_accuracy, s->steps_to_target, s->steps_to_target >= 0 ? s->epochs_to_target : -1.0,
                s->steps, alone ? 0ull : (unsigned long long)s->comm.rounds,
                alone ? 0ull : (unsigned long long)s->comm.bytes,
                alone || s->steps < 1 ? 0.0 : (double)s->comm.bytes / (double)s->steps,
                alone ? 0ull : (unsigned long long)s->peak_bytes_in_flight, s->diverged, s->wall_seconds, s->aggregation_seconds, s->compute_seconds,
                s->extra_memory_bytes, s->nparams, (unsigned long long)s->param_checksum,
                sumo_tool_blas_core(), sumo_tool_kernel_isa());
    }
    bool failed = ferror(f) != 0;
    int saved = errno;
    if (fclose(f) != 0 && !failed) {
        failed = true;
        saved = errno;
    }
    if (failed) {
        fprintf(stderr, "sumo train: %s: cannot write the summary file: %s\n", path, strerror(saved));
        return 1;
    }
    return 0;
}


/* The trainer's own count: whole total batches per epoch, times the epochs. */
static long planned_steps(const sumo__train_config *c, const sumo__dataset *train)
{
    size_t usable = c->train_limit && c->train_limit < train->n ? c->train_limit : train->n;
    return (long)(usable / ((size_t)c->workers * (size_t)c->batch)) * c->epochs;
}

/* Every outer method (SlowMo's presets and DiLoCo's) first takes its outer step over the whole
 * model at the end of step H (tau; with fragments, the last one's turn) and applies it `delay`
 * steps later (sumo_diloco.h; SlowMo's delay is 0). A run shorter than that would never take it,
 * and its workers would end where their local steps left them, without a word. Refused, naming
 * the ways out. --stop-after does not count: a stopped run is resumed towards the same end.
 * 0 or the exit status 2. */
static int check_outer_steps(const sumo__train_config *c, const char *label, const sumo__dataset *train,
                             bool say)
{
    long steps = planned_steps(c, train);
    const sumo_diloco_options *d = &c->outer;
    long first = (long)d->sync_every + d->delay;
    if (!sumo__method_is_outer(c->method) || steps < 1 || steps >= first) return 0;
    if (!say) return 2;
    bool slowmo = sumo__method_is_slowmo(c->method);
    const char *flag = slowmo ? "--tau" : "--sync-every";
    char bound[96], step[128], out[160];
    if (d->delay > 0) snprintf(bound, sizeof bound, "--sync-every %d + --delay %d = %ld", d->sync_every, d->delay, first);
    else snprintf(bound, sizeof bound, "%s %d", flag, d->sync_every);
    if (slowmo) snprintf(step, sizeof step, "the exact average and the slow momentum");
    else if (d->fragments > 1)
        snprintf(step, sizeof step, "the outer optimizer's step on the combined change, for fragment %d of %d",
                 d->fragments, d->fragments);
    else snprintf(step, sizeof step, "the outer optimizer's step on the combined change");
    /* A shorter H must still hold every fragment and the delay (F <= H, delay <= H / F). */
    long h = steps - d->delay;
    if (h >= (long)(d->delay > 0 ? d->delay : 1) * d->fragments) snprintf(out, sizeof out, "%s %ld or less", flag, h);
    else snprintf(out, sizeof out, "a smaller --sync-every and --delay");
    fprintf(stderr, "sumo train: --reduce %s: the run has %ld step(s) (%d epoch(s) of %ld), fewer than %s: its "
                    "outer step (%s) would never run%s. Give %s, more --epochs or a smaller --batch\n",
            label, steps, c->epochs, steps / c->epochs, bound, step,
            c->workers > 1 ? " and the workers would end unsynchronised" : "", out);
    return 2;
}

/* A SlowMo run whose last steps came after its last exchange ends with different parameters
 * on each worker: the table's accuracy is then their average's (the trainer scores that), the
 * hash rank 0's own. Said after the table, so that no reader takes them for one model. */
static void note_unsynchronised_end(const char *label, const sumo__train_config *c, long steps)
{
    const sumo_diloco_options *so = &c->outer;
    if (!sumo__method_is_slowmo(c->method) || c->workers < 2 || so->sync_every == 0 ||
        steps < so->sync_every)
        return;
    long after = steps % so->sync_every;
    if (after == 0 || (so->inner_period > 0 && after % so->inner_period == 0)) return;
    printf("%s: the last %ld of %ld steps came after the last exchange (every %d steps): the workers "
           "end with different parameters; the accuracy is their average's, the parameter hash rank 0's\n",
           label, after, steps, so->inner_period > 0 ? so->inner_period : so->sync_every);
}

static void print_table(const train_options *o, const sumo__train_config *configs, const sumo__train_summary *sums)
{
    const sumo__train_config *c0 = &configs[0];
    printf("\nFashion-MNIST, %s, %d workers x batch %d = total batch %d, %d epoch(s), %s, seed %llu\n",
           c0->model == SUMO__MODEL_CNN ? "cnn" : "mlp", c0->workers, c0->batch,
           c0->workers * c0->batch, c0->epochs, sumo_optimizer_kind_name(c0->optim.kind),
           (unsigned long long)c0->seed);
    if (c0->target_accuracy > 0)
        printf("target: %.2f%% test accuracy (--target)\n", 100 * c0->target_accuracy);
    else
        printf("target: none (--target 0)\n");
    printf("%-18s %8s %9s %9s %9s %7s %9s %8s %10s %8s\n", "method", "peak lr", "final acc",
           "best acc", "to target", "steps", "comm MiB", "rounds", "agg share", "wall s");
    /* One worker exchanges nothing, though its calls still pass through the collectives and
     * are counted there: figures of communication would mean nothing. */
    bool alone = c0->workers == 1;
    for (int k = 0; k < o->nmethods; k++) {
        const sumo__train_summary *s = &sums[k];
        char target[32], mib[32] = "-", rounds[32] = "-";
        if (s->steps_to_target >= 0) snprintf(target, sizeof target, "%.2f ep", s->epochs_to_target);
        else snprintf(target, sizeof target, "%s", s->diverged ? "diverged" : "-");
        if (!alone) {
            snprintf(mib, sizeof mib, "%.1f", (double)s->comm.bytes / (1024.0 * 1024.0));
            snprintf(rounds, sizeof rounds, "%llu", (unsigned long long)s->comm.rounds);
        }
        double share = s->aggregation_seconds / (s->aggregation_seconds + s->compute_seconds + 1e-12);
        printf("%-18s %8.4f %8.2f%% %8.2f%% %9s %7ld %9s %8s %9.1f%% %8.1f%s\n",
               o->labels[k], configs[k].lr * configs[k].lr_scale,
               100 * s->final_accuracy, 100 * s->best_accuracy, target, s->steps, mib, rounds,
               100 * share, s->wall_seconds, s->diverged ? "  DIVERGED (loss not finite)" : "");
    }
    /* A newcomer cannot guess these; one line each, once. */
    char target[64];
    if (c0->target_accuracy > 0) snprintf(target, sizeof target, "%.2f%%", 100 * c0->target_accuracy);
    else snprintf(target, sizeof target, "none set");
    printf("columns:\n"
           "  method     the --reduce entry (METHOD@S: with its own --lr-scaling S)\n"
           "  peak lr    --lr times the scaling, reached after --warmup-epochs\n"
           "  final acc  test accuracy at the last evaluation\n"
           "  best acc   best test accuracy at any evaluation\n"
           "  to target  epochs until an evaluation first reached the target (%s); -: never\n"
           "  steps      optimizer steps, each on workers x batch items\n"
           "  comm MiB   bytes rank 0 exchanged in collectives, in MiB (-: one worker exchanges nothing)\n"
           "  rounds     collective calls of rank 0 (-: one worker)\n"
           "  agg share  time in the distributed step (waiting for peers included) / step time\n"
           "  wall s     wall-clock seconds\n", target);
}

/* Every rank must leave together when one finds a problem before training: a rank that
 * returned alone would leave the others waiting for it until their deadline. The worst code
 * wins; a rank that cannot even ask has lost its peers. */
static int agree(sumo_comm *comm, int size, int rc)
{
    if (!comm || size < 2) return rc;
    double mine = rc, *all = malloc((size_t)size * sizeof *all);
    int worst = rc ? rc : 1;
    if (all && sumo_allgather(&mine, all, 1, SUMO_FLOAT64, comm) == SUMO_SUCCESS) {
        worst = rc;
        for (int r = 0; r < size; r++)
            if ((int)all[r] > worst) worst = (int)all[r];
    }
    free(all);
    return worst;
}

int sumo_cmd_train(int argc, char **argv)
{
    train_options o = {0};
    int rc = train_parse_options(argc, argv, &o);
    if (rc == 1) return 0; /* --help */
    if (rc) return rc;
    openblas_set_num_threads(1); /* one BLAS thread per worker: the workers share the cores */
    int rank = 0, size = 1, asked = o.cfg.workers;
    char err[1024] = "";
    launch how;
    if ((rc = launch_detect(o.transport, &how, err, sizeof err)) != 0) {
        fprintf(stderr, "sumo train: %s\n", err);
        return rc;
    }
    sumo_comm *comm = NULL; /* NULL: worker threads */
    sumo_store *store = NULL; /* an elastic srun step's: survivors regroup through it */
    if (o.cfg.elastic && (how.kind == LAUNCH_MPI || o.nmethods > 1)) {
        fprintf(stderr, "sumo train: --elastic %s\n",
                how.kind == LAUNCH_MPI ? "needs a communicator that can shrink: worker threads or the tasks of "
                                         "a plain srun step (Open MPI 4.1 has no ULFM, and mpirun ends the "
                                         "job when a rank dies)"
                                       : "trains one method at a time");
        return 2;
    }
    for (int i = 0; i < o.cfg.nevents; i++)
        if (o.cfg.events[i].kind == SUMO__EVENT_JOIN && how.kind != LAUNCH_THREADS) {
            /* A task joins a job through its launcher; srun's steps are fixed at their start. */
            fprintf(stderr, "sumo train: --join adds worker threads; srun starts a step's tasks at once "
                            "(processes that join a running job: sumo.torch's python -m sumo.launch --join)\n");
            return 2;
        }
    if (how.kind == LAUNCH_MPI) {
#ifdef SUMO_HAVE_MPI
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) != SUMO_SUCCESS) {
            fprintf(stderr, "sumo train: cannot create the MPI communicator\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
#else
        fprintf(stderr, "sumo train: this build has no MPI (install libopenmpi-dev and rebuild)\n");
        return 2;
#endif
    }
    sumo_elastic *membership = NULL; /* --store: this process's place in the job */
    sumo_store *dir_store = NULL;
    if (o.store_dir) {
        if (how.kind != LAUNCH_THREADS) {
            fprintf(stderr, "sumo train: --store DIR runs processes started on their own, not under %s\n",
                    how.launcher);
            return 2;
        }
        if (!o.joiner && o.store_rank >= o.cfg.workers) {
            fprintf(stderr, "sumo train: --rank %d of --workers %d (0 to %d)\n", o.store_rank, o.cfg.workers,
                    o.cfg.workers - 1);
            return 2;
        }
        if (launch_join_store(o.store_dir, o.store_rank, o.cfg.workers, o.joiner, &dir_store, &membership, err,
                              sizeof err) != 0) {
            fprintf(stderr, "sumo train: %s\n", err);
            return 1;
        }
        sumo_elastic_comm(membership, &comm);
        sumo_comm_rank(comm, &rank);
        sumo_comm_size(comm, &size);
        o.cfg.membership = membership;
    } else if (how.kind == LAUNCH_SRUN) {
        rank = how.rank;
        size = how.size;
        if (launch_join_srun(&how, &comm, o.cfg.elastic ? &store : NULL, err, sizeof err) != 0) {
            fprintf(stderr, "sumo train: %s\n", err);
            return 1;
        }
    }
    if (comm) {
        o.cfg.workers = size;
        if (rank != 0) o.cfg.progress = false;
    }
    bool several = o.nmethods > 1, broken = false;
    char log_paths[MAX_METHODS][1024], ckpt_dirs[MAX_METHODS][1024];
    FILE *summary = NULL;
    sumo__dataset train = {0}, test = {0};
    sumo__train_summary summaries[MAX_METHODS];
    sumo__train_config configs[MAX_METHODS];
    if (comm && o.workers_given && asked != size && !o.joiner) {
        /* Every rank sees the same flags and size, so all leave here together. */
        if (rank == 0)
            fprintf(stderr, "sumo train: --workers %d, but under %s the processes are the workers "
                            "(this job has %d): start %d with %s %s %d, or leave --workers out\n",
                    asked, how.launcher, size, asked, how.launcher,
                    strcmp(how.launcher, "srun") == 0 ? "-n" : "-np", asked);
        rc = 2;
    }
    for (int k = 0; k < o.nmethods && rc == 0; k++) {
        sumo__train_config *c = &configs[k];
        if ((rc = train_configure_method(&o, o.methods[k], o.scalings[k], c)) != 0) break;
        c->label = o.labels[k];
        if (o.log_path) {
            if (!method_log_path(o.log_path, o.labels[k], several, log_paths[k], sizeof log_paths[k])) {
                fprintf(stderr, "sumo train: --log %s: the path is too long\n", o.log_path);
                rc = 2;
                break;
            }
            c->log_path = log_paths[k];
            if (rank == 0) rc = check_writable(c->log_path, "log");
        }
        if (c->checkpoint_dir) {
            /* Methods of one run would otherwise write the same step-N files over each other. */
            int n = several ? snprintf(ckpt_dirs[k], sizeof ckpt_dirs[k], "%s/%s", o.cfg.checkpoint_dir, o.labels[k])
                            : snprintf(ckpt_dirs[k], sizeof ckpt_dirs[k], "%s", o.cfg.checkpoint_dir);
            if (n < 0 || (size_t)n >= sizeof ckpt_dirs[k]) {
                fprintf(stderr, "sumo train: --checkpoint-dir %s: the path is too long\n", o.cfg.checkpoint_dir);
                rc = 2;
                break;
            }
            if (several && mkdir(o.cfg.checkpoint_dir, 0700) != 0 && errno != EEXIST) {
                fprintf(stderr, "sumo train: %s: cannot create the checkpoint folder: %s\n",
                        o.cfg.checkpoint_dir, strerror(errno));
                rc = 1;
            }
            c->checkpoint_dir = ckpt_dirs[k];
            if (rc == 0 && sumo__checkpoint_prepare(c->checkpoint_dir, c->resume, o.overwrite, rank == 0,
                                                    err, sizeof err) != SUMO_SUCCESS) {
                fprintf(stderr, "sumo train: %s\n", err);
                rc = 1;
            }
        }
    }
    if (rc == 0 && rank == 0 && o.summary_path && (summary = open_summary(o.summary_path)) == NULL) rc = 1;
    /* A process joining a --store job comes into a group whose members agreed already. */
    if (o.joiner ? rc != 0 : (rc = agree(comm, size, rc)) != 0) goto out;

    sumo_result r = sumo__dataset_load(o.data_dir, true, &train, err, sizeof err);
    if (r == SUMO_SUCCESS) r = sumo__dataset_load(o.data_dir, false, &test, err, sizeof err);
    if (r != SUMO_SUCCESS) {
        fprintf(stderr, "sumo train: %s\n", err);
        rc = 1;
        goto out;
    }
    for (int k = 0; k < o.nmethods && rc == 0; k++) rc = check_outer_steps(&configs[k], o.labels[k], &train, rank == 0);
    if (rc) goto out;
    for (int k = 0; k < o.nmethods; k++) {
        sumo__train_config *c = &configs[k];
        c->store = store;
        err[0] = '\0';
        r = comm ? sumo__train_rank(&comm, o.joiner ? 0 : -1, c, &train, &test, &summaries[k], err, sizeof err)
                     : sumo__train_threads(c, &train, &test, &summaries[k], err, sizeof err);
        if (r == SUMO_SUCCESS && summaries[k].lost) {
            /* This task left or died on purpose (--leave, --kill): the others go on. */
            fprintf(stderr, "sumo train: worker %d left at step %ld\n", rank, summaries[k].steps);
            goto out;
        }
        if (comm) sumo_comm_rank(comm, &rank);
        if (r != SUMO_SUCCESS) {
            fprintf(stderr, "sumo train: %s: %s (%s)\n", o.labels[k],
                    err[0] ? err : sumo_strerror(r), sumo_result_name(r));
            rc = 1;
            broken = true;
            goto out;
        }
    }
    if (rank == 0) {
        print_table(&o, configs, summaries);
        for (int k = 0; k < o.nmethods; k++)
            note_unsynchronised_end(o.labels[k], &configs[k], summaries[k].steps);
        for (int k = 0; k < o.nmethods; k++) {
            printf("%s: %zu parameters, fnv1a %016llx, extra memory %zu bytes", o.labels[k],
                   summaries[k].nparams, (unsigned long long)summaries[k].param_checksum,
                   summaries[k].extra_memory_bytes);
            const sumo__train_summary *s = &summaries[k];
            if (configs[k].workers > 1 && s->steps > 0)
                printf(", %.1f bytes sent per step, at most %llu in flight", (double)s->comm.bytes / (double)s->steps,
                       (unsigned long long)s->peak_bytes_in_flight);
            printf("\n");
        }
        for (int k = 0; k < o.nmethods; k++)
            if (configs[k].elastic)
                printf("%s: elastic, ended with %d workers (started with %d)\n", o.labels[k],
                       summaries[k].workers, configs[k].workers);
        /* The hashes hold for machines that agree on these (machine.h says why). */
        printf("bits depend on the code, the flags and: OpenBLAS core %s, sumo kernels %s\n",
               sumo_tool_blas_core(), sumo_tool_kernel_isa());
        if (summary) {
            FILE *f = summary;
            summary = NULL;
            if (write_summaries(f, o.summary_path, o.labels, configs, summaries, o.nmethods) != 0) rc = 1;
        }
    }
    if (rank != 0 && membership) /* each process of a --store job says what it holds */
        for (int k = 0; k < o.nmethods; k++)
            printf("%s: %zu parameters, fnv1a %016llx (worker %d of %d)\n", o.labels[k], summaries[k].nparams,
                   (unsigned long long)summaries[k].param_checksum, rank, summaries[k].workers);
out:
    if (summary) fclose(summary);
    sumo__dataset_free(&train);
    sumo__dataset_free(&test);
#ifdef SUMO_HAVE_MPI
    if (how.kind == LAUNCH_MPI) {
        /* After a failure in training the group may be broken (a peer stopped, died or left):
         * MPI_Finalize would then wait for it forever. Only ending the job frees the others. */
        if (broken && size > 1) {
            fflush(stdout);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, rc);
        }
        /* A rank that finished (--stop-after) while its peers did not cannot meet them to
         * free the communicator either: the same applies. */
        if (sumo_comm_destroy(comm) != SUMO_SUCCESS && size > 1) {
            fflush(stdout);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, rc ? rc : 1);
        }
        MPI_Finalize();
        comm = NULL;
    }
#endif
    if (membership) {
        /* The others may still be inside the last step's collectives: meet once more before
         * leaving; processes still waiting to join have nothing left to join. */
        if (rc == 0 && comm) sumo_barrier(comm);
        if (rank == 0) sumo_elastic_close(membership);
        sumo_elastic_destroy(membership);
        sumo_store_destroy_dir(dir_store, 0);
        comm = NULL;
    }
    /* The store's files go once every survivor is past its last regrouping: after a
     * barrier on the final communicator (a failed one leaves them for the folder's owner). */
    if (store) {
        bool all_done = comm && rc == 0 && sumo_barrier(comm) == SUMO_SUCCESS;
        sumo_store_destroy_dir(store, all_done && rank == 0);
    }
    /* Over shared memory leaving needs nobody: the peers of a rank that failed see it gone. */
    if (comm) sumo_comm_destroy(comm);
    (void)size;
    (void)broken;
    return rc;
}
