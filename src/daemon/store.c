/* store.c - oversubd's durable state in SQLite: a snapshot plus the commands since */
#define _POSIX_C_SOURCE 200809L
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#define OSUB_APP_ID 0x4f535542 /* "OSUB" */
#define OSUB_SCHEMA 1

struct osubd__store {
    sqlite3 *db;
    sqlite3_stmt *append, *event;
    bool in_tx; /* inside osubd__store_begin: the calls below neither begin nor commit */
    bool full;  /* the last error was a full disk (SQLITE_FULL, ENOSPC, EDQUOT) */
    char err[512];
};

static void note_code(osubd__store_t *s)
{
    int code = s->db ? sqlite3_errcode(s->db) : 0;
    int sys = s->db ? sqlite3_system_errno(s->db) : 0;
    s->full = code == SQLITE_FULL || (code == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT));
}

static int fail(osubd__store_t *s, const char *what)
{
    note_code(s);
    snprintf(s->err, sizeof(s->err), "%s: %s", what, s->db ? sqlite3_errmsg(s->db) : "?");
    return -1;
}

bool osubd__store_full(const osubd__store_t *s)
{
    return s->full;
}

const char *osubd__store_error(const osubd__store_t *s)
{
    return s->err;
}

static int exec(osubd__store_t *s, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        note_code(s);
        snprintf(s->err, sizeof(s->err), "%s", msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int pragma_int(osubd__store_t *s, const char *sql, int64_t *out)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return fail(s, sql);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        sqlite3_finalize(st);
        return fail(s, sql);
    }
    *out = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return 0;
}

/* Schema version 1. Later versions add their steps after it. */
static const char *const schema_v1 =
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE snapshot (id INTEGER PRIMARY KEY CHECK (id = 1), upto_seq INTEGER NOT NULL,"
    " body TEXT NOT NULL);"
    /* AUTOINCREMENT: sequence numbers are never reused once a snapshot drops the log */
    "CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, engine_ms INTEGER NOT NULL,"
    " unix_ms INTEGER NOT NULL, cmd TEXT NOT NULL);"
    "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, unix_ms INTEGER NOT NULL,"
    " body TEXT NOT NULL);";

int osubd__store_open(const char *path, osubd__store_t **out, char *err, size_t errlen)
{
    *out = NULL;
    /* create it 0600 ourselves (SQLite would follow the umask), and only when it does not
     * exist: closing any descriptor of an open database drops this process's POSIX locks on
     * it (SQLite's connections included), and the next outside connection to close would then
     * delete the WAL under our feet */
    struct stat st;
    if (stat(path, &st) != 0) {
        int fd = errno == ENOENT ? open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
        if (fd < 0 && errno != EEXIST) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return -1;
        }
        if (fd >= 0)
            close(fd);
    }
    osubd__store_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    int64_t app = 0, ver = 0, tables = 0;
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, NULL) !=
        SQLITE_OK)
        goto err;
    sqlite3_busy_timeout(s->db, 5000);
    /* a file that is not a database fails on the first read */
    if (pragma_int(s, "PRAGMA application_id", &app) != 0 ||
        pragma_int(s, "PRAGMA user_version", &ver) != 0 ||
        pragma_int(s, "SELECT count(*) FROM sqlite_master", &tables) != 0)
        goto err;
    if (app != OSUB_APP_ID && (app != 0 || tables != 0)) {
        snprintf(s->err, sizeof(s->err),
                 "not an oversub database (application id %lld, %lld tables): refusing to "
                 "touch it",
                 (long long)app, (long long)tables);
        goto err;
    }
    if (ver > OSUB_SCHEMA) {
        snprintf(s->err, sizeof(s->err),
                 "the database has schema version %lld, this oversubd knows up to %d: upgrade "
                 "oversubd",
                 (long long)ver, OSUB_SCHEMA);
        goto err;
    }
    /* the WAL is truncated to 4 MiB after a checkpoint: a busy state does not keep a large
     * file on a small disk */
    if (exec(s, "PRAGMA journal_mode=WAL") != 0 || exec(s, "PRAGMA synchronous=FULL") != 0 ||
        exec(s, "PRAGMA journal_size_limit=4194304") != 0)
        goto err;
    if (ver < 1) {
        char sql[1024];
        snprintf(sql, sizeof(sql),
                 "BEGIN; %s PRAGMA application_id=%d; PRAGMA user_version=1; "
                 "COMMIT;",
                 schema_v1, OSUB_APP_ID);
        if (exec(s, sql) != 0) {
            exec(s, "ROLLBACK");
            goto err;
        }
    }
    if (sqlite3_prepare_v2(s->db, "INSERT INTO log (engine_ms, unix_ms, cmd) VALUES (?1, ?2, ?3)",
                           -1, &s->append, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db, "INSERT INTO events (unix_ms, body) VALUES (?1, ?2)", -1,
                           &s->event, NULL) != SQLITE_OK) {
        fail(s, "preparing the log");
        goto err;
    }
    *out = s;
    return 0;
