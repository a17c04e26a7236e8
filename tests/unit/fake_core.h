/* fake_core.h - a stand-in for oversubd's core (src/daemon/core.h) for the unit tests of the
 * modules above it (routes, actuators, pods, gateway, API): every function core.h declares,
 * over a real engine on a small simulated pool, with no state on disk, no writer thread and a
 * clock the test sets.
 *
 * Link fake_core.c BEFORE the osubd library: the linker then finds every core.h symbol here
 * and never pulls core.o out of libosubd.a (a symbol missing here would pull it in and the
 * link would fail on the duplicates).
 *
 * What it does as the real core does: commands go through osubd__cmd_apply at the fake time
 * (a due tick first, as a command of its own); malformed commands and dry runs are not
 * recorded and reach no module; the modules' hooks run in the order they registered (events
 * after each command, forget for each service gone from the engine, dirty/save/saved around
 * every recorded command, durable when the log "moves"); osubd_core_meta reads an in-memory
 * meta table that osubd_core_meta_set and the modules' saves write.
 * What differs: before osubd_core_start a command is durable at once (as the real core writes
 * it then); after it, nothing is durable until the test calls fake_core_commit(), which plays
 * the writer's commit. osubd_core_events returns the durable events only, as the real one
 * reads them from disk.
 *
 * Ownership: the core owns the records it hands out (valid until osubd_core_free); every
 * const char * argument is borrowed. Not thread-safe (neither is the real one).
 */
#ifndef OSUB_TEST_FAKE_CORE_H
#define OSUB_TEST_FAKE_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "log.h"

/* A command the fake core applied and logged (not malformed, not a dry run). */
struct fake_core_cmd {
    char *text;        /* the command as compact JSON, keys sorted (as the real core logs it) */
    int rc;            /* the engine's code */
    int64_t engine_ms; /* the fake time it was applied at */
    uint64_t ticket;   /* its applied ticket (0: before osubd_core_start, durable at once) */
    size_t n_events;   /* the events it produced */
};

/* An osubd_note (also recorded as a "note" command, as the real core logs one). */
struct fake_core_note {
    char id[OSUB_ID_MAX + 1];
    char kind[32];
    char reason[32];
    char message[OSUB_EVENT_MSG_MAX + 200];
    enum osubd_log_level level; /* osubd_note: INFO; osubd_warn: WARN */
};

/* A core with an engine already made on pool (osub_parse_pool's form: "2x81920"), the
 * engine's settings and ratio from cfg (borrowed, must outlive the core). Ready for modules
 * to register; osubd_core_open is not needed (and refused: it would make a second engine).
 * NULL when pool is not one or memory ran out. */
struct osubd_core *fake_core_new(const struct osubd_config *cfg, const char *pool);

/* The clock: osubd_engine_now() returns engine_ms until set again (never moved backwards by
 * the fake itself); advance adds ms. */
void fake_core_set_time(struct osubd_core *c, int64_t engine_ms);
void fake_core_advance(struct osubd_core *c, int64_t ms);

/* Plays the writer's commit: everything applied is durable; the modules' durable hooks hear
 * {durable, commit = true, events: new events are on disk}. No-op before osubd_core_start
 * (everything is durable at once then). */
void fake_core_commit(struct osubd_core *c);

/* The disk filled (true: the modules hear {full = true}, mutations should be refused) or has
 * room again. */
void fake_core_set_full(struct osubd_core *c, bool full);
/* osubd_core_existing()'s answer (false unless set): a state that was there at start. */
void fake_core_set_existing(struct osubd_core *c, bool existing);
/* osubd_core_meta fails (with a sentence) while set: a load hook's error path. */
void fake_core_fail_meta(struct osubd_core *c, bool fail);
/* The modules' saves fail while set: saved(false) and the meta table keeps its values. */
void fake_core_fail_saves(struct osubd_core *c, bool fail);

/* The commands applied, oldest first (i < fake_core_n_cmds), and the last one (NULL: none). */
size_t fake_core_n_cmds(const struct osubd_core *c);
const struct fake_core_cmd *fake_core_cmd(const struct osubd_core *c, size_t i);
const struct fake_core_cmd *fake_core_last_cmd(const struct osubd_core *c);
/* The notes logged, oldest first. */
size_t fake_core_n_notes(const struct osubd_core *c);
const struct fake_core_note *fake_core_note(const struct osubd_core *c, size_t i);
/* Commands that came with the modules' records (a save), and meta[key] as it stands now
 * (borrowed; NULL when absent). */
size_t fake_core_n_saves(const struct osubd_core *c);
const char *fake_core_meta_text(const struct osubd_core *c, const char *key);

#endif
