/* log.h - oversubd's one logging layer: a line per message on stderr, "oversubd: " first */
#ifndef OSUBD_LOG_H
#define OSUBD_LOG_H

#include <stdio.h>

enum osubd_log_level {
    OSUBD_LOG_DEBUG, /* what a developer follows (--log-level debug) */
    OSUBD_LOG_INFO,  /* what oversubd did and why: the default */
    OSUBD_LOG_WARN,  /* something is wrong and oversubd goes on */
    OSUBD_LOG_ERROR, /* oversubd cannot go on, or refuses to start */
};

/* Messages below this level are dropped (OSUBD_LOG_INFO unless set). */
extern int osubd__log_level;

/*
 * osubd_log(level, fmt, ...): prints "oversubd: " then the message and a newline, as one
 * write, when level is at least the threshold. The threshold is tested before the arguments
 * are evaluated: a debug line whose arguments cost something costs nothing when it is off.
 * WARN lines read "oversubd: warning: ...", ERROR lines "oversubd: error: ...".
 */
#define osubd_log(level, ...)                                                                      \
    do {                                                                                           \
        if ((int)(level) >= osubd__log_level)                                                      \
            osubd__log((int)(level), __VA_ARGS__);                                                 \
    } while (0)

void osubd__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "debug", "info", "warn" or "error": the level, or -1. */
int osubd_log_parse_level(const char *name);
void osubd_log_set_level(int level);
/* Where lines go: stderr unless set (the unit tests catch them in a file). */
void osubd_log_set_stream(FILE *f);

#endif
