/* trace.c - importers for simulate/advise: the GenAI trace folder, services + usage files */
#define _POSIX_C_SOURCE 200809L
#include "trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <jansson.h>

#include "csv.h"
#include "spec_json.h"

uint64_t fnv1a64(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

/* ---- progress ----------------------------------------------------------------------- */

static FILE *progress_to;

void trace_set_progress(FILE *f)
{
    progress_to = f;
}

FILE *progress_file(void)
{
    return progress_to;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void progress_begin(struct progress *p)
{
    p->t0 = mono_s();
    p->next = p->t0 + 3.0;
    p->said = false;
}

bool progress_due(struct progress *p)
{
    double now = mono_s();
    if (now < p->next)
        return false;
    p->next = now + 5.0;
    p->said = true;
    return true;
}

double progress_elapsed(const struct progress *p)
{
    return mono_s() - p->t0;
}

double peak_rss_mib(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

void genai_opts_default(struct genai_opts *o)
{
    o->buffer_milli = 300;
    o->floor_pct = 50;
    o->classes[0] = 20;
    o->classes[1] = 40;
    o->classes[2] = 40;
    o->part = o->parts = 0;
    o->window = false;
    o->from_s = o->to_s = 0;
}

/* True when pod (its id as in the file) belongs to the part of the pods asked for. */
static bool in_part(const struct genai_opts *o, const char *pod)
{
    if (o->parts <= 0)
        return true;
    char key[96];
    snprintf(key, sizeof(key), "split:%s", pod);
    return fnv1a64(key) % (uint64_t)o->parts == (uint64_t)o->part;
}

/* Keeps only the samples inside the time window; recomputes each pod's peak. */
static void cut_window(struct trace *tr, const struct genai_opts *o)
{
    if (!o->window)
        return;
    int64_t t0 = tr->t0;
    for (size_t i = 0; i < tr->n; i++) {
        struct trace_svc *s = &tr->svcs[i];
        size_t w = 0;
        s->peak_mib = 0;
        for (size_t j = 0; j < s->n; j++) {
            int64_t dt = s->samples[j].t_s - t0;
            if (dt < o->from_s || dt >= o->to_s)
                continue;
            s->samples[w++] = s->samples[j];
            if (s->samples[j].vram_mib > s->peak_mib)
                s->peak_mib = s->samples[j].vram_mib;
        }
        s->n = w;
    }
}

OSUB_PRINTF(3, 4)
static int errf(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- the services by id --------------------------------------------------------------- */

/* The services of a trace being imported, by id: open addressing over their indices (a month
 * of 10,000 pods is 78 million rows, and a scan of the services per row was an import's whole
 * time). Ids are unique in it, so a lookup finds what the scan found. */
struct idx {
    int32_t *slot; /* -1: empty; else an index into tr->svcs */
    size_t cap;    /* a power of two, more than twice the services */
};

static void idx_free(struct idx *x)
{
    free(x->slot);
    x->slot = NULL;
    x->cap = 0;
}

static void idx_put(struct idx *x, const struct trace *tr, int32_t i)
{
    size_t h = fnv1a64(tr->svcs[i].spec.id) & (x->cap - 1);
    while (x->slot[h] >= 0)
        h = (h + 1) & (x->cap - 1);
    x->slot[h] = i;
}

/* Makes room for one more service. Returns 0 or -1 (out of memory; x unchanged). */
static int idx_reserve(struct idx *x, const struct trace *tr)
{
    if ((tr->n + 1) * 2 < x->cap)
        return 0;
    size_t cap = x->cap ? x->cap * 2 : 1024;
    int32_t *slot = malloc(cap * sizeof(*slot));
    if (slot == NULL || tr->n >= INT32_MAX / 2) {
        free(slot);
        return -1;
    }
    for (size_t h = 0; h < cap; h++)
        slot[h] = -1;
    free(x->slot);
    x->slot = slot;
    x->cap = cap;
    for (size_t i = 0; i < tr->n; i++)
        idx_put(x, tr, (int32_t)i);
    return 0;
}

/* The index of the service named id, or -1. */
static int32_t idx_get(const struct idx *x, const struct trace *tr, const char *id)
{
    if (x->cap == 0)
        return -1;
    size_t h = fnv1a64(id) & (x->cap - 1);
    for (; x->slot[h] >= 0; h = (h + 1) & (x->cap - 1))
        if (strcmp(tr->svcs[x->slot[h]].spec.id, id) == 0)
            return x->slot[h];
    return -1;
}

static struct trace_svc *find_or_add(struct trace *tr, struct idx *x, const char *id, bool add)
{
    int32_t i = idx_get(x, tr, id);
    if (i >= 0)
        return &tr->svcs[i];
    if (!add || idx_reserve(x, tr) != 0)
        return NULL;
    if (tr->n == tr->cap) {
        size_t cap = tr->cap ? tr->cap * 2 : 64;
        struct trace_svc *n = realloc(tr->svcs, cap * sizeof(*n));
        if (n == NULL)
            return NULL;
        tr->svcs = n;
        tr->cap = cap;
    }
    struct trace_svc *s = &tr->svcs[tr->n++];
    memset(s, 0, sizeof(*s));
    osub_spec_init(&s->spec, id, "batch");
    idx_put(x, tr, (int32_t)(tr->n - 1));
    return s;
}

static int add_sample(struct trace_svc *s, int64_t t, int64_t mib, int32_t compute)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        struct sample *n = realloc(s->samples, cap * sizeof(*n));
        if (n == NULL)
            return -1;
        s->samples = n;
        s->cap = cap;
    }
    if (mib > INT32_MAX)
        return -1;
    s->samples[s->n++] = (struct sample){t, (int32_t)mib, (int16_t)compute};
    if (mib > s->peak_mib)
        s->peak_mib = mib;
    return 0;
}

static int cmp_sample(const void *a, const void *b)
{
    const struct sample *x = a, *y = b;
    return (x->t_s > y->t_s) - (x->t_s < y->t_s);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* At most this many clock steps: a week of seconds fits, a corrupt timestamp does not. */
#define OSUB_TRACE_MAX_STEPS 20000000

/* A trace spanning absurdly many steps is a corrupt timestamp, not a long history. */
static int check_span(const struct trace *tr, const char *file, char *err, size_t errlen)
{
    int64_t steps = (tr->t1 - tr->t0) / (tr->step_s > 0 ? tr->step_s : 1) + 1;
    if (steps > OSUB_TRACE_MAX_STEPS)
        return errf(err, errlen,
                    "%s: the samples run from %lld to %lld s, %lld steps of %lld s: more than "
                    "%d (a corrupt timestamp?)",
                    file, (long long)tr->t0, (long long)tr->t1, (long long)steps,
                    (long long)tr->step_s, OSUB_TRACE_MAX_STEPS);
    return 0;
}

/* True when s's samples are in strictly increasing time (as a trace written in time order
 * is): sorting leaves them as they are, and a time names one sample. */
static bool strictly_sorted(const struct trace_svc *s)
{
    for (size_t j = 1; j < s->n; j++)
        if (s->samples[j].t_s <= s->samples[j - 1].t_s)
            return false;
    return true;
}

/* Sorts samples, merges duplicates (same time: the larger), fills t0/t1/step. */
static void finish_trace(struct trace *tr)
{
    tr->t0 = INT64_MAX;
    tr->t1 = INT64_MIN;
    int64_t gaps[64] = {0};
    size_t gap_counts[64] = {0};
    int ng = 0;
    for (size_t i = 0; i < tr->n; i++) {
        struct trace_svc *s = &tr->svcs[i];
        if (s->n == 0)
            continue; /* a service without samples: the caller skips it */
        if (!strictly_sorted(s))
            qsort(s->samples, s->n, sizeof(*s->samples), cmp_sample);
        size_t w = 0;
        for (size_t j = 0; j < s->n; j++) {
            if (w > 0 && s->samples[w - 1].t_s == s->samples[j].t_s) {
                if (s->samples[j].vram_mib > s->samples[w - 1].vram_mib)
                    s->samples[w - 1] = s->samples[j];
                continue;
            }
            s->samples[w++] = s->samples[j];
        }
        s->n = w;
        if (s->n == 0)
            continue;
        if (s->samples[0].t_s < tr->t0)
            tr->t0 = s->samples[0].t_s;
        if (s->samples[s->n - 1].t_s > tr->t1)
            tr->t1 = s->samples[s->n - 1].t_s;
        for (size_t j = 1; j < s->n && j < 64; j++) {
            int64_t g = s->samples[j].t_s - s->samples[j - 1].t_s;
            int k = 0;
            while (k < ng && gaps[k] != g)
                k++;
            if (k == ng && ng < 64)
                gaps[ng++] = g;
            if (k < 64)
                gap_counts[k]++;
        }
    }
    tr->step_s = 60;
    size_t best = 0;
    for (int k = 0; k < ng; k++)
        if (gap_counts[k] > best) {
            best = gap_counts[k];
            tr->step_s = gaps[k];
        }
    if (tr->t0 > tr->t1) /* no sample at all */
        tr->t0 = tr->t1 = 0;
}

void trace_free(struct trace *tr)
{
    for (size_t i = 0; i < tr->n; i++)
        free(tr->svcs[i].samples);
    free(tr->svcs);
    memset(tr, 0, sizeof(*tr));
}

size_t trace_samples(const struct trace *tr)
{
    size_t n = 0;
    for (size_t i = 0; i < tr->n; i++)
        n += tr->svcs[i].n;
    return n;
}

/* ---- the GenAI folder ------------------------------------------------------------------ */

/* A trace written in time order names its pods in the same order at every time: the service
 * that followed the previous row's service last time is tried first (a strcmp instead of a
 * hash), falling back on the index. next[0] guesses the first row, next[1 + i] what follows
 * service i. */
struct succ {
    int32_t *next;
    size_t cap;
    int32_t prev; /* the previous row's service, -1 before the first */
};

/* "pod-" and at most max characters of pod, lowercased when lower (ASCII, as tolower in the C
 * locale the CLI runs in). */
static void pod_id(char *id, const char *pod, size_t max, bool lower)
{
    size_t n = strnlen(pod, max);
    memcpy(id, "pod-", 4);
    memcpy(id + 4, pod, n);
    id[4 + n] = '\0';
    for (size_t j = 4; lower && j < 4 + n; j++)
        if (id[j] >= 'A' && id[j] <= 'Z')
            id[j] = (char)(id[j] - 'A' + 'a');
}

/* The service of a row naming pod, whose id is pod_id(pod, max, lower), or -1. The guess is
 * checked on pod itself: every id of a GenAI import is "pod-" and a pod id of at most 59
 * characters (max is more), and a pod id equal to a lowercased one is its own lowercasing.
 * On a miss the id is built into id (the caller's, 80 bytes) and looked up. */
static int32_t succ_find(struct succ *q, const struct idx *x, const struct trace *tr,
                         const char *pod, size_t max, bool lower, char *id)
{
    size_t k = (size_t)(q->prev + 1);
    if (k < q->cap && q->next[k] >= 0 && (size_t)q->next[k] < tr->n &&
        strcmp(tr->svcs[q->next[k]].spec.id + 4, pod) == 0)
        return q->next[k];
    pod_id(id, pod, max, lower);
    return idx_get(x, tr, id);
}

/* Service i follows the previous row's. Returns 0 or -1 (out of memory). */
static int succ_note(struct succ *q, int32_t i)
{
    size_t k = (size_t)(q->prev + 1);
    if (k >= q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 1024;
        while (cap <= k)
            cap *= 2;
        int32_t *n = realloc(q->next, cap * sizeof(*n));
        if (n == NULL)
            return -1;
        for (size_t j = q->cap; j < cap; j++)
            n[j] = -1;
        q->next = n;
        q->cap = cap;
    }
    q->next[k] = i;
    q->prev = i;
    return 0;
}

/* The rows of one time share its text: parsed once. */
struct tscache {
    char text[24];
    int64_t t;
};

static int parse_time(struct tscache *c, const char *s, int64_t *t)
{
    if (strcmp(c->text, s) == 0) {
        *t = c->t;
        return 0;
    }
    if (csv_parse_int(s, t) != 0)
        return -1;
    if (strlen(s) < sizeof(c->text)) {
        strcpy(c->text, s);
        c->t = *t;
    }
    return 0;
}

/* Progress of a long read: "simulate: reading FILE: 1.2 of 2.8 GB (43%)". Reads the clock
 * every 2^20 rows. */
static void read_progress(struct progress *p, const struct csv *c)
{
    FILE *f = progress_file();
    if (f == NULL || (c->line & 0xfffff) != 0 || !progress_due(p))
        return;
    if (c->size > 0)
        fprintf(f, "simulate: reading %s: %.2f of %.2f GB (%.0f%%), %.0f s\n", c->path,
                (double)c->bytes / 1e9, (double)c->size / 1e9,
                100.0 * (double)c->bytes / (double)c->size, progress_elapsed(p));
    else
        fprintf(f, "simulate: reading %s: line %zu, %.0f s\n", c->path, c->line,
                progress_elapsed(p));
}

/* The service a load-time row names (its id, or pod- and its id), the first of the two in
 * the trace's order; -1 when none. */
static int32_t load_row_svc(const struct idx *x, const struct trace *tr, const char *pod)
{
    int32_t a = idx_get(x, tr, pod), b = -1;
    char id[OSUB_ID_MAX + 8];
    if (strlen(pod) <= OSUB_ID_MAX) {
        pod_id(id, pod, OSUB_ID_MAX, false);
        b = idx_get(x, tr, id);
    }
    return a < 0 ? b : b < 0 ? a : a < b ? a : b;
}

/* The value of rank k (0-based) of v[0..n), as v[k] after sorting it (v is reordered):
 * quickselect, handing over to a sort should it meet a bad run of pivots. */
static int64_t select_i64(int64_t *v, size_t n, size_t k)
{
    size_t lo = 0, hi = n; /* the rank k lies in [lo, hi) */
    for (int round = 0; hi - lo > 16; round++) {
        if (round == 64) {
            qsort(v + lo, hi - lo, sizeof(*v), cmp_i64);
            return v[k];
        }
        int64_t a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi - 1];
        int64_t pivot = a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b);
        /* three ways: [lo, lt) below the pivot, [lt, gt) equal, [gt, hi) above */
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            int64_t x = v[i];
            if (x < pivot) {
                v[i++] = v[lt];
                v[lt++] = x;
            } else if (x > pivot) {
                v[i] = v[--gt];
                v[gt] = x;
            } else {
                i++;
            }
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return pivot;
    }
    qsort(v + lo, hi - lo, sizeof(*v), cmp_i64);
    return v[k];
}

/* Per service, its median load time (0: none) in *per_svc (returned owned), and the whole
 * trace's in *trace_median (60 s without any). The file is optional. */
static int load_ms_medians(const char *path, struct trace *tr, const struct idx *x,
                           int64_t *trace_median, char *err, size_t errlen, int64_t **per_svc)
{
    *per_svc = calloc(tr->n ? tr->n : 1, sizeof(int64_t));
    if (*per_svc == NULL)
        return errf(err, errlen, "out of memory");
    *trace_median = 60000;
    struct csv c;
    FILE *probe = fopen(path, "rb");
    if (probe == NULL)
        return 0; /* optional file */
    fclose(probe);
    if (csv_open(&c, path, "timestamp_s,pod,load_ms", err, errlen) != 0)
        return -1;
    int64_t *all = NULL;
    size_t na = 0, capa = 0;
    int64_t **lists = calloc(tr->n ? tr->n : 1, sizeof(*lists));
    size_t *ln = calloc(tr->n ? tr->n : 1, sizeof(*ln)),
           *lc = calloc(tr->n ? tr->n : 1, sizeof(*lc));
    int r = 0, rc = 0;
    if (lists == NULL || ln == NULL || lc == NULL)
        rc = errf(err, errlen, "out of memory");
    struct progress pg;
    progress_begin(&pg);
    while (rc == 0 && (r = csv_next(&c, err, errlen)) == 1) {
        read_progress(&pg, &c);
        int64_t t, ms;
        if (c.nf != 3 || csv_parse_int(c.fields[0], &t) != 0 ||
            csv_parse_ceil(c.fields[2], 1, &ms) != 0) {
            rc = errf(err, errlen, "%s: line %zu: expected timestamp_s,pod,load_ms", path, c.line);
            break;
        }
        if (na == capa) {
            capa = capa ? capa * 2 : 1024;
            int64_t *n = realloc(all, capa * sizeof(*n));
            if (n == NULL) {
                rc = errf(err, errlen, "out of memory");
                break;
            }
            all = n;
        }
        all[na++] = ms;
        int32_t i = load_row_svc(x, tr, c.fields[1]);
        if (i < 0)
            continue;
        if (ln[i] == lc[i]) {
            lc[i] = lc[i] ? lc[i] * 2 : 16;
            int64_t *n = realloc(lists[i], lc[i] * sizeof(*n));
            if (n == NULL) {
                rc = errf(err, errlen, "out of memory");
                break;
            }
            lists[i] = n;
        }
        lists[i][ln[i]++] = ms;
    }
    if (r < 0)
        rc = -1;
    if (rc == 0 && na > 0) {
        *trace_median = select_i64(all, na, na / 2);
    }
    for (size_t i = 0; i < tr->n && lists != NULL && ln != NULL; i++) {
        if (ln[i] > 0) {
            (*per_svc)[i] = select_i64(lists[i], ln[i], ln[i] / 2);
        }
        free(lists[i]);
    }
    free(lists);
    free(ln);
    free(lc);
    free(all);
    csv_close(&c);
    return rc;
}

/* genai_pod_vram.csv: a service per pod (of the part asked for), its samples in file order. */
static int read_vram(const char *path, const struct genai_opts *o, struct trace *tr, struct idx *x,
                     char *err, size_t errlen)
{
    struct csv c;
    if (csv_open(&c, path, "timestamp_s,pod,vram_bytes", err, errlen) != 0)
        return -1;
    int r, rc = 0;
    char id[80];
    struct progress pg;
    struct succ q = {.prev = -1};
    struct tscache tc = {"", 0};
    progress_begin(&pg);
    while ((r = csv_next(&c, err, errlen)) == 1) {
        read_progress(&pg, &c);
        int64_t t, mib;
        if (c.nf != 3 || parse_time(&tc, c.fields[0], &t) != 0 ||
            csv_parse_ceil(c.fields[2], 1048576, &mib) != 0 || c.fields[1][0] == '\0' ||
            strlen(c.fields[1]) > 58) {
            rc = errf(err, errlen, "%s: line %zu: expected timestamp_s,pod,vram_bytes", path,
                      c.line);
            break;
        }
        /* pod ids are hex hashes; a service id must start with a letter */
        if (!in_part(o, c.fields[1]))
            continue;
        int32_t i = succ_find(&q, x, tr, c.fields[1], 58, true, id);
        if (i < 0 && !osub_id_valid(id)) { /* a service already there has a valid id */
            rc = errf(err, errlen, "%s: line %zu: pod '%s' cannot be a service id", path, c.line,
                      c.fields[1]);
            break;
        }
        struct trace_svc *s = i >= 0 ? &tr->svcs[i] : find_or_add(tr, x, id, true);
        if (s == NULL || succ_note(&q, (int32_t)(s - tr->svcs)) != 0 ||
            add_sample(s, t, mib, -1) != 0) {
            rc = errf(err, errlen, "out of memory");
            break;
        }
    }
    free(q.next);
    csv_close(&c);
    return r < 0 || rc != 0 ? -1 : 0;
}

/* The sample of s at time t, the last in file order (the samples are still in it): with the
 * samples in strictly increasing time, where the previous row of s matched (*cur) or a binary
 * search; otherwise a scan back from the end. NULL when none. */
static struct sample *util_match(struct trace_svc *s, bool sorted, size_t *cur, int64_t t)
{
    if (!sorted) {
        for (size_t j = s->n; j > 0; j--)
            if (s->samples[j - 1].t_s == t)
                return &s->samples[j - 1];
        return NULL;
    }
    size_t lo = 0, hi = s->n;
    if (*cur < s->n && s->samples[*cur].t_s == t) {
        lo = *cur;
    } else {
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (s->samples[mid].t_s < t)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == s->n || s->samples[lo].t_s != t)
            return NULL;
    }
    *cur = lo + 1;
    return &s->samples[lo];
}

