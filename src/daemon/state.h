/* state.h - the state on disk around the store: one oversubd per state (a lock), the marker
 * that tells a replaced or shortened database, the key service tokens derive from, the replay
 * of the log on an engine, the engine settings a state was made with. Pure functions over
 * their arguments: the core calls them at start. */
#ifndef OSUBD_STATE_H
#define OSUBD_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "oversub/engine.h"
#include "store.h"

/* STATE.lock, flock'ed: *fd, or -1 with a sentence (another oversubd holds it). */
int osubd_state_lock(const char *state_path, int *fd, char *err, size_t errlen);

/* A value of the state's meta table: *text NULL when absent. A read that fails is an error
 * (-1 with a sentence in err), never "absent": a new service key or a new state would follow. */
int osubd_state_meta(osubd__store_t *st, const char *state_path, const char *key, char **text,
                     char *err, size_t errlen);

/* The key per-service tokens derive from: read, or made (random) for a new state. An existing
 * state without one is refused: every service's token derives from it. */
int osubd_state_key(osubd__store_t *st, const char *state_path, bool existing, uint8_t key[32],
                    char *err, size_t errlen);

/* A service's token: HMAC-SHA256(key, "oversub service token:" id), 64 hex digits. */
void osubd_state_token(const uint8_t key[32], const char *id, char out[65]);

/*
 * STATE.marker: "oversub-state 1 ID SEQ", written in place after each commit (not synced: it
 * can only lag the database, never lead it). early: before anything is written to an empty
 * state (only refuses an empty database the marker says held commands); else after the
 * replay (last_seq: the state's last command): refuses a replaced or shortened database, then
 * opens the marker (*fd), writes it and gives the state's id. new_state: --new-state.
 */
int osubd_state_marker(const char *state_path, bool new_state, bool existing, bool early,
                       const uint8_t key[32], int64_t last_seq, int *fd, char id[17], char *err,
                       size_t errlen);
void osubd_marker_write(int fd, const char *id, int64_t seq);

/* The engine settings of a new state as kept with it; and those a state was made with (a
 * state without a snapshot replays its log on exactly that engine). nvml: the pool is NVML's
 * (a state from before the settings were kept had the driver's margin). */
const char *osubd_state_engine_text(const osub_pool_config_t *c);
int osubd_state_engine_config(osubd__store_t *st, const char *state_path, int32_t ratio_milli,
                              bool nvml, osub_pool_config_t *c, char *err, size_t errlen);

/* Replays the log after the snapshot (upto) on e: every command in order, none missing, none
 * malformed. The last command's engine time and sequence, and how many were replayed. */
struct osubd_replayed {
    int64_t last_ms, last_seq, n;
};
int osubd_state_replay(osubd__store_t *st, osub_engine_t *e, int64_t upto,
                       struct osubd_replayed *out, char *err, size_t errlen);

#endif
