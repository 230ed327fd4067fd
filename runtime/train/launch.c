/*
 * How a job is launched: what a training program decides before dsrt_train,
 * so that a C program that embeds the loop decides it as dstrain does.
 *
 * A data-parallel worker reads its place on its node from the launcher's
 * environment (Open MPI, MPICH's Hydra, Slurm) and computes on that GPU with
 * NCCL, or on the CPU with MPI where there is no GPU or no NCCL. A process
 * started as one of several without asking for data parallelism is refused:
 * each would train the whole job alone into the same outputs. Worker 0
 * chooses the checkpoint of a resume "auto" and tells the others, so that
 * every worker resumes the same one; and the workers agree on which of them,
 * if any, could not start or was stopped by a signal.
 */
#include "runtime/train/internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The launchers' variables: a process's place on its node, and the number
 * of processes of the job (Open MPI, then MPICH's Hydra; Slurm's local id). */
static const char *const LOCAL_RANK_VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                              "SLURM_LOCALID"};
static const char *const WORLD_SIZE_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};

int dsrt_train_local_rank(void) {
    for (size_t i = 0; i < sizeof LOCAL_RANK_VARS / sizeof LOCAL_RANK_VARS[0]; i++) {
        const char *v = getenv(LOCAL_RANK_VARS[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

int dsrt_train_check_launch(const dsrt_train_options *o) {
    if (o && o->execution == DSRT_EXEC_PARALLEL) return 0;
    for (size_t i = 0; i < sizeof WORLD_SIZE_VARS / sizeof WORLD_SIZE_VARS[0]; i++) {
        const char *v = getenv(WORLD_SIZE_VARS[i]);
        if (v && atoi(v) > 1)
            return dsrt__fail(DSRT_EOPTION,
                              "train: started as one of %d processes of an MPI job (%s=%s) "
                              "without --execution-environment parallel: each would train the "
                              "whole job alone and write the same outputs; give "
                              "--execution-environment parallel, or start one process",
                              atoi(v), WORLD_SIZE_VARS[i], v);
    }
    return 0;
}

int dsrt_train_comm_open(dsrt_train_options *o, dsrt_comm **comm) {
    *comm = NULL;
    if (o->execution != DSRT_EXEC_PARALLEL) return 0;
    int rc = dsrt_comm_init(NULL, NULL);
    if (rc != 0) return rc;
    dsrt_comm_options co = o->comm_options;
    int ngpu = dsrt_gpu_count();
    if (ngpu > 0 && dsrt_comm_available(DSRT_COMM_NCCL) == 0) {
        co.kind = DSRT_COMM_NCCL;
        co.device = dsrt_train_local_rank() % ngpu;
    } else {
        co.kind = DSRT_COMM_MPI;
        co.device = DSRT_DEVICE_CPU;
    }
    if ((rc = dsrt_comm_open(comm, &co)) != 0) {
        *comm = NULL;
        dsrt_comm_finalize();
        return rc;
    }
    o->comm = *comm;
    o->gpu = co.kind == DSRT_COMM_NCCL ? co.device : -1;
    return 0;
}

/* What worker 0 found for a resume "auto", as it goes to every worker: its
 * return code and the checkpoint's path or the message. The same size on
 * every worker, whatever their callers' buffers. */
typedef struct {
    int32_t rc;
    char text[4096];
} resume_choice;

int dsrt_train_resume_auto(dsrt_comm *comm, const char *dir, char *path, size_t size, char *skipped,
                           size_t skipped_size) {
    if (skipped && skipped_size) skipped[0] = '\0';
    if (size) path[0] = '\0';
    resume_choice *c = calloc(1, sizeof *c);
    if (!c) return dsrt__fail(-ENOMEM, "train: resume auto: out of memory");
    if (!comm || dsrt_comm_rank(comm) == 0) {
        c->rc =
            dsrt_checkpoint_latest_complete(dir, c->text, sizeof c->text, skipped, skipped_size);
        if (c->rc == -ENOENT)
            c->text[0] = '\0';
        else if (c->rc != 0)
            snprintf(c->text, sizeof c->text, "%s", dsrt_last_error());
    }
    int rc = comm ? dsrt_comm_bcast(comm, c, sizeof *c, 0) : 0;
    if (rc == 0) {
        c->text[sizeof c->text - 1] = '\0';
        if (c->rc != 0 && c->rc != -ENOENT)
            rc = dsrt__fail(c->rc, "%s", c->text);
        else if (strlen(c->text) >= size)
            rc = dsrt__fail(-ENAMETOOLONG, "train: resume auto: %s: longer than %zu bytes", c->text,
                            size ? size - 1 : 0);
        else
            memcpy(path, c->text, strlen(c->text) + 1);
    }
    free(c);
    return rc;
}

int dsrt_train_first_worker(dsrt_comm *comm, int value, int *worker, int *first_value) {
    *worker = value ? 0 : -1;
    *first_value = value;
    if (!comm) return 0;
    int rank = dsrt_comm_rank(comm), world = dsrt_comm_size(comm);
    *worker = value ? rank : -1;
    double *v = calloc((size_t)world, sizeof *v);
    if (!v) return dsrt__fail(-ENOMEM, "train: out of memory");
    v[rank] = value;
    int rc = dsrt_comm_sum_f64(comm, v, (size_t)world);
    if (rc == 0) {
        *worker = -1;
        *first_value = 0;
        for (int k = 0; k < world && *worker < 0; k++)
            if (v[k] != 0) {
                *worker = k;
                *first_value = (int)v[k];
            }
    }
    free(v);
    return rc;
}