/* genai_pod_gpu_util.csv (optional): each row sets the compute of the pod's sample at its
 * time. */
static int read_util(const char *path, struct trace *tr, struct idx *x, char *err, size_t errlen)
{
    FILE *probe = fopen(path, "rb");
    if (probe == NULL)
        return 0;
    fclose(probe);
    uint8_t *sorted = calloc(tr->n ? tr->n : 1, 1);
    size_t *cur = calloc(tr->n ? tr->n : 1, sizeof(*cur));
    if (sorted == NULL || cur == NULL) {
        free(sorted);
        free(cur);
        return errf(err, errlen, "out of memory");
    }
    for (size_t i = 0; i < tr->n; i++)
        sorted[i] = strictly_sorted(&tr->svcs[i]);
    struct csv c;
    int r = 0, rc = csv_open(&c, path, "timestamp_s,pod,gpu_util_pct", err, errlen);
    char id[80];
    struct progress pg;
    struct succ q = {.prev = -1};
    struct tscache tc = {"", 0};
    progress_begin(&pg);
    while (rc == 0 && (r = csv_next(&c, err, errlen)) == 1) {
        read_progress(&pg, &c);
        int64_t t, pct;
        if (c.nf != 3 || parse_time(&tc, c.fields[0], &t) != 0 ||
            csv_parse_ceil(c.fields[2], 1, &pct) != 0) {
            rc = errf(err, errlen, "%s: line %zu: expected timestamp_s,pod,gpu_util_pct", path,
                      c.line);
            break;
        }
        /* the id as snprintf cut it in id[80] */
        int32_t i = succ_find(&q, x, tr, c.fields[1], sizeof(id) - 5, false, id);
        if (i < 0)
            continue;
        if (succ_note(&q, i) != 0) {
            rc = errf(err, errlen, "out of memory");
            break;
        }
        struct sample *sm = util_match(&tr->svcs[i], sorted[i], &cur[i], t);
        if (sm != NULL)
            sm->compute_pct = (int16_t)(pct > 100 ? 100 : pct);
    }
    csv_close(&c); /* closed already when csv_open failed */
    free(q.next);
    free(sorted);
    free(cur);
    return r < 0 || rc != 0 ? -1 : 0;
}

