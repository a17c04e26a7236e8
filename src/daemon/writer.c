/* writer.c - the group-commit writer thread (see writer.h) */
#define _POSIX_C_SOURCE 200809L
#include "writer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "store.h"

struct item {
    struct item *next;
    int64_t engine_ms, unix_ms;
    char *cmd;
    char **events;
    size_t n_events;
    char *snapshot;
    char *meta; /* {"key": "value", ...} for the meta table, in the same transaction */
};

struct osubd__writer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct item *head, *tail; /* handed over, not yet taken by the thread */
    bool stopping, failed;
    bool full; /* the disk is full: the batch waits at the head and is tried again each second */
    char err[512];
    uint64_t added, durable;
    int64_t last_log_seq, last_event_seq;
    uint64_t commits, items;
    int pipe_rd, pipe_wr;
    osubd__store_t *store;
    int64_t events_keep, events_days;
    int marker_fd;
    char marker_id[17];
    void (*marker_write)(int fd, const char *id, int64_t seq);
};

static void item_free(struct item *it)
{
    for (size_t i = 0; i < it->n_events; i++)
        free(it->events[i]);
    free(it->events);
    free(it->cmd);
    free(it->snapshot);
    free(it->meta);
    free(it);
}

static int64_t unix_ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int set_meta(osubd__store_t *s, const char *text)
{
    json_t *m = json_loads(text, 0, NULL);
    const char *k;
    json_t *v;
    int rc = json_is_object(m) ? 0 : -1;
    json_object_foreach(m, k, v)
    {
        if (rc == 0 && json_is_string(v))
            rc = osubd__store_meta_set(s, k, json_string_value(v));
    }
    json_decref(m);
    return rc;
}

/* One transaction for the whole batch. Returns 0 or -1 (rolled back). */
static int commit_batch(osubd__writer_t *w, struct item *batch, int64_t *log_seq, int64_t *ev_seq)
{
    if (osubd__store_begin(w->store) != 0)
        return -1;
    bool trim = false;
    for (struct item *it = batch; it != NULL; it = it->next) {
        int64_t seqs[64];
        int64_t *ev = it->n_events <= 64 ? seqs : malloc(it->n_events * sizeof(*ev));
        if (ev == NULL || osubd__store_append_with_events(w->store, it->engine_ms, it->unix_ms,
                                                          it->cmd, (const char *const *)it->events,
                                                          it->n_events, log_seq, ev) != 0) {
            if (ev != seqs)
                free(ev);
            osubd__store_rollback(w->store);
            return -1;
        }
        if (it->n_events > 0)
            *ev_seq = ev[it->n_events - 1];
        if (ev != seqs)
            free(ev);
        if (it->meta != NULL && set_meta(w->store, it->meta) != 0) {
            osubd__store_rollback(w->store);
            return -1;
        }
        if (it->snapshot != NULL) {
            if (osubd__store_snapshot(w->store, it->snapshot, *log_seq) != 0) {
                osubd__store_rollback(w->store);
                return -1;
            }
            trim = true;
        }
    }
    if (trim) {
        int64_t older = w->events_days > 0 ? unix_ms_now() - w->events_days * 86400000LL : 0;
        if (osubd__store_trim_events(w->store, w->events_keep, older) != 0) {
            osubd__store_rollback(w->store);
            return -1;
        }
    }
    return osubd__store_commit(w->store);
}

