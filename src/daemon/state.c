/* state.c - the state on disk around the store: lock, marker, service key, replay (state.h) */
#define _GNU_SOURCE
#include "state.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <unistd.h>

#include <jansson.h>

#include "command.h"
#include "log.h"
#include "sha256.h"

int osubd_state_lock(const char *state_path, int *fd, char *err, size_t errlen)
{
    /* flock: not disturbed by SQLite's own POSIX locks; a second daemon is refused before it
     * opens the database */
    char lock[600];
    snprintf(lock, sizeof(lock), "%s.lock", state_path);
    *fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (*fd < 0) {
        snprintf(err, errlen, "%s: %s", lock, strerror(errno));
        return -1;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen,
                 "%s: another oversubd runs on this state (it holds %s); stop it first, or give "
                 "this one another --state",
                 state_path, lock);
        close(*fd);
        *fd = -1;
        return -1;
    }
    return 0;
}

/* A value of the state's meta table: *text NULL when absent. A read that fails is an error
 * (-1 with a sentence in err), never "absent": a new service key or a new state would follow. */
int osubd_state_meta(osubd__store_t *st, const char *state_path, const char *key, char **text,
                     char *err, size_t errlen)
{
    if (osubd__store_meta_get(st, key, text) != 0) {
        snprintf(err, errlen, "%s: cannot read '%s' from the state: %s", state_path, key,
                 osubd__store_error(st));
        return -1;
    }
    return 0;
}

/* The key per-service tokens derive from: random, made with the state, kept in it (mode 0600),
 * so tokens survive restarts. */
int osubd_state_key(osubd__store_t *st, const char *state_path, bool existing, uint8_t key[32],
                    char *err, size_t errlen)
{
    char *hexkey = NULL;
    if (osubd_state_meta(st, state_path, "service_key", &hexkey, err, errlen) != 0)
        return -1;
    if (hexkey == NULL && existing) {
        /* a new key would invalidate every service's token: refuse instead */
        snprintf(err, errlen,
                 "%s: the state has no service key (its meta table is damaged); every service's "
                 "token derives from it",
                 state_path);
        return -1;
    }
    if (hexkey == NULL) {
        uint8_t k[32];
        if (getrandom(k, sizeof(k), 0) != (ssize_t)sizeof(k)) {
            snprintf(err, errlen, "cannot read random bytes for the service key: %s",
                     strerror(errno));
            return -1;
        }
        char h[65];
        for (int i = 0; i < 32; i++)
            snprintf(h + 2 * i, 3, "%02x", k[i]);
        if (osubd__store_meta_set(st, "service_key", h) != 0) {
            snprintf(err, errlen, "%s: %s", state_path, osubd__store_error(st));
            return -1;
        }
        memcpy(key, k, 32);
        return 0;
    }
    bool ok = strlen(hexkey) == 64;
    for (int i = 0; i < 64 && ok; i++) /* exactly 64 hex digits: sscanf would take " 1" */
        ok = isxdigit((unsigned char)hexkey[i]) != 0;
    for (int i = 0; i < 32 && ok; i++) {
        unsigned v;
        ok = sscanf(hexkey + 2 * i, "%2x", &v) == 1;
        key[i] = (uint8_t)v;
    }
    free(hexkey);
    if (!ok) {
        snprintf(err, errlen, "%s: the stored service key is damaged", state_path);
        return -1;
    }
    return 0;
}

