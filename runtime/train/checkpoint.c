/*
 * Checkpoints of a training run: the net and optimizer in one file
 * (dsrt_checkpoint_save: temporary file, fsync, rename) and the loop's own
 * state in a small text file beside it (patience, best validation loss, the
 * batch size and sample count the position counts in), written the same way
 * before it; the best-validation weights as a model file the state names;
 * finding the latest checkpoint of a folder; and loading one to resume from.
 */
#include "runtime/train/internal.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Checkpoints and the loop's state beside them

void dsrt__loop_state_init(loop_state *s) {
    memset(s, 0, sizeof *s);
    s->best_val_loss = s->last_val_loss = s->last_val_accuracy = NAN;
    s->best_iteration = -1;
}

static int write_state(const char *path, const loop_state *s, const dsrt_train_position *pos) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     STATE_MAGIC "\nepoch %lld\niteration %lld\nbatch %lld\nsamples %lld\n"
                                 "drop_last %d\nbad_count %lld\nbest_val_loss %.17g\n"
                                 "best_iteration %lld\nlast_val_loss %.17g\n"
                                 "last_val_accuracy %.17g\nbest_file %s\norder %s\n"
                                 "shuffle_buffer %lld\nworkers %lld\nsampling %s\n",
                     (long long)pos->epoch, (long long)pos->iteration, (long long)s->batch,
                     (long long)s->samples, s->drop_last, (long long)s->bad_count, s->best_val_loss,
                     (long long)s->best_iteration, s->last_val_loss, s->last_val_accuracy,
                     s->best_file[0] ? s->best_file : "-", s->order[0] ? s->order : "exact",
                     (long long)s->shuffle_buffer, (long long)s->workers,
                     s->sampling[0] ? s->sampling : "-");
    int rc = dsrt__write_file_atomic(path, buf, (size_t)n);
    return rc ? dsrt__fail_prefix(rc, "train: checkpoint state") : 0;
}

/* Reads the state file of a checkpoint; 1 when it is there and belongs to
 * the checkpoint's iteration, 0 when not. */
static int read_state(const char *path, loop_state *s, int64_t iteration) {
    uint8_t *data;
    size_t size;
    if (dsrt__read_whole_file(path, 1 << 16, &data, &size) != 0) {
        dsrt__clear_error();
        return 0;
    }
    loop_state t;
    dsrt__loop_state_init(&t);
    long long it = -1, v;
    int ok = strncmp((char *)data, STATE_MAGIC "\n", sizeof STATE_MAGIC) == 0;
    for (char *line = (char *)data; ok && line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char key[32], val[256];
        if (sscanf(line, "%31s %255s", key, val) == 2) {
            if (!strcmp(key, "iteration") && sscanf(val, "%lld", &v) == 1) it = v;
            if (!strcmp(key, "batch") && sscanf(val, "%lld", &v) == 1) t.batch = v;
            if (!strcmp(key, "samples") && sscanf(val, "%lld", &v) == 1) t.samples = v;
            if (!strcmp(key, "drop_last") && sscanf(val, "%lld", &v) == 1) t.drop_last = (int)v;
            if (!strcmp(key, "order")) snprintf(t.order, sizeof t.order, "%.7s", val);
            if (!strcmp(key, "shuffle_buffer") && sscanf(val, "%lld", &v) == 1)
                t.shuffle_buffer = v;
            if (!strcmp(key, "bad_count") && sscanf(val, "%lld", &v) == 1) t.bad_count = v;
            if (!strcmp(key, "sampling") && strcmp(val, "-") != 0)
                snprintf(t.sampling, sizeof t.sampling, "%.47s", val);
            if (!strcmp(key, "workers") && sscanf(val, "%lld", &v) == 1 && v > 0 && v <= 65536)
                t.workers = v;
            if (!strcmp(key, "best_iteration") && sscanf(val, "%lld", &v) == 1)
                t.best_iteration = v;
            if (!strcmp(key, "best_val_loss")) t.best_val_loss = strtod(val, NULL);
            if (!strcmp(key, "last_val_loss")) t.last_val_loss = strtod(val, NULL);
            if (!strcmp(key, "last_val_accuracy")) t.last_val_accuracy = strtod(val, NULL);
            if (!strcmp(key, "best_file") && strcmp(val, "-") != 0 && !strchr(val, '/'))
                snprintf(t.best_file, sizeof t.best_file, "%s", val);
        }
        line = next;
    }
    free(data);
    if (!ok || it != iteration) return 0;
    *s = t;
    return 1;
}