/* The engine's spec of each pod with samples (pods using no memory are skipped with a
 * warning), dropping the others. */
static int make_specs(const char *dir, const struct genai_opts *o, struct trace *tr,
                      const int64_t *per, int64_t median, char *err, size_t errlen)
{
    size_t w = 0;
    for (size_t i = 0; i < tr->n; i++) {
        struct trace_svc *s = &tr->svcs[i];
        if (s->n == 0) { /* no sample inside the window */
            free(s->samples);
            continue;
        }
        if (s->peak_mib == 0) {
            fprintf(stderr, "warning: %s: pod %s never uses any memory: skipped\n", dir,
                    s->spec.id + 4);
            free(s->samples);
            continue;
        }
        uint64_t h = fnv1a64(s->spec.id + 4) % 100;
        const char *cls = h < (uint64_t)o->classes[0]                     ? "online"
                          : h < (uint64_t)(o->classes[0] + o->classes[1]) ? "batch"
                                                                          : "experiment";
        snprintf(s->spec.class_name, sizeof(s->spec.class_name), "%s", cls);
        s->spec.vram_mib = (s->peak_mib * (1000 + o->buffer_milli) + 999) / 1000;
        s->spec.gpus = 1;
        int64_t *v = malloc(s->n * sizeof(*v));
        if (v == NULL) {
            for (size_t j = i; j < tr->n; j++) /* the rest, not yet moved down */
                free(tr->svcs[j].samples);
            tr->n = w;
            return errf(err, errlen, "out of memory");
        }
        for (size_t j = 0; j < s->n; j++)
            v[j] = s->samples[j].vram_mib;
        size_t idx = (s->n * (size_t)o->floor_pct + 99) / 100;
        idx = idx > 0 ? idx - 1 : 0;
        int64_t fl = select_i64(v, s->n, idx < s->n ? idx : s->n - 1);
        free(v);
        if (fl < 1)
            fl = 1;
        if (strcmp(cls, "online") != 0 && fl < s->spec.vram_mib)
            s->spec.min_vram_mib = fl;
        s->spec.restart_cost_ms = per[i] > 0 ? per[i] : median;
        s->spec.resumable = strcmp(cls, "online") != 0;
        tr->svcs[w++] = *s;
    }
    tr->n = w;
    if (tr->n == 0)
        return errf(err, errlen, "%s: no pod with any memory in use", dir);
    return 0;
}

