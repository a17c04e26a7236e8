/* trace.c - importers for simulate/advise: the GenAI trace folder, services + usage files */
#include "trace.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

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

/* ---- CSV ---------------------------------------------------------------------------- */

struct csv {
    FILE *f;
    const char *path;
    size_t line;
    char buf[4096];
    char *fields[16];
    int nf;
};

/* Reads the next non-empty line into fields. Returns 1, 0 at the end, -1 on error. */
static int csv_next(struct csv *c, char *err, size_t errlen)
{
    for (;;) {
        if (fgets(c->buf, sizeof(c->buf), c->f) == NULL) {
            if (ferror(c->f))
                return errf(err, errlen, "%s: line %zu: %s", c->path, c->line + 1, strerror(errno));
            return 0;
        }
        c->line++;
        size_t n = strlen(c->buf);
        if (n == sizeof(c->buf) - 1 && c->buf[n - 1] != '\n')
            return errf(err, errlen, "%s: line %zu: line too long", c->path, c->line);
        bool had_nl = n > 0 && c->buf[n - 1] == '\n';
        while (n > 0 && (c->buf[n - 1] == '\n' || c->buf[n - 1] == '\r'))
            c->buf[--n] = '\0';
        if (!had_nl && !feof(c->f))
            return errf(err, errlen, "%s: line %zu: malformed line", c->path, c->line);
        if (n == 0)
            continue;
        c->nf = 0;
        char *p = c->buf;
        for (;;) {
            if (c->nf == 16)
                return errf(err, errlen, "%s: line %zu: too many fields", c->path, c->line);
            c->fields[c->nf++] = p;
            char *comma = strchr(p, ',');
            if (comma == NULL)
                break;
            *comma = '\0';
            p = comma + 1;
        }
        return 1;
    }
}

/* A non-negative decimal ("123", "12.5") rounded up to an integer after dividing by `div`. */
static int parse_ceil(const char *s, int64_t div, int64_t *out)
{
    const char *p = s;
    while (*p == ' ')
        p++;
    if (!isdigit((unsigned char)*p))
        return -1;
    int64_t ip = 0;
    while (isdigit((unsigned char)*p)) {
        if (ip > (INT64_C(1) << 55))
            return -1;
        ip = ip * 10 + (*p - '0');
        p++;
    }
    bool frac = false;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return -1;
        while (isdigit((unsigned char)*p)) {
            frac = frac || *p != '0';
            p++;
        }
    }
    while (*p == ' ')
        p++;
    if (*p != '\0')
        return -1;
    /* ceil((ip + frac?) / div): a fractional part only ever rounds up */
    int64_t q = ip / div, r = ip % div;
    *out = q + ((r > 0 || frac) ? 1 : 0);
    return 0;
}

static int parse_int(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || v < 0)
        return -1;
    *out = v;
    return 0;
}