int dsrt_checkpoint_latest(const char *dir, char *path, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return dsrt__fail(-errno, "checkpoint: %s: %s", dir, strerror(errno));
    long long best = -1;
    char name[512] = "";
    const size_t np = strlen(CKPT_PREFIX), ns = strlen(CKPT_SUFFIX);
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n <= np + ns || strncmp(e->d_name, CKPT_PREFIX, np) != 0 ||
            strcmp(e->d_name + n - ns, CKPT_SUFFIX) != 0 || n >= sizeof name)
            continue;
        const char *i = strstr(e->d_name, "_i");
        long long it;
        if (!i || sscanf(i + 2, "%lld", &it) != 1) continue;
        if (it > best) {
            best = it;
            memcpy(name, e->d_name, n + 1);
        }
    }
    closedir(d);
    if (best < 0)
        return dsrt__fail(-ENOENT, "checkpoint: %s: no %s*%s file", dir, CKPT_PREFIX, CKPT_SUFFIX);
    if ((size_t)snprintf(path, size, "%s/%s", dir, name) >= size)
        return dsrt__fail(-ENAMETOOLONG, "checkpoint: %s/%s: path too long", dir, name);
    return 0;
}

/* A checkpoint file's name and its iteration. */
typedef struct {
    long long it;
    char name[256];
} ckpt_name;

static int by_iteration_down(const void *a, const void *b) {
    long long x = ((const ckpt_name *)a)->it, y = ((const ckpt_name *)b)->it;
    return x < y   ? 1
           : x > y ? -1
                   : strcmp(((const ckpt_name *)a)->name, ((const ckpt_name *)b)->name);
}

int dsrt_checkpoint_latest_complete(const char *dir, char *path, size_t size, char *skipped,
                                    size_t skipped_size) {
    if (skipped && skipped_size) skipped[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        if (e == ENOENT) return dsrt__fail(-ENOENT, "checkpoint: %s: no such folder", dir);
        return dsrt__fail(-e, "checkpoint: %s: %s", dir, strerror(e));
    }
    ckpt_name *all = NULL;
    size_t n = 0, cap = 0;
    const size_t np = strlen(CKPT_PREFIX), ns = strlen(CKPT_SUFFIX);
    int rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len <= np + ns || len >= sizeof all->name || strncmp(e->d_name, CKPT_PREFIX, np) != 0 ||
            strcmp(e->d_name + len - ns, CKPT_SUFFIX) != 0)
            continue;
        const char *i = strstr(e->d_name, "_i");
        long long it;
        if (!i || sscanf(i + 2, "%lld", &it) != 1) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            ckpt_name *na = realloc(all, nc * sizeof *na);
            if (!na) {
                rc = dsrt__fail(-ENOMEM, "checkpoint: %s: out of memory", dir);
                break;
            }
            all = na;
            cap = nc;
        }
        all[n].it = it;
        memcpy(all[n].name, e->d_name, len + 1);
        n++;
    }
    closedir(d);
    if (rc) goto out;
    dsrt__sort(all, n, sizeof *all, by_iteration_down);
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    size_t used = 0;
    rc = -ENOENT;
    for (size_t k = 0; k < n && rc == -ENOENT; k++) {
        if ((size_t)snprintf(path, size, "%s/%s", dir, all[k].name) >= size) {
            rc = dsrt__fail(-ENAMETOOLONG, "checkpoint: %s/%s: path too long", dir, all[k].name);
            break;
        }
        dsrt_net *net = NULL;
        dsrt_optimizer *opt = NULL;
        if (dsrt_checkpoint_load(path, &net, &opt, NULL, &no) == 0) {
            rc = 0;
        } else if (skipped && used + 1 < skipped_size) {
            int w =
                snprintf(skipped + used, skipped_size - used, "%s: %s\n", path, dsrt_last_error());
            used = DSRT_MIN(used + (w > 0 ? (size_t)w : 0), skipped_size - 1);
        }
        dsrt_optimizer_destroy(opt);
        dsrt_net_destroy(net);
    }
    if (rc == 0) {
        dsrt__clear_error();
    } else if (rc == -ENOENT) {
        if (size) path[0] = '\0';
        dsrt__fail(-ENOENT, "checkpoint: %s: no complete %s*%s file (%zu found)", dir, CKPT_PREFIX,
                   CKPT_SUFFIX, n);
    }
