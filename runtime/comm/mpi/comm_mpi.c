/*
 * The MPI engine of the communicators: host collectives and gradient
 * buckets over Open MPI, with deadlines.
 *
 * Each communicator duplicates MPI_COMM_WORLD three times, so that work
 * issued by different threads never shares an ordering: `coll` for the
 * blocking sums and broadcasts of the training thread (metrics, averaging,
 * sync batchnorm), `grad` for the bucket all-reduces, which only the
 * communication thread issues, and `hb` for heartbeats.
 *
 * The communication thread makes MPI progress while backward runs: Open
 * MPI's shared-memory and TCP transports advance a nonblocking collective
 * only inside MPI calls, so the thread starts each bucket's MPI_Iallreduce
 * (in place) the moment the gradient hook queues it and keeps testing the
 * requests in flight. While backward computes it naps 5 to 160 us between
 * rounds on its condition variable (a newly queued bucket ends the nap);
 * once backward is over (the last bucket queued, or grads_wait waiting) it
 * polls without naps, since the sums are then all there is to do. Between
 * steps it sleeps on the condition variable and wakes for heartbeats.
 *
 * Open MPI's nonblocking all-reduce defaults to a binomial tree that runs
 * large buffers at half the speed of the blocking call; dsrt_comm_init asks
 * for the ring instead (see dsrt__comm_mpi_init).
 *
 * Heartbeats name the ranks a timed-out collective waits for: every period
 * (a tenth of the timeout, within 0.05 .. 2 s) each rank's thread sends every
 * other rank how many host collectives and bucket reductions it has entered.
 * A rank not heard from for three periods is "not responding" (dead, stopped
 * or stuck outside dsrt); one heard from but behind has "not arrived" at the
 * collective. Open MPI itself ends the whole job when a process dies (mpirun
 * sees the exit), so the timeout is what catches a rank that hangs.
 *
 * Every wait polls MPI_Test with a deadline: MPI has no cancellable
 * collectives, so a collective that times out breaks the communicator.
 *
 * It is the module dsrt_mpi.so (core/module.h), which comm.c loads when a
 * communicator first asks for it.
 */
#include "runtime/comm/comm_internal.h"
#include "core/module.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DSRT_HAVE_MPI
#include <mpi.h>

#define HB_TAG     17
#define CHUNK      (1 << 30) /* MPI counts are int: larger arrays go in chunks */
#define HB_MISSING 3.0       /* periods without a heartbeat: not responding */

/* Whether dsrt_comm_init initialised MPI, so finalize should end it. */
static atomic_int mpi_ours;

struct comm_mpi {
    MPI_Comm coll, grad, hb;
    int have_coll, have_grad, have_hb;
    int with_grads;
    double hb_period;

    /* The communication thread. */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* wakes the thread: a bucket queued, stop */
    pthread_cond_t done; /* wakes grads_wait: a bucket finished */
    int stop;
    /* Until then poll without naps: backward is over (the last bucket is
     * queued, or the training thread waits), so the sums are all there is
     * to do. 100 ms after, the peers are late, not the transfer. */
    double hurry_until;

    /* Buckets: queued by the hook, started and tested by the thread. */
    int *queue; /* (n_bk) ring of bucket indices */
    int q_head, q_tail, q_len;
    MPI_Request *req; /* (n_bk) */
    int *inflight;    /* (n_bk) bucket indices with a request */
    int n_inflight;
    int n_done;  /* buckets of this step whose sum is complete */
    int in_mpi;  /* the thread is in an MPI call on a bucket (mu released) */
    int issuing; /* ... and that call starts a bucket's sum */
    int *own;    /* (n_bk) buckets grads_wait started and tests itself */
    int n_own;
    uint64_t gen; /* bumped when the buckets go (detach): the thread forgets */
    int err;      /* an MPI failure in the thread, for wait */
    char errmsg[256];
    int64_t *bucket_seq; /* (n_bk) grad position each bucket was given */