err:
    snprintf(err, errlen, "%s: %s", path, s->err[0] ? s->err : sqlite3_errmsg(s->db));
    osubd__store_close(s);
    return -1;
}

void osubd__store_close(osubd__store_t *s)
{
    if (s == NULL)
        return;
    sqlite3_finalize(s->append);
    sqlite3_finalize(s->event);
    sqlite3_close(s->db);
    free(s);
}

int osubd__store_meta_get(osubd__store_t *s, const char *key, char **value)
{
    *value = NULL;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE key = ?1", -1, &st, NULL) !=
        SQLITE_OK)
        return fail(s, "reading meta");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        const char *v = (const char *)sqlite3_column_text(st, 0);
        *value = strdup(v ? v : "");
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return fail(s, "reading meta");
    return 0;
}

int osubd__store_meta_set(osubd__store_t *s, const char *key, const char *value)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)", -1,
                           &st, NULL) != SQLITE_OK)
        return fail(s, "writing meta");
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : fail(s, "writing meta");
}

int osubd__store_append(osubd__store_t *s, int64_t engine_ms, int64_t unix_ms, const char *cmd,
                        int64_t *seq_out)
{
    sqlite3_reset(s->append);
    sqlite3_bind_int64(s->append, 1, engine_ms);
    sqlite3_bind_int64(s->append, 2, unix_ms);
    sqlite3_bind_text(s->append, 3, cmd, -1, SQLITE_STATIC);
    if (sqlite3_step(s->append) != SQLITE_DONE)
        return fail(s, "appending a command");
    if (seq_out != NULL)
        *seq_out = sqlite3_last_insert_rowid(s->db);
    return 0;
}

int osubd__store_begin(osubd__store_t *s)
{
    if (exec(s, "BEGIN IMMEDIATE") != 0)
        return -1;
    s->in_tx = true;
    return 0;
}

int osubd__store_commit(osubd__store_t *s)
{
    s->in_tx = false;
    if (exec(s, "COMMIT") != 0) {
        osubd__store_rollback(s);
        return -1;
    }
    return 0;
}

/* SQLite may have rolled back by itself (a full disk does): then there is nothing to undo, and
 * the error that says why stays the one reported. */
void osubd__store_rollback(osubd__store_t *s)
{
    s->in_tx = false;
    if (sqlite3_get_autocommit(s->db))
        return;
    char keep[512];
    bool full = s->full;
    snprintf(keep, sizeof(keep), "%s", s->err);
    exec(s, "ROLLBACK");
    snprintf(s->err, sizeof(s->err), "%s", keep);
    s->full = full;
}

int osubd__store_snapshot(osubd__store_t *s, const char *body, int64_t upto_seq)
{
    if (!s->in_tx && exec(s, "BEGIN IMMEDIATE") != 0)
        return -1;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(
            s->db, "INSERT OR REPLACE INTO snapshot (id, upto_seq, body) VALUES (1, ?1, ?2)", -1,
            &st, NULL) != SQLITE_OK)
        goto err;
    sqlite3_bind_int64(st, 1, upto_seq);
    sqlite3_bind_text(st, 2, body, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        goto err;
    if (sqlite3_prepare_v2(s->db, "DELETE FROM log WHERE seq <= ?1", -1, &st, NULL) != SQLITE_OK)
        goto err;
    sqlite3_bind_int64(st, 1, upto_seq);
    rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        goto err;
    return s->in_tx ? 0 : exec(s, "COMMIT");
err:
    fail(s, "writing the snapshot");
    if (!s->in_tx)
        exec(s, "ROLLBACK");
    return -1;
}

