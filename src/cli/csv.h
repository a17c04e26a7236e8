/* csv.h - the CSV reader of the trace importers: buffered lines, fields, numbers */
#ifndef OSUB_CLI_CSV_H
#define OSUB_CLI_CSV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "oversub/engine.h"

#define CSV_FIELDS_MAX 16
#define CSV_LINE_MAX 4094 /* characters of a line, its end of line left out */

/* One file open for reading, a line at a time. Lines end in LF or CRLF (every CR and LF at the
 * end of a line is dropped), empty lines are skipped, fields are split on commas. */
struct csv {
    int fd;
    const char *path; /* borrowed */
    size_t line;      /* of the last line read, 1-based */
    uint64_t bytes;   /* read so far, and the file's size when opened */
    uint64_t size;
    char *buf; /* CSV_BUF bytes, owned */
    size_t beg, end;
    size_t nul; /* where the first NUL byte at or past beg is, end if none */
    bool eof;
    char *fields[CSV_FIELDS_MAX]; /* into buf, valid until the next csv_next */
    int nf;
};

/* Opens path (borrowed; it must outlive c) and checks that its first line starts with the
 * header. Returns 0, or -1 with a sentence naming the file in err (nothing left open). */
int csv_open(struct csv *c, const char *path, const char *header, char *err, size_t errlen);
/* Reads the next non-empty line into fields. Returns 1, 0 at the end, -1 with err (naming the
 * file and line) on a read error, a line longer than CSV_LINE_MAX, a NUL byte or more than
 * CSV_FIELDS_MAX fields. A last line without its newline ends at a NUL byte in it instead
 * (as the fgets reader before it had it: its figures stay the same). */
int csv_next(struct csv *c, char *err, size_t errlen);
/* Closes c; NULL-safe on a closed or zeroed struct. */
void csv_close(struct csv *c);

/* A non-negative decimal ("123", "12.5", spaces around it allowed) divided by div and rounded
 * up. Returns 0 or -1. */
int csv_parse_ceil(const char *s, int64_t div, int64_t *out);
/* A non-negative integer as strtoll reads it (leading spaces and a sign allowed). 0 or -1. */
int csv_parse_int(const char *s, int64_t *out);

/* Writes the sentence into err; returns -1. */
OSUB_PRINTF(3, 4) int csv_errf(char *err, size_t len, const char *fmt, ...);

#endif