void osubd_state_token(const uint8_t key[32], const char *id, char out[65])
{
    char msg[160];
    int n = snprintf(msg, sizeof(msg), "oversub service token:%s", id);
    uint8_t mac[32];
    osubd__hmac_sha256(key, 32, msg, (size_t)n, mac);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* ---- the state's marker: STATE.marker says which state this is and how far it went ---------
 * A deleted -wal file or a database emptied or replaced under the daemon would otherwise start
 * as a "new state" (or an older one) with the acknowledged services gone. The marker is one
 * 64-byte record, "oversub-state 1 ID SEQ", written in place after each commit (not synced: it
 * can only lag the database, never lead it), so a state that ends before the marker does lost
 * commands. */

static void state_id(const uint8_t key[32], char out[17])
{
    uint8_t mac[32];
    osubd__hmac_sha256(key, 32, "oversub state id", 16, mac);
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* 1 and the marker's id and sequence; 0 when there is none; -1 when it cannot be read. */
static int marker_read(const char *path, char id[17], int64_t *seq)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    char buf[65];
    ssize_t n = read(fd, buf, 64);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    long long s;
    char idb[17];
    if (sscanf(buf, "oversub-state 1 %16s %lld", idb, &s) != 2 || s < 0)
        return -1;
    memcpy(id, idb, 17);
    *seq = s;
    return 1;
}

/* early: before anything is written to an empty state; else after the replay, which gives
 * the state's last command */
int osubd_state_marker(const char *state_path, bool new_state, bool existing, bool early,
                       const uint8_t key[32], int64_t last_seq, int *fd, char id[17], char *err,
                       size_t errlen)
{
    char path[600], mid[17] = "", sid[17];
    snprintf(path, sizeof(path), "%s.marker", state_path);
    int64_t mseq = 0;
    int r = marker_read(path, mid, &mseq);
    if (r < 0) {
        if (!early)
            osubd_log(OSUBD_LOG_WARN, "%s cannot be read or is damaged: it is written anew", path);
        r = 0;
    }
    if (r == 1 && !new_state) {
        if (!existing && mseq > 0) {
            snprintf(err, errlen,
                     "%s is empty, but %s says it held %lld command(s) (state %s): the database "
                     "or its -wal file was deleted or replaced. Restore them, or start anew with "
                     "--new-state",
                     state_path, path, (long long)mseq, mid);
            return -1;
        }
        if (existing && !early) {
            state_id(key, sid);
            if (strcmp(sid, mid) != 0) {
                snprintf(err, errlen,
                         "%s is state %s, but %s belongs to state %s: the database was replaced. "
                         "Restore the right one, or take this one with --new-state",
                         state_path, sid, path, mid);
                return -1;
            }
            if (last_seq < mseq) {
                snprintf(err, errlen,
                         "%s ends at command %lld, but %s says %lld were written: the last %lld "
                         "are lost (was its -wal file deleted?). Restore it, or go on from what "
                         "is there with --new-state",
                         state_path, (long long)last_seq, path, (long long)mseq,
                         (long long)(mseq - last_seq));
                return -1;
            }
        }
    }
    if (early)
        return 0;
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (*fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    state_id(key, id);
    osubd_marker_write(*fd, id, last_seq);
    return 0;
}

void osubd_marker_write(int fd, const char *id, int64_t seq)
{
    char rec[65];
    memset(rec, ' ', 64);
    int n = snprintf(rec, sizeof(rec), "oversub-state 1 %s %lld", id, (long long)seq);
    if (n > 0 && n < 64)
        rec[n] = ' ';
    rec[63] = '\n';
    ssize_t w = pwrite(fd, rec, 64, 0);
    (void)w; /* a full disk: the marker lags, which it may */
}

/* The engine's settings of a new state, kept with it: a state without a snapshot yet replays
 * its log on exactly that engine. */
const char *osubd_state_engine_text(const osub_pool_config_t *c)
{
    static char t[400];
    snprintf(t, sizeof(t),
             "%d %d %lld %d %d %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld",
             c->ratio_milli, c->compute_ratio_milli, (long long)c->margin_mib,
             c->high_watermark_pct, c->low_watermark_pct, (long long)c->hysteresis_ms,
             (long long)c->ack_timeout_ms, (long long)c->grace_ms, (long long)c->min_runtime_ms,
             (long long)c->history_window_ms, (long long)c->restart_cost_ms,
             (long long)c->queue_aging_ms, (long long)c->prediction_trust_ms,
             (long long)c->floor_start_after_ms, (long long)c->suspend_host_mib,
             (long long)c->suspend_mib_per_s, (long long)c->suspend_timeout_ms,
             (long long)c->suspend_min_runtime_ms);
    return t;
}

int osubd_state_engine_config(osubd__store_t *st, const char *state_path, int32_t ratio_milli,
                              bool nvml, osub_pool_config_t *c, char *err, size_t errlen)
{
    osub_pool_config_default(c);
    c->ratio_milli = ratio_milli;
    char *t = NULL;
    if (osubd_state_meta(st, state_path, "engine_config", &t, err, errlen) != 0)
        return -1;
    long long v[18];
    int nv = t == NULL
                 ? 0
                 : sscanf(t,
                          "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld "
                          "%lld %lld %lld %lld %lld",
                          &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9],
                          &v[10], &v[11], &v[12], &v[13], &v[14], &v[15], &v[16], &v[17]);
    /* 12: a state made before the predictor, 14: before suspend (their defaults: suspend off) */
    if (nv == 12 || nv == 14 || nv == 18) {
        c->ratio_milli = (int32_t)v[0];
        c->compute_ratio_milli = (int32_t)v[1];
        c->margin_mib = v[2];
        c->high_watermark_pct = (int32_t)v[3];
        c->low_watermark_pct = (int32_t)v[4];
        c->hysteresis_ms = v[5];
        c->ack_timeout_ms = v[6];
        c->grace_ms = v[7];
        c->min_runtime_ms = v[8];
        c->history_window_ms = v[9];
        c->restart_cost_ms = v[10];
        c->queue_aging_ms = v[11];
        if (nv >= 14) {
            c->prediction_trust_ms = v[12];
            c->floor_start_after_ms = v[13];
        }
        if (nv == 18) {
            c->suspend_host_mib = v[14];
            c->suspend_mib_per_s = v[15];
            c->suspend_timeout_ms = v[16];
            c->suspend_min_runtime_ms = v[17];
        }
    } else if (t != NULL) {
        snprintf(err, errlen,
                 "%s: the state's engine settings are damaged ('%.60s'): its log cannot be "
                 "replayed as it was made",
                 state_path, t);
        free(t);
        return -1;
    } else if (nvml) {
        c->margin_mib = 1024; /* a state from before engine_config was kept */
    }
    free(t);
    return 0;
}

struct replay {
    osub_engine_t *e;
    int64_t expect; /* the next sequence number: the log has no gap */
    int64_t last_seq;
    int64_t last_ms;
    int64_t n;
    char err[300];
};

static int replay_cb(void *arg, int64_t seq, int64_t engine_ms, int64_t unix_ms, const char *cmd)
{
    (void)unix_ms;
    struct replay *r = arg;
    json_error_t je;
    json_t *j = json_loads(cmd, 0, &je);
    if (j == NULL) {
        snprintf(r->err, sizeof(r->err), "command %lld in the log is not JSON: %s", (long long)seq,
                 je.text);
        return -1;
    }
    if (seq != r->expect) {
        json_decref(j);
        snprintf(r->err, sizeof(r->err),
                 "the log misses commands %lld to %lld (the snapshot covers up to %lld): the "
                 "state is damaged",
                 (long long)r->expect, (long long)seq - 1, (long long)r->expect - 1);
        return -1;
    }
    r->expect++;
    char err[256];
    err[0] = '\0';
    osubd__cmd_apply(r->e, j, engine_ms, NULL, err, sizeof(err));
    json_decref(j);
    if (err[0] != '\0') { /* refused commands are logged; malformed ones never are */
        snprintf(r->err, sizeof(r->err), "command %lld in the log is not one: %s", (long long)seq,
                 err);
        return -1;
    }
    r->last_ms = engine_ms;
    r->last_seq = seq;
    r->n++;
    return 0;
}

int osubd_state_replay(osubd__store_t *st, osub_engine_t *e, int64_t upto,
                       struct osubd_replayed *out, char *err, size_t errlen)
{
    struct replay r = {.e = e, .expect = upto + 1};
    if (osubd__store_replay(st, upto, replay_cb, &r) != 0) {
        snprintf(err, errlen, "%s", r.err[0] ? r.err : osubd__store_error(st));
        return -1;
    }
    out->last_ms = r.last_ms;
    out->last_seq = r.n > 0 ? r.last_seq : upto;
    out->n = r.n;
    return 0;
}