    /* Positions for heartbeats: collectives entered on each channel. */
    atomic_llong seq[2];
    /* Peers as the heartbeats tell (under mu). */
    double *last_seen; /* (size) local clock of the last heartbeat, 0: never */
    int64_t *peer_seq; /* (size x 2) */
    double opened_s;
    /* Heartbeat traffic (the thread's alone until it is joined). */
    int64_t hb_in[2];
    MPI_Request hb_recv;
    int64_t *hb_out;      /* (size x 2) one buffer per peer */
    MPI_Request *hb_send; /* (size) */
    long long *hb_sent;   /* (size) messages sent to each peer */
    long long *hb_got;    /* (size) received from each */
    double hb_next;
};

static int mpi_fail(int err, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", err);
    return dsrt__fail(DSRT_EBACKEND, "comm: %s: MPI: %s", what, s);
}

/* Waits on cv (mu held; both condition variables use CLOCK_MONOTONIC) for
 * at most seconds. */
static void cond_wait_for(pthread_cond_t *cv, pthread_mutex_t *mu, double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = ts.tv_nsec + (long)((seconds - (double)(time_t)seconds) * 1e9);
    ts.tv_sec += (time_t)seconds + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

static void nap(int *round) {
    /* 5 us, doubling to 200 us: buckets progress while backward runs
     * without spinning on a core that backward needs. */
    long ns = 5000L << DSRT_MIN(*round, 5);
    if (ns > 200000) ns = 200000;
    (*round)++;
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

/* "rank 1 not responding (last heard 12.0 s ago); rank 3 has not arrived
 * (it entered 41, this is 42)" for a collective at position seq of chan. */
static void name_missing(dsrt_comm *c, int chan, int64_t seq, char *buf, size_t size) {
    comm_mpi *m = c->mpi;
    double now = dsrt__comm_now(), quiet = HB_MISSING * m->hb_period;
    size_t at = 0;
    int named = 0;
    buf[0] = 0;
    pthread_mutex_lock(&m->mu);
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        double seen = m->last_seen[p];
        int64_t ps = m->peer_seq[2 * p + chan];
        int n = 0;
        if (seen == 0 && now - m->opened_s > quiet)
            n = snprintf(buf + at, size - at, "%srank %d not responding (never heard from)",
                         named ? "; " : "", p);
        else if (seen > 0 && now - seen > quiet)
            n = snprintf(buf + at, size - at, "%srank %d not responding (last heard %.1f s ago)",
                         named ? "; " : "", p, now - seen);
        else if (seen > 0 && ps < seq)
            n = snprintf(buf + at, size - at,
                         "%srank %d has not arrived (it is at %s call %lld, this is %lld)",
                         named ? "; " : "", p, chan == CHAN_COLL ? "collective" : "bucket",
                         (long long)ps, (long long)seq);
        if (n > 0 && (size_t)n < size - at) {
            at += (size_t)n;
            named++;
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (!named) snprintf(buf, size, "the missing rank(s) are unknown");
}

static int timeout_fail(dsrt_comm *c, int chan, int64_t seq, const char *what) {
    char who[512];
    name_missing(c, chan, seq, who, sizeof who);
    dsrt__comm_break(c);
    return dsrt__fail(-ETIMEDOUT, "comm: %s: not complete after %g s on rank %d of %d: %s", what,
                      c->o.timeout_s, c->rank, c->size, who);
}

/* Waits for request r of the training thread with the deadline. The
 * thread has nothing else to do: it polls as a blocking MPI call would
 * (yielding the core to anything that wants it) for the first 100 ms, then
 * naps between polls, so that a wait for a late or lost peer does not hold
 * a core for the whole timeout. */
static int wait_request(dsrt_comm *c, MPI_Request *r, int64_t seq, const char *what) {
    double start = dsrt__comm_now(), deadline = start + c->o.timeout_s;
    int round = 0;
    for (;;) {
        int flag = 0, e = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) {
            dsrt__comm_break(c);
            return mpi_fail(e, what);
        }
        if (flag) return 0;
        double now = dsrt__comm_now();
        if (now > deadline) return timeout_fail(c, CHAN_COLL, seq, what);
        if (now - start < 0.1)
            sched_yield();
        else
            nap(&round);
    }
}

static int64_t mpi_enter(dsrt_comm *c, int chan) {
    return atomic_fetch_add(&c->mpi->seq[chan], 1) + 1;
}

static int mpi_timeout(dsrt_comm *c, int chan, int64_t seq, const char *what) {
    return timeout_fail(c, chan, seq, what);
}

// ----------------------------------------------------------------------------
// Host collectives (the training thread, on `coll`)

static int mpi_sum(dsrt_comm *c, void *x, size_t n, int f64, const char *what) {
    comm_mpi *m = c->mpi;
    size_t elem = f64 ? sizeof(double) : sizeof(float);
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += CHUNK) {
        int k = (int)DSRT_MIN(n - off, (size_t)CHUNK);
        int64_t seq = atomic_fetch_add(&m->seq[CHAN_COLL], 1) + 1;
        MPI_Request r;
        int e = MPI_Iallreduce(MPI_IN_PLACE, (char *)x + off * elem, k,
                               f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, m->coll, &r);
        if (e != MPI_SUCCESS) return mpi_fail(e, what);
        if ((e = wait_request(c, &r, seq, what))) return e;
        if (n == 0) break;
    }
    return 0;
}

static int mpi_bcast(dsrt_comm *c, void *buf, size_t bytes, int root, const char *what) {
    comm_mpi *m = c->mpi;
    for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += CHUNK) {
        int k = (int)DSRT_MIN(bytes - off, (size_t)CHUNK);
        int64_t seq = atomic_fetch_add(&m->seq[CHAN_COLL], 1) + 1;
        MPI_Request r;
        int e = MPI_Ibcast((char *)buf + off, k, MPI_BYTE, root, m->coll, &r);
        if (e != MPI_SUCCESS) return mpi_fail(e, what);
        if ((e = wait_request(c, &r, seq, what))) return e;
        if (bytes == 0) break;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// The communication thread

static void hb_received(comm_mpi *m, int src) {
    pthread_mutex_lock(&m->mu);
    m->last_seen[src] = dsrt__comm_now();
    m->peer_seq[2 * src] = m->hb_in[0];
    m->peer_seq[2 * src + 1] = m->hb_in[1];
    pthread_mutex_unlock(&m->mu);
    m->hb_got[src]++;
}

/* Takes heartbeats in and sends them out when due. Returns an MPI error. */
static int heartbeat(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        int e = MPI_Test(&m->hb_recv, &flag, &st);
        if (e != MPI_SUCCESS) return e;
        if (!flag) break;
        hb_received(m, st.MPI_SOURCE);
        e = MPI_Irecv(m->hb_in, 2, MPI_INT64_T, MPI_ANY_SOURCE, HB_TAG, m->hb, &m->hb_recv);
        if (e != MPI_SUCCESS) return e;
    }
    double now = dsrt__comm_now();
    if (now < m->hb_next) return MPI_SUCCESS;
    m->hb_next = now + m->hb_period;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        int flag = 1;
        if (m->hb_send[p] != MPI_REQUEST_NULL) {
            int e = MPI_Test(&m->hb_send[p], &flag, MPI_STATUS_IGNORE);
            if (e != MPI_SUCCESS) return e;
        }
        if (!flag) continue; /* the last one to p is still on its way */
        m->hb_out[2 * p] = atomic_load(&m->seq[CHAN_COLL]);
        m->hb_out[2 * p + 1] = atomic_load(&m->seq[CHAN_GRAD]);
        int e = MPI_Isend(m->hb_out + 2 * p, 2, MPI_INT64_T, p, HB_TAG, m->hb, &m->hb_send[p]);
        if (e != MPI_SUCCESS) return e;
        m->hb_sent[p]++;
    }
    return MPI_SUCCESS;
}