static void *run(void *arg)
{
    osubd__writer_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->head == NULL && !w->stopping)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->head == NULL)
            break;
        struct item *batch = w->head;
        uint64_t upto = w->added;
        w->head = w->tail = NULL;
        bool failed = w->failed;
        int64_t log_seq = w->last_log_seq, ev_seq = w->last_event_seq;
        pthread_mutex_unlock(&w->mu);

        uint64_t n = 0;
        for (struct item *it = batch; it != NULL; it = it->next)
            n++;
        int rc = failed ? -1 : commit_batch(w, batch, &log_seq, &ev_seq);
        if (rc != 0 && !failed && osubd__store_full(w->store)) {
            /* nothing of the batch is on disk: it goes back in front of what came since, in
             * order, and is tried again when space returns (or given up at stop) */
            pthread_mutex_lock(&w->mu);
            struct item *last = batch;
            while (last->next != NULL)
                last = last->next;
            last->next = w->head;
            if (w->head == NULL)
                w->tail = last;
            w->head = batch;
            if (!w->full)
                snprintf(w->err, sizeof(w->err), "%s", osubd__store_error(w->store));
            w->full = true;
            char c = 1;
            ssize_t wr = write(w->pipe_wr, &c, 1);
            (void)wr;
            if (w->stopping) {
                w->failed = true; /* stopping on a full disk: what is not on disk is lost */
                w->head = w->tail = NULL;
                pthread_mutex_unlock(&w->mu);
                while (batch != NULL) {
                    struct item *next = batch->next;
                    item_free(batch);
                    batch = next;
                }
                pthread_mutex_lock(&w->mu);
                break;
            }
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            while (!w->stopping && pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT)
                ;
            continue; /* the lock is held, as at the top of the loop */
        }
        while (batch != NULL) {
            struct item *next = batch->next;
            item_free(batch);
            batch = next;
        }

        pthread_mutex_lock(&w->mu); /* the marker's fields are read under it */
        if (rc == 0 && w->marker_write != NULL && log_seq != w->last_log_seq)
            w->marker_write(w->marker_fd, w->marker_id, log_seq); /* after the commit */
        if (rc == 0) {
            w->durable = upto;
            w->last_log_seq = log_seq;
            w->last_event_seq = ev_seq;
            w->commits++;
            w->items += n;
            w->full = false;
        } else if (!w->failed) {
            w->failed = true;
            snprintf(w->err, sizeof(w->err), "%s", osubd__store_error(w->store));
        }
        /* wake the loop; a full pipe already has a wake-up in it */
        char c = 1;
        ssize_t wr = write(w->pipe_wr, &c, 1);
        (void)wr;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int osubd__writer_start(const char *path, int64_t last_log_seq, int64_t events_keep,
                        int64_t events_days, osubd__writer_t **out, char *err, size_t errlen)
{
    osubd__writer_t *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    w->last_log_seq = last_log_seq;
    w->events_keep = events_keep;
    w->events_days = events_days;
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        free(w);
        return -1;
    }
    w->pipe_rd = fds[0];
    w->pipe_wr = fds[1];
    fcntl(w->pipe_rd, F_SETFL, fcntl(w->pipe_rd, F_GETFL) | O_NONBLOCK);
    fcntl(w->pipe_wr, F_SETFL, fcntl(w->pipe_wr, F_GETFL) | O_NONBLOCK);
    fcntl(w->pipe_rd, F_SETFD, FD_CLOEXEC);
    fcntl(w->pipe_wr, F_SETFD, FD_CLOEXEC);
    if (osubd__store_open(path, &w->store, err, errlen) != 0)
        goto fail;
    /* where the log stands, so that progress reads right before the first commit */
    osubd__store_last_event(w->store, &w->last_event_seq);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, run, w) != 0) {
        snprintf(err, errlen, "cannot start the writer thread");
        osubd__store_close(w->store);
        goto fail;
    }
    *out = w;
    return 0;
fail:
    close(w->pipe_rd);
    close(w->pipe_wr);
    free(w);
    return -1;
}

int osubd__writer_fd(const osubd__writer_t *w)
{
    return w->pipe_rd;
}

uint64_t osubd__writer_add(osubd__writer_t *w, int64_t engine_ms, int64_t unix_ms, char *cmd,
                           char **events, size_t n, char *snapshot, char *meta)
{
    struct item *it = calloc(1, sizeof(*it));
    pthread_mutex_lock(&w->mu);
    uint64_t ticket = ++w->added;
    if (it == NULL) {
        /* nothing can be committed in order any more */
        w->failed = true;
        snprintf(w->err, sizeof(w->err), "out of memory handing a command to the writer");
        for (size_t i = 0; i < n; i++)
            free(events[i]);
        free(events);
        free(cmd);
        free(snapshot);
        free(meta);
    } else {
        it->engine_ms = engine_ms;
        it->unix_ms = unix_ms;
        it->cmd = cmd;
        it->events = events;
        it->n_events = n;
        it->snapshot = snapshot;
        it->meta = meta;
        if (w->tail != NULL)
            w->tail->next = it;
        else
            w->head = it;
        w->tail = it;
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return ticket;
}

int osubd__writer_progress(osubd__writer_t *w, struct osubd__writer_progress *p, char *err,
                           size_t errlen)
{
    char buf[256];
    while (read(w->pipe_rd, buf, sizeof(buf)) > 0)
        ;
    pthread_mutex_lock(&w->mu);
    p->durable = w->durable;
    p->last_log_seq = w->last_log_seq;
    p->last_event_seq = w->last_event_seq;
    p->commits = w->commits;
    p->items = w->items;
    p->full = w->full;
    bool failed = w->failed;
    if (failed || w->full)
        snprintf(err, errlen, "%s", w->err);
    pthread_mutex_unlock(&w->mu);
    return failed ? -1 : 0;
}

int osubd__writer_stop(osubd__writer_t *w, struct osubd__writer_progress *p)
{
    if (w == NULL)
        return 0;
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    bool failed = w->failed;
    if (p != NULL) {
        p->durable = w->durable;
        p->last_log_seq = w->last_log_seq;
        p->last_event_seq = w->last_event_seq;
        p->commits = w->commits;
        p->items = w->items;
    }
    osubd__store_close(w->store);
    close(w->pipe_rd);
    close(w->pipe_wr);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    return failed ? -1 : 0;
}

void osubd__writer_set_marker(osubd__writer_t *w, int fd, const char *id,
                              void (*write_fn)(int fd, const char *id, int64_t seq))
{
    pthread_mutex_lock(&w->mu);
    w->marker_fd = fd;
    snprintf(w->marker_id, sizeof(w->marker_id), "%s", id);
    w->marker_write = fd >= 0 ? write_fn : NULL;
    pthread_mutex_unlock(&w->mu);
}
