/* store.h - oversubd's durable state in SQLite: the latest engine snapshot and the commands
 * since, so that a restart (clean or after kill -9) ends in exactly the state it left */
#ifndef OSUB_DAEMON_STORE_H
#define OSUB_DAEMON_STORE_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct osubd__store osubd__store_t;

/*
 * Opens (creating it with mode 0600 if missing) the database at path: WAL journal,
 * synchronous=FULL, schema version checked and migrated. A file that is not an SQLite
 * database, a database of another application, or one of a newer schema is refused with a
 * sentence in err: nothing is reset. Returns 0 or -1. Not thread-safe: one thread uses a
 * store.
 */
int osubd__store_open(const char *path, osubd__store_t **out, char *err, size_t errlen);
void osubd__store_close(osubd__store_t *s);

/* Settings kept with the state (the pool, the time base). *value is malloc'd (NULL when the
 * key is absent). Return 0 or -1. */
int osubd__store_meta_get(osubd__store_t *s, const char *key, char **value);
int osubd__store_meta_set(osubd__store_t *s, const char *key, const char *value);

/* Appends one command and commits it (durably: it is on disk when this returns). */
int osubd__store_append(osubd__store_t *s, int64_t engine_ms, int64_t unix_ms, const char *cmd,
                        int64_t *seq_out);

/* Appends one command and the events it produced (JSON texts), in one transaction, durably.
 * Event sequence numbers go to ev_seqs (n_events of them) when not NULL. */
int osubd__store_append_with_events(osubd__store_t *s, int64_t engine_ms, int64_t unix_ms,
                                    const char *cmd, const char *const *events, size_t n_events,
                                    int64_t *seq_out, int64_t *ev_seqs);

/* One transaction around several calls (the writer's group commit): between begin and
 * commit, append_with_events and snapshot neither begin nor commit. commit is durable when it
 * returns 0; on -1 the transaction is rolled back. */
int osubd__store_begin(osubd__store_t *s);
int osubd__store_commit(osubd__store_t *s);
void osubd__store_rollback(osubd__store_t *s);

/* Events with a sequence number above since, oldest first, at most limit; cb gets each. */
typedef int (*osub_event_cb)(void *arg, int64_t seq, const char *json);
int osubd__store_events(osubd__store_t *s, int64_t since, int limit, osub_event_cb cb, void *arg);
/* The highest event sequence number (0 when none). */
int osubd__store_last_event(osubd__store_t *s, int64_t *seq);
/* Keeps the newest keep events, and none older than older_than_unix_ms (0: no age limit). */
int osubd__store_trim_events(osubd__store_t *s, int64_t keep, int64_t older_than_unix_ms);

/* Replaces the snapshot by body (the engine after command upto_seq) and drops the commands it
 * covers, in one transaction. */
int osubd__store_snapshot(osubd__store_t *s, const char *body, int64_t upto_seq);

/* Reads the snapshot (*snapshot malloc'd, NULL when there is none yet) and the last command
 * it covers (*upto_seq, 0 when none). */
int osubd__store_load_snapshot(osubd__store_t *s, char **snapshot, int64_t *upto_seq);

/* Calls cb for every command after upto_seq, in order; a non-zero return from cb stops and
 * is returned. */
typedef int (*osubd__store_cb)(void *arg, int64_t seq, int64_t engine_ms, int64_t unix_ms,
                               const char *cmd);
int osubd__store_replay(osubd__store_t *s, int64_t upto_seq, osubd__store_cb cb, void *arg);

/* The last error as a sentence (valid until the next call). */
const char *osubd__store_error(const osubd__store_t *s);
/* Was the last error a full disk (worth retrying once space returns)? */
bool osubd__store_full(const osubd__store_t *s);

#endif