/* Starts the queued buckets and tests those in flight (with m->mu held,
 * released around MPI calls). Returns an MPI error code. */
static int pump_buckets(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    while (m->q_len > 0) {
        int k = m->queue[m->q_head];
        m->q_head = (m->q_head + 1) % c->n_bk;
        m->q_len--;
        dsrt_range r = c->bk[k];
        m->bucket_seq[k] = atomic_fetch_add(&m->seq[CHAN_GRAD], 1) + 1;
        float *x = c->mem.grads + r.offset;
        MPI_Request *rq = &m->req[k];
        uint64_t gen = m->gen;
        m->in_mpi = m->issuing = 1;
        pthread_mutex_unlock(&m->mu);
        int e = MPI_Iallreduce(MPI_IN_PLACE, x, (int)r.count, MPI_FLOAT, MPI_SUM, m->grad, rq);
        pthread_mutex_lock(&m->mu);
        m->in_mpi = m->issuing = 0;
        pthread_cond_broadcast(&m->done);
        if (m->gen != gen) return MPI_SUCCESS;
        if (e != MPI_SUCCESS) return e;
        m->inflight[m->n_inflight++] = k;
    }
    for (int i = 0; i < m->n_inflight;) {
        int k = m->inflight[i], flag = 0;
        MPI_Request *rq = &m->req[k];
        uint64_t gen = m->gen;
        m->in_mpi = 1;
        pthread_mutex_unlock(&m->mu);
        int e = MPI_Test(rq, &flag, MPI_STATUS_IGNORE);
        pthread_mutex_lock(&m->mu);
        m->in_mpi = 0;
        pthread_cond_broadcast(&m->done);
        if (m->gen != gen) return MPI_SUCCESS;
        if (e != MPI_SUCCESS) return e;
        if (!flag) {
            i++;
            continue;
        }
        c->times[k].done_s = dsrt__comm_now();
        m->inflight[i] = m->inflight[--m->n_inflight];
        m->n_done++;
        pthread_cond_broadcast(&m->done);
    }
    return MPI_SUCCESS;
}