out:
    free(all);
    return rc;
}

/* FNV-1a over n bytes, from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

void dsrt__train_sampling(const dsrt_train_options *o, const dsrt_datastore *ds, char *out,
                          size_t cap) {
    char part[96];
    size_t k_n = dsrt_datastore_mix_sources(ds);
    int n =
        snprintf(part, sizeof part, "w=%s;k=%zu;r=%d", o->sample_weights ? o->sample_weights : "",
                 k_n, dsrt_datastore_mix_replacement(ds));
    uint64_t h = fnv(0xcbf29ce484222325ULL, part, (size_t)DSRT_MIN(n, (int)sizeof part - 1));
    for (size_t k = 0; k < k_n; k++) {
        n = snprintf(part, sizeof part, ";%zu,%.17g", dsrt_datastore_mix_samples(ds, k),
                     dsrt_datastore_mix_weight(ds, k));
        h = fnv(h, part, (size_t)DSRT_MIN(n, (int)sizeof part - 1));
    }
    snprintf(out, cap, "%s/%016llx", dsrt_shuffle_name(o->shuffle), (unsigned long long)h);
}

uint64_t dsrt_weights_checksum(dsrt_net *net) {
    size_t n;
    const float *p = dsrt_net_params(net, &n);
    return fnv(0xcbf29ce484222325ULL, p, n * sizeof(float));
}

static int all_finite(const float *x, size_t n) {
    float acc = 0;
    for (size_t i = 0; i < n; i++) acc += x[i] * 0.0f; /* NaN for any NaN or inf */
    return acc == 0.0f;
}

// ----------------------------------------------------------------------------
// Writing and resuming

int dsrt__train_save_checkpoint(run *R, int64_t epochs_done, int64_t iteration,
                                const dp_states *ws) {
    const dsrt_train_options *o = R->o;
    double t = dsrt__now_s();
    size_t np = 0, ns = 0;
    const float *w = dsrt_net_params(R->net, &np), *st = dsrt_net_state(R->net, &ns);
    if (!all_finite(w, np) || !all_finite(st, ns))
        return dsrt__fail(DSRT_ENAN,
                          "train: epoch %lld, iteration %lld: the %s not finite; no checkpoint "
                          "written",
                          (long long)epochs_done, (long long)iteration,
                          all_finite(w, np) ? "running statistics are" : "weights are");
    size_t dl = strlen(o->checkpoint_path) + 96;
    char *path = dsrt__malloc(dl), *spath = dsrt__malloc(dl + 8), *bpath = dsrt__malloc(dl);
    int rc = -ENOMEM;
    if (!path || !spath || !bpath) goto out;
    dsrt_train_position pos = {epochs_done, iteration, R->r->seed};
    if (R->best_dirty && R->best_params) {
        /* The best weights so far, as a model file the state names. */
        char name[64];
        snprintf(name, sizeof name, "dsrt_best_i%09lld.dsrt", (long long)R->ls.best_iteration);
        snprintf(bpath, dl, "%s/%s", o->checkpoint_path, name);
        /* Swap the best weights in, save, swap back. */
        size_t n;
        float *pp = dsrt_net_params(R->net, &n), *ss = dsrt_net_state(R->net, NULL);
        float *keep_p = dsrt__malloc(R->n_params * sizeof(float) + 1);
        float *keep_s = dsrt__malloc(R->n_state * sizeof(float) + 1);
        if (!keep_p || !keep_s) {
            free(keep_p);
            free(keep_s);
            goto out;
        }
        memcpy(keep_p, pp, R->n_params * sizeof(float));
        memcpy(keep_s, ss, R->n_state * sizeof(float));
        memcpy(pp, R->best_params, R->n_params * sizeof(float));
        memcpy(ss, R->best_state, R->n_state * sizeof(float));
        rc = dsrt_model_save(bpath, R->net);
        memcpy(pp, keep_p, R->n_params * sizeof(float));
        memcpy(ss, keep_s, R->n_state * sizeof(float));
        free(keep_p);
        free(keep_s);
        if (rc) goto out;
        snprintf(R->ls.best_file, sizeof R->ls.best_file, "%s", name);
        R->best_dirty = 0;
    }
    snprintf(path, dl, "%s/" CKPT_PREFIX "e%03lld_i%09lld" CKPT_SUFFIX, o->checkpoint_path,
             (long long)epochs_done, (long long)iteration);
    snprintf(spath, dl + 8, "%s" STATE_SUFFIX, path);
    if ((rc = write_state(spath, &R->ls, &pos))) goto out;
    if ((rc = dsrt__checkpoint_save_workers(path, R->net, R->opt, &pos, ws ? &ws->ws : NULL))) {
        /* (A full disk:) no state without its checkpoint. */
        unlink(spath);
        goto out;
    }
    snprintf(R->r->checkpoint, sizeof R->r->checkpoint, "%s", path);
    R->r->checkpoint_s += dsrt__now_s() - t;
    R->ev.checkpoint = R->r->checkpoint;
    if (dsrt__train_emit(R, DSRT_EVENT_CHECKPOINT)) R->stop_request = 1;
    R->ev.checkpoint = NULL;
out:
    free(path);
    free(spath);
    free(bpath);
    return rc;
}

