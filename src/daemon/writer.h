/* writer.h - the group-commit writer: a thread that owns its own connection to the state and
 * commits, in one durable transaction, every command (with its events, and the snapshot taken
 * after it when there is one) the event loop handed it since its last commit. The loop never
 * waits for the disk: it hands a command over, holds that command's reply, and sends it when a
 * pipe says the command's ticket is durable. */
#ifndef OSUB_DAEMON_WRITER_H
#define OSUB_DAEMON_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct osubd__writer osubd__writer_t;

/* Opens path (already made by the loop's store) and starts the thread. events_keep and
 * events_days (0: no age limit) trim the event log after each snapshot. */
int osubd__writer_start(const char *path, int64_t last_log_seq, int64_t events_keep,
                        int64_t events_days, osubd__writer_t **out, char *err, size_t errlen);

/* After each commit, write_fn(fd, id, the last durable command's sequence) (the state's
 * marker, daemon.c). */
void osubd__writer_set_marker(osubd__writer_t *w, int fd, const char *id,
                              void (*write_fn)(int fd, const char *id, int64_t seq));

/* The pipe's read end: readable when commits completed (or the writer failed). */
int osubd__writer_fd(const osubd__writer_t *w);

/* Hands one command over (cmd, the n event texts, snapshot and meta, all malloc'd, become the
 * writer's; snapshot and meta may be NULL; meta, a JSON object of strings, sets those keys of
 * the state's meta table in the same transaction). Returns its ticket, counting from 1. */
uint64_t osubd__writer_add(osubd__writer_t *w, int64_t engine_ms, int64_t unix_ms, char *cmd,
                           char **events, size_t n, char *snapshot, char *meta);

struct osubd__writer_progress {
    uint64_t durable;        /* every ticket up to this one is on disk */
    int64_t last_log_seq;    /* the log's sequence number of the last durable command */
    int64_t last_event_seq;  /* the newest durable event */
    uint64_t commits, items; /* transactions and commands so far (items / commits: the grouping) */
    bool full; /* the disk is full: commands wait in memory, retried each second (err says it) */
};

/* Drains the pipe and reads where the writer is. Returns 0, or -1 with a sentence in err when
 * a commit failed (the writer then stops taking work: the state on disk is the truth). */
int osubd__writer_progress(osubd__writer_t *w, struct osubd__writer_progress *p, char *err,
                           size_t errlen);

/* Commits what is left, stops the thread, closes its connection, fills *p (may be NULL).
 * Returns 0 or -1 (a commit failed at some point). */
int osubd__writer_stop(osubd__writer_t *w, struct osubd__writer_progress *p);

#endif