static void *comm_thread(void *arg) {
    dsrt_comm *c = arg;
    comm_mpi *m = c->mpi;
    int round = 0;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        int e = m->err ? MPI_SUCCESS : pump_buckets(c);
        if (e == MPI_SUCCESS && !m->err) {
            pthread_mutex_unlock(&m->mu);
            e = heartbeat(c);
            pthread_mutex_lock(&m->mu);
        }
        if (e != MPI_SUCCESS && !m->err) {
            char s[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(e, s, &len);
            snprintf(m->errmsg, sizeof m->errmsg, "%s", s);
            m->err = e;
            pthread_cond_broadcast(&m->done);
        }
        if (m->stop) break;
        if (m->q_len > 0) continue; /* start it now */
        if (m->n_inflight > 0) {
            /* While backward computes, naps leave it the core (a queued
             * bucket or grads_wait ends one at once); once backward is
             * over, the sums are all there is to do. */
            if (dsrt__comm_now() < m->hurry_until) {
                pthread_mutex_unlock(&m->mu);
                sched_yield();
                pthread_mutex_lock(&m->mu);
            } else {
                cond_wait_for(&m->cv, &m->mu, 5e-6 * (1 << DSRT_MIN(round, 5)));
                round++;
            }
            continue;
        }
        round = 0;
        /* Idle: sleep until a bucket is queued or the next heartbeat. */
        double wait = m->hb_next - dsrt__comm_now();
        if (wait > 0) cond_wait_for(&m->cv, &m->mu, DSRT_MIN(wait, 1.0));
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

// ----------------------------------------------------------------------------
// Gradient buckets (queued by the hook, reduced by the thread)

static void mpi_grad_detach(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    pthread_mutex_lock(&m->mu);
    /* The thread finishes the MPI call it is in, then sees gen changed. */
    while (m->in_mpi) cond_wait_for(&m->done, &m->mu, 0.01);
    m->gen++;
    /* Requests still in flight (a communicator that broke) are left to MPI;
     * the thread forgets them. */
    free(m->queue);
    free(m->req);
    free(m->inflight);
    free(m->bucket_seq);
    free(m->own);
    m->own = NULL;
    m->n_own = 0;
    m->q_head = m->q_tail = m->q_len = m->n_inflight = m->n_done = 0;
    m->queue = NULL;
    m->req = NULL;
    m->inflight = NULL;
    m->bucket_seq = NULL;
    pthread_mutex_unlock(&m->mu);
}

static int mpi_grad_attach(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    int n = c->n_bk;
    mpi_grad_detach(c);
    pthread_mutex_lock(&m->mu);
    m->queue = dsrt__calloc((size_t)n + 1, sizeof *m->queue);
    m->req = dsrt__calloc((size_t)n + 1, sizeof *m->req);
    m->inflight = dsrt__calloc((size_t)n + 1, sizeof *m->inflight);
    m->bucket_seq = dsrt__calloc((size_t)n + 1, sizeof *m->bucket_seq);
    m->own = dsrt__calloc((size_t)n + 1, sizeof *m->own);
    int ok = m->queue && m->req && m->inflight && m->bucket_seq && m->own;
    pthread_mutex_unlock(&m->mu);
    return ok ? 0 : -ENOMEM;
}

static void mpi_grad_start(dsrt_comm *c, int k) {
    comm_mpi *m = c->mpi;
    pthread_mutex_lock(&m->mu);
    m->queue[m->q_tail] = k;
    m->q_tail = (m->q_tail + 1) % c->n_bk;
    m->q_len++;
    if (k == c->n_bk - 1) m->hurry_until = dsrt__comm_now() + 0.1;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

/* grads_wait starts the buckets still queued itself (the thread is not
 * starting one: the order of the starts stays the queue's), so the last
 * bucket, queued as backward ends, waits for no thread to be scheduled.
 * With mu held. */
static int start_queued(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    while (m->issuing) cond_wait_for(&m->done, &m->mu, 0.001);
    while (m->q_len > 0) {
        int k = m->queue[m->q_head];
        m->q_head = (m->q_head + 1) % c->n_bk;
        m->q_len--;
        dsrt_range r = c->bk[k];
        m->bucket_seq[k] = atomic_fetch_add(&m->seq[CHAN_GRAD], 1) + 1;
        int e = MPI_Iallreduce(MPI_IN_PLACE, c->mem.grads + r.offset, (int)r.count, MPI_FLOAT,
                               MPI_SUM, m->grad, &m->req[k]);
        if (e != MPI_SUCCESS) return e;
        m->own[m->n_own++] = k;
    }
    return MPI_SUCCESS;
}

/* Tests the buckets grads_wait started (mu held, released around MPI). */
static int test_own(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    for (int i = 0; i < m->n_own;) {
        int k = m->own[i], flag = 0;
        pthread_mutex_unlock(&m->mu);
        int e = MPI_Test(&m->req[k], &flag, MPI_STATUS_IGNORE);
        pthread_mutex_lock(&m->mu);
        if (e != MPI_SUCCESS) return e;
        if (!flag) {
            i++;
            continue;
        }
        c->times[k].done_s = dsrt__comm_now();
        m->own[i] = m->own[--m->n_own];
        m->n_done++;
    }
    return MPI_SUCCESS;
}

static int mpi_grad_wait(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    double deadline = dsrt__comm_now() + c->o.timeout_s;
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    double start = dsrt__comm_now();
    m->hurry_until = start + 0.1;
    pthread_cond_signal(&m->cv);
    int e = m->err ? MPI_SUCCESS : start_queued(c);
    while (e == MPI_SUCCESS && m->n_done < c->n_announced && !m->err) {
        if ((e = test_own(c)) != MPI_SUCCESS || m->n_done >= c->n_announced) break;
        double now = dsrt__comm_now(), left = deadline - now;
        if (left <= 0) break;
        if (now - start < 0.1) {
            /* The last sums take microseconds: look again at once rather
             * than sleep until the thread's signal is scheduled. */
            pthread_mutex_unlock(&m->mu);
            sched_yield();
            pthread_mutex_lock(&m->mu);
            continue;
        }
        cond_wait_for(&m->done, &m->mu, DSRT_MIN(left, m->n_own ? 0.001 : 0.5));
    }
    m->hurry_until = 0;
    if (e != MPI_SUCCESS && !m->err) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(e, msg, &len);
        snprintf(m->errmsg, sizeof m->errmsg, "%s", msg);
        m->err = e;
    }
    if (m->err) {
        rc = dsrt__fail(DSRT_EBACKEND, "comm: gradient all-reduce: MPI: %s", m->errmsg);
        pthread_mutex_unlock(&m->mu);
        dsrt__comm_break(c);
        return rc;
    }
    if (m->n_done < c->n_announced) {
        /* The first bucket not done: the start order is the queue's. */
        int64_t seq = INT64_MAX;
        int k_late = -1;
        for (int i = 0; i < m->n_inflight; i++)
            if (m->bucket_seq[m->inflight[i]] < seq) seq = m->bucket_seq[k_late = m->inflight[i]];
        for (int i = 0; i < m->n_own; i++)
            if (m->bucket_seq[m->own[i]] < seq) seq = m->bucket_seq[k_late = m->own[i]];
        if (k_late < 0) seq = atomic_load(&m->seq[CHAN_GRAD]) + 1;
        pthread_mutex_unlock(&m->mu);
        char what[64];
        snprintf(what, sizeof what, "gradient bucket %d", k_late);
        return timeout_fail(c, CHAN_GRAD, seq, what);
    }
    m->n_done = 0;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static const comm_grad_ops mpi_grad_ops = {
    .name = "mpi",
    .attach = mpi_grad_attach,
    .detach = mpi_grad_detach,
    .start = mpi_grad_start,
    .wait = mpi_grad_wait,
};

// ----------------------------------------------------------------------------
// Opening and closing

/* Receives the heartbeats the peers sent but this rank has not taken yet, so
 * that no message is left unmatched when the communicator goes. */
static int drain_heartbeats(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    long long *expect = dsrt__calloc((size_t)c->size, sizeof *expect);
    if (!expect) return -ENOMEM;
    int64_t seq = atomic_fetch_add(&m->seq[CHAN_COLL], 1) + 1;
    MPI_Request r;
    int rc = 0,
        e = MPI_Ialltoall(m->hb_sent, 1, MPI_LONG_LONG, expect, 1, MPI_LONG_LONG, m->hb, &r);
    if (e != MPI_SUCCESS) rc = mpi_fail(e, "close");
    if (!rc) rc = wait_request(c, &r, seq, "close");
    double deadline = dsrt__comm_now() + c->o.timeout_s;
    int round = 0;
    for (int p = 0; !rc && p < c->size; p++) {
        while (!rc && m->hb_got[p] < expect[p]) {
            int flag = 0;
            MPI_Status st;
            if ((e = MPI_Test(&m->hb_recv, &flag, &st)) != MPI_SUCCESS) {
                rc = mpi_fail(e, "close");
                break;
            }
            if (flag) {
                hb_received(m, st.MPI_SOURCE);
                e = MPI_Irecv(m->hb_in, 2, MPI_INT64_T, MPI_ANY_SOURCE, HB_TAG, m->hb, &m->hb_recv);
                if (e != MPI_SUCCESS) rc = mpi_fail(e, "close");
            } else if (dsrt__comm_now() > deadline) {
                rc = timeout_fail(c, CHAN_COLL, seq, "close: heartbeats");
            } else {
                nap(&round);
            }
        }
    }
    free(expect);
    if (rc) return rc;
    MPI_Cancel(&m->hb_recv);
    MPI_Wait(&m->hb_recv, MPI_STATUS_IGNORE);
    for (int p = 0; p < c->size; p++)
        if (m->hb_send[p] != MPI_REQUEST_NULL) {
            /* Matched by the peer's drain above: completes at once. */
            if ((e = wait_request(c, &m->hb_send[p], seq, "close: heartbeats"))) return e;
        }
    return 0;
}

static void mpi_close(dsrt_comm *c) {
    comm_mpi *m = c->mpi;
    if (!m) return;
    if (m->thread_started) {
        pthread_mutex_lock(&m->mu);
        m->stop = 1;
        pthread_cond_signal(&m->cv);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->thread, NULL);
    }
    /* A broken communicator has collectives that never complete: MPI may
     * not free it, and the process is expected to exit. */
    if (!atomic_load(&c->broken)) {
        int ok = 1;
        if (m->thread_started) {
            ok = drain_heartbeats(c) == 0;
        } else if (m->hb_recv != MPI_REQUEST_NULL) {
            MPI_Cancel(&m->hb_recv);
            MPI_Wait(&m->hb_recv, MPI_STATUS_IGNORE);
        }
        if (ok) {
            if (m->have_coll) MPI_Comm_free(&m->coll);
            if (m->have_grad) MPI_Comm_free(&m->grad);
            if (m->have_hb) MPI_Comm_free(&m->hb);
        }
    }
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    pthread_cond_destroy(&m->done);
    free(m->queue);
    free(m->req);
    free(m->inflight);
    free(m->bucket_seq);
    free(m->last_seen);
    free(m->peer_seq);
    free(m->hb_out);
    free(m->hb_send);
    free(m->hb_sent);
    free(m->hb_got);
    free(m);
    c->mpi = NULL;
}

static const comm_host_ops mpi_host_ops = {
    .sum = mpi_sum,
    .bcast = mpi_bcast,
    .close = mpi_close,
};

/* MPI_Comm_idup with the deadline; errors return instead of aborting. */
static int dup_world(dsrt_comm *c, MPI_Comm *out, int *have) {
    MPI_Request r;
    int e = MPI_Comm_idup(MPI_COMM_WORLD, out, &r);
    if (e != MPI_SUCCESS) return mpi_fail(e, "open");
    int64_t seq = atomic_fetch_add(&c->mpi->seq[CHAN_COLL], 1) + 1;
    if ((e = wait_request(c, &r, seq, "open"))) return e;
    *have = 1;
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return 0;
}

/* Rank among the ranks on this node: ranks with the same processor name
 * below this one. */
static int find_local_rank(dsrt_comm *c) {
    char *names = dsrt__calloc((size_t)c->size, MPI_MAX_PROCESSOR_NAME);
    char me[MPI_MAX_PROCESSOR_NAME];
    if (!names) return -ENOMEM;
    memset(me, 0, sizeof me);
    int len = 0;
    MPI_Get_processor_name(me, &len);
    int64_t seq = atomic_fetch_add(&c->mpi->seq[CHAN_COLL], 1) + 1;
    MPI_Request r;
    int rc = 0, e = MPI_Iallgather(me, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names,
                                   MPI_MAX_PROCESSOR_NAME, MPI_CHAR, c->mpi->coll, &r);
    if (e != MPI_SUCCESS) rc = mpi_fail(e, "open");
    if (!rc) rc = wait_request(c, &r, seq, "open");
    if (!rc) {
        c->local_rank = 0;
        for (int p = 0; p < c->rank; p++)
            if (!strncmp(names + (size_t)p * MPI_MAX_PROCESSOR_NAME, me, MPI_MAX_PROCESSOR_NAME))
                c->local_rank++;
    }
    free(names);
    return rc;
}

int dsrt__comm_mpi_open(dsrt_comm *c, int with_grads) {
    int inited = 0, fin = 0, e;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!inited || fin)
        return dsrt__fail(-EINVAL, "comm: open: MPI is not initialised (call dsrt_comm_init)");
    comm_mpi *m = dsrt__calloc(1, sizeof *m);
    if (!m) return -ENOMEM;
    c->mpi = m;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->done, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_cond_destroy(&m->done);
    pthread_cond_init(&m->done, &ca);
    pthread_condattr_destroy(&ca);
    m->with_grads = with_grads;
    m->opened_s = dsrt__comm_now();
    m->hb_period = DSRT_MAX(0.05, DSRT_MIN(2.0, c->o.timeout_s / 10));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    c->host = &mpi_host_ops;
    if (with_grads) c->grad = &mpi_grad_ops;
    size_t n = (size_t)c->size;
    m->last_seen = dsrt__calloc(n, sizeof *m->last_seen);
    m->peer_seq = dsrt__calloc(2 * n, sizeof *m->peer_seq);
    m->hb_out = dsrt__calloc(2 * n, sizeof *m->hb_out);
    m->hb_send = dsrt__calloc(n, sizeof *m->hb_send);
    m->hb_sent = dsrt__calloc(n, sizeof *m->hb_sent);
    m->hb_got = dsrt__calloc(n, sizeof *m->hb_got);
    if (!m->last_seen || !m->peer_seq || !m->hb_out || !m->hb_send || !m->hb_sent || !m->hb_got)
        return -ENOMEM;
    for (size_t p = 0; p < n; p++) m->hb_send[p] = MPI_REQUEST_NULL;
    m->hb_recv = MPI_REQUEST_NULL;
    int rc;
    if ((rc = dup_world(c, &m->hb, &m->have_hb))) return rc;
    if ((rc = dup_world(c, &m->coll, &m->have_coll))) return rc;
    if ((rc = dup_world(c, &m->grad, &m->have_grad))) return rc;
    if ((rc = find_local_rank(c))) return rc;
    e = MPI_Irecv(m->hb_in, 2, MPI_INT64_T, MPI_ANY_SOURCE, HB_TAG, m->hb, &m->hb_recv);
    if (e != MPI_SUCCESS) return mpi_fail(e, "open");
    if ((e = pthread_create(&m->thread, NULL, comm_thread, c)))
        return dsrt__fail(-e, "comm: open: cannot start the communication thread");
    m->thread_started = 1;
    return 0;
}

int dsrt__comm_mpi_init(int *argc, char ***argv) {
    int inited = 0, fin = 0, provided = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin) return dsrt__fail(-EINVAL, "comm: init: MPI was finalised already");
    if (inited) {
        MPI_Query_thread(&provided);
    } else {
        /* Open MPI's nonblocking all-reduce (libnbc) picks a binomial tree
         * by default, which on 2 ranks runs large buffers at half the speed
         * of its blocking MPI_Allreduce (25 MiB: 40 ms against 22 ms over
         * shared memory); the ring is as fast as the blocking call, and
         * every rank still gets the same bits (each value is summed on one
         * rank and passed on). Unless the user chose an algorithm. */
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
        int e = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
        if (e != MPI_SUCCESS) return mpi_fail(e, "init");
        atomic_store(&mpi_ours, 1);
    }
    if (provided < MPI_THREAD_MULTIPLE)
        return dsrt__fail(DSRT_EUNSUPPORTED,
                          "comm: init: this MPI gives thread level %d, not MPI_THREAD_MULTIPLE",
                          provided);
    return 0;
}

void dsrt__comm_mpi_finalize(void) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin && atomic_exchange(&mpi_ours, 0)) MPI_Finalize();
}

// ----------------------------------------------------------------------------
// The module's entry

static const comm_mpi_engine mpi_engine = {
    .init = dsrt__comm_mpi_init,
    .finalize = dsrt__comm_mpi_finalize,
    .open = dsrt__comm_mpi_open,
    .enter = mpi_enter,
    .timeout = mpi_timeout,
};

DSRT_MODULE_DEFINE(mpi, &mpi_engine, dsrt__comm_now);

#endif