/* The loop's state kept beside checkpoint used: patience, best so far;
 * refused when the batches from here on would differ (batch size, drop_last,
 * samples, order, how samples are drawn). A checkpoint without one keeps the loop's state as it is.
 */
static int resume_loop_state(run *R, const char *used, int64_t iteration) {
    const dsrt_train_options *o = R->o;
    char *sp = dsrt__malloc(strlen(used) + 8);
    if (!sp) return -ENOMEM;
    sprintf(sp, "%s" STATE_SUFFIX, used);
    loop_state s;
    if (read_state(sp, &s, iteration)) {
        R->ls.bad_count = s.bad_count;
        R->ls.best_val_loss = s.best_val_loss;
        R->ls.best_iteration = s.best_iteration;
        R->ls.last_val_loss = s.last_val_loss;
        R->ls.last_val_accuracy = s.last_val_accuracy;
        memcpy(R->ls.best_file, s.best_file, sizeof s.best_file);
        R->r->resume_workers = (int)s.workers;
        if (s.batch != o->batch || s.drop_last != o->drop_last || s.samples != R->ls.samples) {
            int rc = dsrt__fail(DSRT_EOPTION,
                                "train: resume: %s: made with batch %lld, drop_last %d over %lld "
                                "samples; the options say batch %d, drop_last %d over %lld samples",
                                used, (long long)s.batch, s.drop_last, (long long)s.samples,
                                o->batch, o->drop_last, (long long)R->ls.samples);
            free(sp);
            return rc;
        }
        /* Another shuffle, other sample weights or another mix (its sources,
         * their sizes or weights, replacement) draws other samples from
         * here on: refused like another batch size (a state from before
         * says nothing and is taken as it is). */
        if (s.sampling[0] && strcmp(s.sampling, R->ls.sampling) != 0) {
            int rc = dsrt__fail(DSRT_EOPTION,
                                "train: resume: %s: made drawing its samples as %s (shuffle / "
                                "sample weights and mix); the options draw them as %s: give the "
                                "same --shuffle, --sample-weights, --data, --mix and "
                                "--mix-replacement",
                                used, s.sampling, R->ls.sampling);
            free(sp);
            return rc;
        }
        /* A tar shard set read in another order gives other batches from here
         * on: refused like another batch size (states from before the
         * orders existed read as exact). */
        int shard_now = !strcmp(R->ls.order, "shard"), shard_then = !strcmp(s.order, "shard");
        if (shard_now != shard_then || (shard_now && s.shuffle_buffer != R->ls.shuffle_buffer)) {
            char then[64], now[64];
            snprintf(then, sizeof then,
                     shard_then ? "shard order (shuffle buffer %lld)" : "exact order",
                     (long long)s.shuffle_buffer);
            snprintf(now, sizeof now,
                     shard_now ? "shard order (shuffle buffer %lld)" : "exact order",
                     (long long)R->ls.shuffle_buffer);
            int rc = dsrt__fail(DSRT_EOPTION,
                                "train: resume: %s: made reading the data in the %s; the options "
                                "say the %s: give the same --order and --shuffle-buffer",
                                used, then, now);
            free(sp);
            return rc;
        }
    }
    free(sp);
    return 0;
}

/* The best weights the loop's state names, from the checkpoint's folder;
 * without them the best so far is unknown and starts afresh. */