static struct trace_svc *find_or_add(struct trace *tr, const char *id, bool add)
{
    /* traces hold at most thousands of services: a linear scan of recent ones first */
    for (size_t i = tr->n; i > 0; i--)
        if (strcmp(tr->svcs[i - 1].spec.id, id) == 0)
            return &tr->svcs[i - 1];
    if (!add)
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

static int open_csv(struct csv *c, const char *path, const char *header, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->path = path;
    c->f = fopen(path, "rb");
    if (c->f == NULL)
        return errf(err, errlen, "%s: %s", path, strerror(errno));
    int r = csv_next(c, err, errlen);
    if (r <= 0) {
        fclose(c->f);
        return r < 0 ? -1
                     : errf(err, errlen, "%s: empty file (expected the header '%s')", path, header);
    }
    /* rebuild the header to compare it */
    char got[512] = "";
    for (int i = 0; i < c->nf; i++) {
        strncat(got, c->fields[i], sizeof(got) - strlen(got) - 2);
        if (i + 1 < c->nf)
            strncat(got, ",", sizeof(got) - strlen(got) - 1);
    }
    if (strncmp(got, header, strlen(header)) != 0) {
        fclose(c->f);
        return errf(err, errlen, "%s: line 1: expected the header '%s', found '%s'", path, header,
                    got);
    }
    return 0;
}

/* ---- the GenAI folder ------------------------------------------------------------------ */

struct kv {
    char id[64];
    int64_t v;
};

static int load_ms_medians(const char *path, struct trace *tr, int64_t *trace_median, char *err,
                           size_t errlen, int64_t **per_svc)
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
    if (open_csv(&c, path, "timestamp_s,pod,load_ms", err, errlen) != 0)
        return -1;
    int64_t *all = NULL;
    size_t na = 0, capa = 0;
    int64_t **lists = calloc(tr->n ? tr->n : 1, sizeof(*lists));
    size_t *ln = calloc(tr->n ? tr->n : 1, sizeof(*ln)),
           *lc = calloc(tr->n ? tr->n : 1, sizeof(*lc));
    int r, rc = 0;
    while ((r = csv_next(&c, err, errlen)) == 1) {
        int64_t t, ms;
        if (c.nf != 3 || parse_int(c.fields[0], &t) != 0 || parse_ceil(c.fields[2], 1, &ms) != 0) {
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
        for (size_t i = 0; i < tr->n; i++) {
            if (strcmp(tr->svcs[i].spec.id, c.fields[1]) != 0 &&
                strncmp(tr->svcs[i].spec.id + 4, c.fields[1], 60) != 0)
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
            break;
        }
        if (rc)
            break;
    }
    if (r < 0)
        rc = -1;
    if (rc == 0 && na > 0) {
        qsort(all, na, sizeof(*all), cmp_i64);
        *trace_median = all[na / 2];
    }
    for (size_t i = 0; i < tr->n; i++) {
        if (ln[i] > 0) {
            qsort(lists[i], ln[i], sizeof(int64_t), cmp_i64);
            (*per_svc)[i] = lists[i][ln[i] / 2];
        }
        free(lists[i]);
    }
    free(lists);
    free(ln);
    free(lc);
    free(all);
    fclose(c.f);
    return rc;
}

int trace_import_genai(const char *dir, const struct genai_opts *o, struct trace *tr, char *err,
                       size_t errlen)
{
    memset(tr, 0, sizeof(*tr));
    char path[4096];
    snprintf(path, sizeof(path), "%s/genai_pod_vram.csv", dir);
    struct csv c;
    if (open_csv(&c, path, "timestamp_s,pod,vram_bytes", err, errlen) != 0)
        return -1;
    int r, rc = 0;
    char id[80];
    while ((r = csv_next(&c, err, errlen)) == 1) {
        int64_t t, mib;
        if (c.nf != 3 || parse_int(c.fields[0], &t) != 0 ||
            parse_ceil(c.fields[2], 1048576, &mib) != 0 || c.fields[1][0] == '\0' ||
            strlen(c.fields[1]) > 58) {
            rc = errf(err, errlen, "%s: line %zu: expected timestamp_s,pod,vram_bytes", path,
                      c.line);
            break;
        }
        /* pod ids are hex hashes; a service id must start with a letter */
        if (!in_part(o, c.fields[1]))
            continue;
        snprintf(id, sizeof(id), "pod-%s", c.fields[1]);
        for (char *p = id; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        if (!osub_id_valid(id)) {
            rc = errf(err, errlen, "%s: line %zu: pod '%s' cannot be a service id", path, c.line,
                      c.fields[1]);
            break;
        }
        struct trace_svc *s = find_or_add(tr, id, true);
        if (s == NULL || add_sample(s, t, mib, -1) != 0) {
            rc = errf(err, errlen, "out of memory");
            break;
        }
    }
    fclose(c.f);
    if (r < 0 || rc != 0)
        goto err;

    /* compute (optional) */
    snprintf(path, sizeof(path), "%s/genai_pod_gpu_util.csv", dir);
    FILE *probe = fopen(path, "rb");
    if (probe != NULL) {
        fclose(probe);
        if (open_csv(&c, path, "timestamp_s,pod,gpu_util_pct", err, errlen) != 0)
            goto err;
        while ((r = csv_next(&c, err, errlen)) == 1) {
            int64_t t, pct;
            if (c.nf != 3 || parse_int(c.fields[0], &t) != 0 ||
                parse_ceil(c.fields[2], 1, &pct) != 0) {
                rc = errf(err, errlen, "%s: line %zu: expected timestamp_s,pod,gpu_util_pct", path,
                          c.line);
                break;
            }
            snprintf(id, sizeof(id), "pod-%s", c.fields[1]);
            struct trace_svc *s = find_or_add(tr, id, false);
            if (s == NULL)
                continue;
            /* match the sample at that time (samples are still in file order) */
            for (size_t j = s->n; j > 0; j--)
                if (s->samples[j - 1].t_s == t) {
                    s->samples[j - 1].compute_pct = (int16_t)(pct > 100 ? 100 : pct);
                    break;
                }
        }
        fclose(c.f);
        if (r < 0 || rc != 0)
            goto err;
    }
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

    /* load times */
    snprintf(path, sizeof(path), "%s/genai_model_load_ms.csv", dir);
    int64_t median = 60000, *per = NULL;
    if (load_ms_medians(path, tr, &median, err, errlen, &per) != 0) {
        free(per);
        goto err;
    }

    /* specs */
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
            free(per);
            rc = errf(err, errlen, "out of memory");
            goto err;
        }
        for (size_t j = 0; j < s->n; j++)
            v[j] = s->samples[j].vram_mib;
        qsort(v, s->n, sizeof(*v), cmp_i64);
        size_t idx = (s->n * (size_t)o->floor_pct + 99) / 100;
        idx = idx > 0 ? idx - 1 : 0;
        int64_t fl = v[idx < s->n ? idx : s->n - 1];
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
    free(per);
    if (tr->n == 0) {
        errf(err, errlen, "%s: no pod with any memory in use", dir);
        goto err;
    }
    return 0;
err:
    trace_free(tr);
    return -1;
}

/* ---- services + usage files ------------------------------------------------------------ */

int trace_import_files(const char *services, const char *usage, struct trace *tr, char *err,
                       size_t errlen)
{
    memset(tr, 0, sizeof(*tr));
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
        if (find_or_add(tr, sp.id, false) != NULL) {
            rc =
                errf(err, errlen, "%s: service %zu: id '%s' appears twice", services, i + 1, sp.id);
            break;
        }
        struct trace_svc *s = find_or_add(tr, sp.id, true);
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
    if (open_csv(&c, usage, "timestamp_s,service,vram_mib", err, errlen) != 0)
        goto err;
    int r;
    while ((r = csv_next(&c, err, errlen)) == 1) {
        int64_t t, mib, pct = -1;
        if ((c.nf != 3 && c.nf != 4) || parse_int(c.fields[0], &t) != 0 ||
            parse_ceil(c.fields[2], 1, &mib) != 0 ||
            (c.nf == 4 && (parse_ceil(c.fields[3], 1, &pct) != 0 || pct > 100))) {
            rc = errf(err, errlen,
                      "%s: line %zu: expected timestamp_s,service,vram_mib[,compute_pct] with "
                      "non-negative numbers (compute_pct at most 100)",
                      usage, c.line);
            break;
        }
        struct trace_svc *s = find_or_add(tr, c.fields[1], false);
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
    fclose(c.f);
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
    return 0;
err:
    trace_free(tr);
    return -1;
}