int trace_import_genai(const char *dir, const struct genai_opts *o, struct trace *tr, char *err,
                       size_t errlen)
{
    memset(tr, 0, sizeof(*tr));
    struct idx x = {0};
    char path[4096];
    int64_t median = 60000, *per = NULL;
    snprintf(path, sizeof(path), "%s/genai_pod_vram.csv", dir);
    if (read_vram(path, o, tr, &x, err, errlen) != 0)
        goto err;
    snprintf(path, sizeof(path), "%s/genai_pod_gpu_util.csv", dir);
    if (read_util(path, tr, &x, err, errlen) != 0)
        goto err;
    finish_trace(tr);
    if (o->window) {
        cut_window(tr, o);
        finish_trace(tr);
    }
    snprintf(path, sizeof(path), "%s/genai_pod_vram.csv", dir);
    size_t left = 0;
    for (size_t i = 0; i < tr->n; i++)
        left += tr->svcs[i].n > 0;
    if (left == 0) {
        errf(err, errlen, "%s: no pod left in the part or window asked for", path);
        goto err;
    }
    if (check_span(tr, path, err, errlen) != 0)
        goto err;
    snprintf(path, sizeof(path), "%s/genai_model_load_ms.csv", dir);
    if (load_ms_medians(path, tr, &x, &median, err, errlen, &per) != 0)
        goto err;
    idx_free(&x);
    int rc = make_specs(dir, o, tr, per, median, err, errlen);
    free(per);
    if (rc != 0)
        trace_free(tr);
    return rc;
err:
    free(per);
    idx_free(&x);
    trace_free(tr);
    return -1;
}

