/* log.c - oversubd's logging layer (log.h) */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int osubd__log_level = OSUBD_LOG_INFO;
static FILE *log_stream;

void osubd__log(int level, const char *fmt, ...)
{
    static const char *const tag[] = {"", "", "warning: ", "error: "};
    char line[2048];
    int off = snprintf(line, sizeof(line), "oversubd: %s",
                       level >= 0 && level <= OSUBD_LOG_ERROR ? tag[level] : "");
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + off, sizeof(line) - (size_t)off - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)off + (n < 0 ? 0 : (size_t)n);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2; /* cut: the line still ends */
    line[len++] = '\n';
    FILE *f = log_stream != NULL ? log_stream : stderr;
    fwrite(line, 1, len, f); /* one write: lines of two threads never mix */
    fflush(f);
}

int osubd_log_parse_level(const char *name)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i <= OSUBD_LOG_ERROR; i++)
        if (name != NULL && strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

void osubd_log_set_level(int level)
{
    osubd__log_level = level;
}

void osubd_log_set_stream(FILE *f)
{
    log_stream = f;
}
