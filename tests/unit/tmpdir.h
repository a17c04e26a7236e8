/* tmpdir.h - a temporary folder for a unit test (mkdtemp under /tmp) and its removal with
 * everything in it (nftw, depth first, links not followed): no shell, no program run. */
#ifndef OSUB_TEST_TMPDIR_H
#define OSUB_TEST_TMPDIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Makes /tmp/osub-WHAT-XXXXXX into out: 0, or -1. */
static inline int tmpdir_make(char *out, size_t len, const char *what)
{
    if ((size_t)snprintf(out, len, "/tmp/osub-%s-XXXXXX", what) >= len)
        return -1;
    return mkdtemp(out) != NULL ? 0 : -1;
}

static inline int tmpdir_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) == 0 ? 0 : -1;
}

/* Removes dir and what it holds: 0, or -1. */
static inline int tmpdir_remove(const char *dir)
{
    return nftw(dir, tmpdir_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