int osubd__store_load_snapshot(osubd__store_t *s, char **snapshot, int64_t *upto_seq)
{
    *snapshot = NULL;
    *upto_seq = 0;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "SELECT upto_seq, body FROM snapshot WHERE id = 1", -1, &st,
                           NULL) != SQLITE_OK)
        return fail(s, "reading the snapshot");
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *upto_seq = sqlite3_column_int64(st, 0);
        const char *b = (const char *)sqlite3_column_text(st, 1);
        *snapshot = strdup(b ? b : "");
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return fail(s, "reading the snapshot");
    return 0;
}

int osubd__store_replay(osubd__store_t *s, int64_t upto_seq, osubd__store_cb cb, void *arg)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT seq, engine_ms, unix_ms, cmd FROM log WHERE seq > ?1 "
                           "ORDER BY seq",
                           -1, &st, NULL) != SQLITE_OK)
        return fail(s, "reading the log");
    sqlite3_bind_int64(st, 1, upto_seq);
    int out = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *cmd = (const char *)sqlite3_column_text(st, 3);
        out = cb(arg, sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
                 sqlite3_column_int64(st, 2), cmd ? cmd : "");
        if (out != 0)
            break;
    }
    sqlite3_finalize(st);
    if (out == 0 && rc != SQLITE_DONE)
        return fail(s, "reading the log");
    return out;
}

int osubd__store_append_with_events(osubd__store_t *s, int64_t engine_ms, int64_t unix_ms,
                                    const char *cmd, const char *const *events, size_t n_events,
                                    int64_t *seq_out, int64_t *ev_seqs)
{
    if (!s->in_tx && exec(s, "BEGIN IMMEDIATE") != 0)
        return -1;
    if (osubd__store_append(s, engine_ms, unix_ms, cmd, seq_out) != 0)
        goto err;
    for (size_t i = 0; i < n_events; i++) {
        sqlite3_reset(s->event);
        sqlite3_bind_int64(s->event, 1, unix_ms);
        sqlite3_bind_text(s->event, 2, events[i], -1, SQLITE_STATIC);
        if (sqlite3_step(s->event) != SQLITE_DONE) {
            fail(s, "appending an event");
            goto err;
        }
        if (ev_seqs != NULL)
            ev_seqs[i] = sqlite3_last_insert_rowid(s->db);
    }
    sqlite3_reset(s->append);
    sqlite3_reset(s->event);
    if (!s->in_tx && exec(s, "COMMIT") != 0)
        goto err;
    return 0;
err:
    sqlite3_reset(s->append);
    sqlite3_reset(s->event);
    if (!s->in_tx)
        exec(s, "ROLLBACK");
    return -1;
}

int osubd__store_events(osubd__store_t *s, int64_t since, int limit, osub_event_cb cb, void *arg)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT seq, body FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2", -1,
                           &st, NULL) != SQLITE_OK)
        return fail(s, "reading events");
    sqlite3_bind_int64(st, 1, since);
    sqlite3_bind_int(st, 2, limit);
    int rc, out = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *b = (const char *)sqlite3_column_text(st, 1);
        out = cb(arg, sqlite3_column_int64(st, 0), b ? b : "{}");
        if (out != 0)
            break;
    }
    sqlite3_finalize(st);
    if (out == 0 && rc != SQLITE_DONE)
        return fail(s, "reading events");
    return out;
}

int osubd__store_last_event(osubd__store_t *s, int64_t *seq)
{
    *seq = 0;
    int64_t v;
    if (pragma_int(s, "SELECT coalesce(max(seq), 0) FROM events", &v) != 0)
        return -1;
    *seq = v;
    return 0;
}

int osubd__store_trim_events(osubd__store_t *s, int64_t keep, int64_t older_than_unix_ms)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db,
                           "DELETE FROM events WHERE seq <= (SELECT coalesce(max(seq), 0) FROM "
                           "events) - ?1 OR unix_ms < ?2",
                           -1, &st, NULL) != SQLITE_OK)
        return fail(s, "trimming events");
    sqlite3_bind_int64(st, 1, keep);
    sqlite3_bind_int64(st, 2, older_than_unix_ms);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : fail(s, "trimming events");
}