/* ---- services + usage files ------------------------------------------------------------ */

int trace_import_files(const char *services, const char *usage, struct trace *tr, char *err,
                       size_t errlen)
{
    memset(tr, 0, sizeof(*tr));
    struct idx x = {0};
    json_t *root;
    size_t sl = strlen(services);
    if ((sl > 5 && strcmp(services + sl - 5, ".yaml") == 0) ||
        (sl > 4 && strcmp(services + sl - 4, ".yml") == 0)) {
        root = osub_yaml_load_file(services, err, errlen);
    } else {
        json_error_t je;
        root = json_load_file(services, JSON_REJECT_DUPLICATES, &je);
        if (root == NULL)
            errf(err, errlen, "%s: line %d, column %d: %s", services, je.line, je.column, je.text);
    }
    if (root == NULL)
        return -1;
    json_t *list = json_is_array(root) ? root : json_object_get(root, "services");
    if (!json_is_array(list)) {
        json_decref(root);
        return errf(err, errlen, "%s: expected a list of services (or {\"services\": [...]})",
                    services);
    }
    size_t i;
    json_t *v;
    int rc = 0;
    json_array_foreach(list, i, v)
    {
        osub_spec_t sp;
        char e2[256];
        if (osub_spec_from_json(v, &sp, e2, sizeof(e2)) != 0) {
            rc = errf(err, errlen, "%s: service %zu: %s", services, i + 1, e2);
            break;
        }
        if (find_or_add(tr, &x, sp.id, false) != NULL) {
            rc =
                errf(err, errlen, "%s: service %zu: id '%s' appears twice", services, i + 1, sp.id);
            break;
        }
        struct trace_svc *s = find_or_add(tr, &x, sp.id, true);
        if (s == NULL) {
            rc = errf(err, errlen, "out of memory");
            break;
        }
        s->spec = sp;
    }
    json_decref(root);
    if (rc != 0)
        goto err;
    struct csv c;
    if (csv_open(&c, usage, "timestamp_s,service,vram_mib", err, errlen) != 0)
        goto err;
    int r;
    while ((r = csv_next(&c, err, errlen)) == 1) {
        int64_t t, mib, pct = -1;
        if ((c.nf != 3 && c.nf != 4) || csv_parse_int(c.fields[0], &t) != 0 ||
            csv_parse_ceil(c.fields[2], 1, &mib) != 0 ||
            (c.nf == 4 && (csv_parse_ceil(c.fields[3], 1, &pct) != 0 || pct > 100))) {
            rc = errf(err, errlen,
                      "%s: line %zu: expected timestamp_s,service,vram_mib[,compute_pct] with "
                      "non-negative numbers (compute_pct at most 100)",
                      usage, c.line);
            break;
        }
        struct trace_svc *s = find_or_add(tr, &x, c.fields[1], false);
        if (s == NULL) {
            rc = errf(err, errlen, "%s: line %zu: service '%s' is not in %s", usage, c.line,
                      c.fields[1], services);
            break;
        }
        if (add_sample(s, t, mib, (int32_t)pct) != 0) {
            rc = errf(err, errlen, "out of memory");
            break;
        }
    }
    csv_close(&c);
    if (r < 0 || rc != 0)
        goto err;
    finish_trace(tr);
    if (check_span(tr, usage, err, errlen) != 0)
        goto err;
    size_t w = 0;
    for (size_t k = 0; k < tr->n; k++) {
        if (tr->svcs[k].n == 0) {
            fprintf(stderr, "warning: %s: service %s has no usage samples: skipped\n", usage,
                    tr->svcs[k].spec.id);
            free(tr->svcs[k].samples);
            continue;
        }
        tr->svcs[w++] = tr->svcs[k];
    }
    tr->n = w;
    if (tr->n == 0) {
        errf(err, errlen, "%s: no service has usage samples", usage);
        goto err;
    }
    idx_free(&x);
    return 0;
err:
    idx_free(&x);
    trace_free(tr);
    return -1;
}
