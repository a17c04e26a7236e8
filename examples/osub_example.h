/* osub_example.h - what the example services share: the daemon's environment, a blocking
 * loopback HTTP client for the control API, and atomic file writes */
#ifndef OSUB_EXAMPLE_H
#define OSUB_EXAMPLE_H

#include <stddef.h>

/* The variables oversubd sets for a managed service (or a test sets for an external one). */
struct osx_env {
    const char *service, *control_url, *token, *checkpoint_dir, *resume_from;
    long vram_mib, batch_size;
};
void osx_env_read(struct osx_env *e);

/* One request to url's host (http://HOST:PORT), Connection: close. body may be NULL. The reply's
 * body goes to out (NUL-terminated, cut at outlen). Returns the status, or -1 with errno. */
int osx_http(const char *url, const char *method, const char *path, const char *token,
             const char *body, int timeout_s, char *out, size_t outlen);

/* Writes text to path through a temporary file and rename: a reader never sees half. 0 or -1. */
int osx_write_atomic(const char *path, const char *text);

/* Prints a line to stderr with the program's name and a timestamp. */
void osx_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
