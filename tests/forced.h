/*
 * Waits a test forces instead of timing. A test that needs the library to be
 * waiting (a batch not ready, a worker blocked on a slot) must not hope that
 * a sleep was long enough: on a loaded machine it never is for certain. These
 * helpers make the wait certain.
 *
 *   forced_hold(path)       holds back every open of the file (a write lease,
 *                           fcntl F_SETLEASE): dsrt's reader, which opens with
 *                           O_NONBLOCK, is answered EAGAIN, takes it for a
 *                           refusal of the moment and tries again, so a batch
 *                           carrying the file cannot be ready until
 *                           forced_let_go(fd). Returns the lease's descriptor,
 *                           or -1 with errno. SIGIO, which the kernel sends the
 *                           holder when an open is held back, is ignored.
 *   forced_let_go(fd)       releases the lease and closes fd.
 *   forced_others_asleep()  waits until every other thread of the process is
 *                           blocked (state S or I in /proc), twice in a row: the
 *                           library's workers have run out of work and wait
 *                           on a condition (or a lock held by a blocked
 *                           thread, which the library never does).
 *
 * Only blocked threads are waited for; nothing here decides a test by how
 * long something took. (Linux only, as dsrt.)
 */
#ifndef DSRT_TEST_FORCED_H
#define DSRT_TEST_FORCED_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline int forced_hold(const char *path) {
    signal(SIGIO, SIG_IGN);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fcntl(fd, F_SETLEASE, F_WRLCK) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static inline void forced_let_go(int fd) {
    if (fd < 0) return;
    fcntl(fd, F_SETLEASE, F_UNLCK);
    close(fd);
}

/* State letter of thread tid of this process ('?' when unreadable). */
static inline char forced_thread_state(const char *tid) {
    char path[300], text[1024];
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f) return '?';
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    const char *paren = strrchr(text, ')'); /* the name may hold spaces and ')' */
    return paren && paren[1] == ' ' ? paren[2] : '?';
}

static inline void forced_others_asleep(void) {
    char me[32];
    snprintf(me, sizeof me, "%ld", (long)gettid());
    for (int calm = 0; calm < 2;) {
        int busy = 0;
        DIR *d = opendir("/proc/self/task");
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.' || !strcmp(e->d_name, me)) continue;
            char s = forced_thread_state(e->d_name);
            /* 'I': an idle kernel-side helper (io_uring's); '?': it just ended */
            busy |= s != 'S' && s != 'I' && s != '?';
        }
        if (d) closedir(d);
        calm = busy ? 0 : calm + 1;
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
}

#endif