static int resume_best(run *R, const char *used, const dsrt_net_options *no) {
    if (!R->best_params || !R->ls.best_file[0]) return 0;
    char *dir = dsrt__strdup(used);
    char *bp = dir ? dsrt__malloc(strlen(used) + sizeof R->ls.best_file + 2) : NULL;
    dsrt_net *b = NULL;
    if (!dir || !bp) {
        free(dir);
        return -ENOMEM;
    }
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';
    sprintf(bp, "%s%s", dir, R->ls.best_file);
    if (dsrt_model_load(&b, bp, no) == 0 && dsrt_net_params(b, NULL) &&
        strcmp(dsrt_net_description(b), dsrt_net_description(R->net)) == 0) {
        memcpy(R->best_params, dsrt_net_params(b, NULL), R->n_params * sizeof(float));
        memcpy(R->best_state, dsrt_net_state(b, NULL), R->n_state * sizeof(float));
    } else {
        /* Without the file the best so far is unknown: start afresh. */
        dsrt__clear_error();
        R->ls.best_val_loss = NAN;
        R->ls.best_iteration = -1;
        R->ls.best_file[0] = '\0';
    }
    dsrt_net_destroy(b);
    free(dir);
    free(bp);
    return 0;
}

/* Loads the checkpoint to resume from into the run: weights, state,
 * optimizer, position and loop state. */

int dsrt__train_load_resume(run *R, dsrt_train_position *pos, char *used, size_t used_size) {
    const dsrt_train_options *o = R->o;
    struct stat st;
    int rc;
    if (stat(o->resume, &st) == 0 && S_ISDIR(st.st_mode)) {
        if ((rc = dsrt_checkpoint_latest(o->resume, used, used_size)))
            return dsrt__fail_prefix(rc, "train: resume");
    } else {
        snprintf(used, used_size, "%s", o->resume);
    }
    dsrt_net *c = NULL;
    dsrt_optimizer *copt = NULL;
    dsrt_net_options no = dsrt_net_defaults();
    no.threads = 1;
    /* A checkpoint of workers that each kept their own optimizer state:
     * each worker takes its own when the run is the same kind with as many
     * workers, else every worker the mean of them (see train.h). */
    int own = dsrt__dp_own_states(R) ? R->world : 0, states = 1;
    if ((rc = dsrt__checkpoint_load_worker(used, &c, &copt, pos, &no, R->rank, own, &states)))
        return dsrt__fail_prefix(rc, "train: resume");
    R->r->resume_states = states;
    size_t cp, cs;
    float *src_p = dsrt_net_params(c, &cp), *src_s = dsrt_net_state(c, &cs);
    if (strcmp(dsrt_net_description(c), dsrt_net_description(R->net)) != 0 || cp != R->n_params ||
        cs != R->n_state) {
        rc = dsrt__fail(DSRT_EOPTION,
                        "train: resume: %s: the checkpoint's network is not the one given "
                        "(description or size differ)",
                        used);
        goto out;
    }
    if (!copt) {
        rc = dsrt__fail(DSRT_EOPTION,
                        "train: resume: %s: a model file, not a checkpoint (no "
                        "optimizer state)",
                        used);
        goto out;
    }
    memcpy(dsrt_net_params(R->net, NULL), src_p, cp * sizeof(float));
    memcpy(dsrt_net_state(R->net, NULL), src_s, cs * sizeof(float));
    dsrt_net_params_changed(R->net);
    dsrt_net_set_iteration(R->net, pos->iteration);
    dsrt_optimizer_options co = dsrt_optimizer_get_options(copt);
    if (co.solver != o->optimizer.solver) {
        rc = dsrt__fail(DSRT_EOPTION,
                        "train: resume: %s: the checkpoint's solver (%d) is not the "
                        "options' (%d)",
                        used, (int)co.solver, (int)o->optimizer.solver);
        goto out;
    }
    if ((rc = dsrt_optimizer_copy_state(R->opt, copt))) {
        dsrt__fail_prefix(rc, "train: resume: %s", used);
        goto out;
    }

    /* The loop's own state, and the best weights it names. */
    if ((rc = resume_loop_state(R, used, pos->iteration)) != 0) goto out;
    if ((rc = resume_best(R, used, &no)) != 0) goto out;
    rc = 0;
out:
    dsrt_optimizer_destroy(copt);
    dsrt_net_destroy(c);
    return rc;
}

/* Records a validation result: best weights, patience. */

int dsrt__train_make_dir(const char *path) {
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
    return dsrt__fail(-errno, "train: checkpoint_path: %s: %s", path, strerror(errno));
}
