/* gentrace.c - seeded generator of synthetic GenAI GPU-memory traces (docs/gentrace.md) */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#define PROG "oversub-gentrace"

enum { EXIT_OK = 0, EXIT_IO = 1, EXIT_USAGE = 2 };

#if defined(__GNUC__)
#define GT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define GT_PRINTF(f, a)
#endif

/* Limits on the arguments: a trace beyond them is a typo, not a workload. */
#define MAX_PODS 20000
#define MAX_HOURS 2208 /* 92 days: a quarter */
#define MAX_STEP_S 3600
#define MAX_ROWS 500000000 /* pods x samples: about 18 GB of genai_pod_vram.csv */

/* The first sample is at 2024-01-01T00:00:00Z, so a diurnal phase reads as a UTC hour. */
#define T0_S INT64_C(1704067200)
#define DAY_S 86400.0
#define GIB 1073741824.0
#define CLIP_GIB 78.0 /* every pod but a leaking one stays below this */
#define FLOOR_GIB 0.5 /* the CUDA context and runtime of a loaded pod */

static const double PI = 3.14159265358979323846;
static const double LN2 = 0.69314718055994530942;
/* ln 2 split so that k * LN2_HI is exact for |k| < 2^20 (fdlibm's constants) */
static const double LN2_HI = 6.93147180369123816490e-01;
static const double LN2_LO = 1.90821492927058770002e-10;
static const double INV_LN2 = 1.44269504088896338700e+00;
static const double SQRT_HALF = 0.70710678118654752440;

/* ---- deterministic arithmetic -------------------------------------------------------------
 * libm's exp, log and sin may differ in the last bit between libraries, which can flip a
 * rounded byte count. These use only +, -, *, /, floor, sqrt, frexp and ldexp, which IEEE 754
 * makes exact or correctly rounded, so a seed gives the same bytes everywhere (the target is
 * built with -ffp-contract=off so no fused multiply-add changes a rounding). */

static double det_exp(double x)
{
    if (x < -700.0)
        return 0.0;
    if (x > 700.0)
        x = 700.0;
    double k = floor(x * INV_LN2 + 0.5);
    double r = (x - k * LN2_HI) - k * LN2_LO; /* |r| <= 0.35 */
    double term = 1.0, sum = 1.0;
    for (int i = 1; i <= 18; i++) {
        term *= r / (double)i;
        sum += term;
    }
    return ldexp(sum, (int)k);
}

/* x > 0 */
static double det_log(double x)
{
    int e;
    double m = frexp(x, &e); /* x = m * 2^e, m in [0.5, 1) */
    if (m < SQRT_HALF) {
        m *= 2.0;
        e--;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s; /* |s| <= 0.172 */
    double term = s, sum = 0.0;
    for (int k = 1; k < 40; k += 2) {
        sum += term / (double)k;
        term *= s2;
    }
    return 2.0 * sum + (double)e * LN2;
}

static double det_sin(double x)
{
    double r = x - 2.0 * PI * floor(x / (2.0 * PI) + 0.5); /* [-pi, pi] */
    double term = r, sum = r, r2 = r * r;
    for (int k = 1; k <= 15; k++) {
        term *= -r2 / (double)((2 * k) * (2 * k + 1));
        sum += term;
    }
    return sum;
}

/* ---- the generator: splitmix64 seeds xoshiro256** ----------------------------------------- */

struct rng {
    uint64_t s[4];
};

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t splitmix64(uint64_t *x)
{
    *x += 0x9e3779b97f4a7c15ULL;
    return mix64(*x);
}

/* Stream 0 draws what concerns the whole trace; stream 1 + i belongs to pod i, so a pod's
 * samples do not depend on the other pods. */
static void rng_seed(struct rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = mix64(seed ^ 0x6f76657273756221ULL) ^ mix64(stream * 0x9e3779b97f4a7c15ULL + 1);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* [0, 1) */
static double rng_unit(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* [lo, hi) */
static double rng_range(struct rng *r, double lo, double hi)
{
    return lo + (hi - lo) * rng_unit(r);
}

/* log-uniform in [lo, hi), lo > 0 */
static double rng_logrange(struct rng *r, double lo, double hi)
{
    return lo * det_exp(rng_unit(r) * det_log(hi / lo));
}

/* 0 .. n-1, n >= 1 */
static size_t rng_below(struct rng *r, size_t n)
{
    size_t k = (size_t)(rng_unit(r) * (double)n);
    return k < n ? k : n - 1;
}

/* standard normal, Marsaglia's polar method */
static double rng_normal(struct rng *r)
{
    double u, v, s;
    do {
        u = 2.0 * rng_unit(r) - 1.0;
        v = 2.0 * rng_unit(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    return u * sqrt(-2.0 * det_log(s) / s);
}

/* Pareto with minimum 1 and tail index alpha: P(X > x) = x^-alpha */
static double rng_pareto(struct rng *r, double alpha)
{
    double u = 1.0 - rng_unit(r); /* (0, 1] */
    return det_exp(-det_log(u) / alpha);
}

static double clampd(double x, double lo, double hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* ---- pod models ------------------------------------------------------------------------- */

enum kind { K_DIURNAL, K_BURSTY, K_HEAVYTAIL, K_STEP, K_GROW, K_MIX, K_COUNT };
static const char *const kind_names[K_COUNT] = {"diurnal", "bursty", "heavytail",
                                                "step",    "grow",   "mix"};

/* what one pod does; K_GROW's leaking pods are MODEL_LEAK, the rest MODEL_BURSTY */
enum model { MODEL_DIURNAL, MODEL_BURSTY, MODEL_HEAVYTAIL, MODEL_STEP, MODEL_LEAK };

#define DIURNAL_GROUPS 4

struct pod {
    char id[13]; /* 12 lowercase hex digits */
    enum model model;
    struct rng rng;
    size_t first, last; /* alive from sample first to sample last, inclusive */
    double base_gib;    /* resting level (diurnal: the cycle's mean; step: the current level) */
    double noise;       /* relative standard deviation of the per-sample noise */
    /* diurnal */
    double amp, phase;
    /* bursty (burst) and step (swap): probability of an event at a sample */
    double event_p;
    double level_gib; /* bursty: the held base level */
    double burst_gib;
    size_t burst_left;
    /* heavytail */
    double body_sigma, tail_p, tail_alpha;
    /* leak */
    double peak_gib;
    size_t full; /* the sample at which it reaches peak_gib */
    /* utilisation and load times */
    double util_scale;
    bool has_load;
    double load_median_ms, load_p;
};

struct sample {
    double gib;       /* memory in use */
    double quiet_gib; /* what the pod would use idle: its excess over this drives utilisation */
    bool swapped;     /* a model was (re)loaded at this sample */
};

/* Draws a pod's parameters. step_s: the sample interval. */
static void pod_init(struct pod *p, enum model m, double step_s, const double *group_phase)
{
    struct rng *r = &p->rng;
    p->model = m;
    switch (m) {
    case MODEL_DIURNAL:
        p->base_gib = rng_range(r, 16.0, 30.0);
        p->amp = rng_range(r, 0.2, 0.6);
        p->phase = group_phase[rng_below(r, DIURNAL_GROUPS)] + 0.25 * rng_normal(r);
        p->noise = 0.03;
        break;
    case MODEL_BURSTY:
        p->base_gib = rng_range(r, 18.0, 28.0);
        p->level_gib = p->base_gib;
        p->event_p = rng_range(r, 1.0, 6.0) * step_s / DAY_S;
        p->noise = 0.02;
        break;
    case MODEL_LEAK: {
        p->base_gib = rng_range(r, 18.0, 28.0);
        p->peak_gib = rng_range(r, 82.0, 90.0);
        /* reaches its peak at 50-85% of its life (which is 2 samples at least), then stays */
        double f = rng_range(r, 0.5, 0.85);
        size_t span = (size_t)((double)(p->last - p->first) * f + 0.5);
        p->full = p->first + (span > 0 ? span : 1);
        p->noise = 0.01;
        break;
    }
    case MODEL_HEAVYTAIL:
        p->base_gib = rng_range(r, 12.0, 24.0);
        p->body_sigma = rng_range(r, 0.03, 0.10);
        p->tail_p = rng_range(r, 0.002, 0.015);
        p->tail_alpha = rng_range(r, 1.8, 3.5);
        break;
    case MODEL_STEP:
        p->base_gib = rng_logrange(r, 8.0, 40.0);
        p->event_p = rng_range(r, 0.5, 3.0) * step_s / DAY_S;
        p->noise = 0.015;
        break;
    }
    p->util_scale = rng_range(r, 0.5, 1.0);
    p->has_load = rng_unit(r) >= 0.1;
    p->load_median_ms = rng_logrange(r, 2000.0, 40000.0);
    p->load_p = clampd(rng_range(r, 0.25, 3.0) * step_s / 3600.0, 0.0, 1.0);
}

/* The pod's memory at sample i (time t_s since the trace began). */
static void pod_sample(struct pod *p, size_t i, double t_s, double step_s, struct sample *out)
{
    struct rng *r = &p->rng;
    double v = 0.0, quiet = p->base_gib;
    out->swapped = false;
    switch (p->model) {
    case MODEL_DIURNAL: {
        double day = t_s / DAY_S;
        double c = det_sin(2.0 * PI * (day - floor(day)) - p->phase);
        v = p->base_gib * (1.0 + p->amp * c + p->noise * rng_normal(r));
        quiet = p->base_gib * (1.0 - p->amp);
        break;
    }
    case MODEL_BURSTY:
        if (p->burst_left == 0 && rng_unit(r) < p->event_p) {
            size_t n = (size_t)(rng_range(r, 60.0, 1800.0) / step_s + 0.5);
            p->burst_left = n > 0 ? n : 1;
            p->burst_gib = p->base_gib * rng_range(r, 0.4, 1.0);
        }
        /* the base holds its level, now and then dipping (fewer images in flight) */
        if (rng_unit(r) < 0.3) {
            double u = rng_unit(r);
            p->level_gib = p->base_gib * (1.0 - 0.4 * u * u * u);
        }
        v = p->level_gib * (1.0 + p->noise * rng_normal(r));
        if (p->burst_left > 0) {
            v += p->burst_gib;
            p->burst_left--;
        }
        break;
    case MODEL_HEAVYTAIL:
        if (rng_unit(r) < p->tail_p)
            v = p->base_gib * rng_pareto(r, p->tail_alpha);
        else
            v = p->base_gib * det_exp(p->body_sigma * rng_normal(r));
        break;
    case MODEL_STEP:
        if (i > p->first && rng_unit(r) < p->event_p) {
            double f = det_exp(rng_range(r, 0.22314355131420976, LN2)); /* x1.25 .. x2 */
            p->base_gib = clampd(rng_unit(r) < 0.5 ? p->base_gib * f : p->base_gib / f, 4.0, 70.0);
            out->swapped = true;
        }
        v = p->base_gib * (1.0 + p->noise * rng_normal(r));
        quiet = p->base_gib;
        break;
    case MODEL_LEAK: {
        double f = i >= p->full ? 1.0 : (double)(i - p->first) / (double)(p->full - p->first);
        quiet = p->base_gib + (p->peak_gib - p->base_gib) * f;
        v = quiet * (1.0 + p->noise * rng_unit(r)); /* jitter only adds: the peak is reached */
        break;
    }
    }
    if (p->model != MODEL_LEAK)
        v = clampd(v, FLOOR_GIB, CLIP_GIB);
    out->gib = v;
    out->quiet_gib = quiet;
}

/* Utilisation in tenths of a percent: busy more often, and harder, the further the pod is
 * above its quiet level; idle (0) otherwise, as most samples of the real trace are. */
static int64_t pod_util_tenths(struct pod *p, const struct sample *s)
{
    struct rng *r = &p->rng;
    double a = clampd((s->gib - s->quiet_gib) / (s->quiet_gib > 1.0 ? s->quiet_gib : 1.0), 0, 1);
    if (rng_unit(r) >= 0.15 + 0.6 * a)
        return 0;
    double pct = p->util_scale * (15.0 + 85.0 * a) * rng_range(r, 0.4, 1.0);
    return llround(clampd(pct, 0.1, 100.0) * 10.0);
}

/* A model load at this sample (a cold start, a swap or a reload): its duration in ms, or -1. */
static int64_t pod_load_ms(struct pod *p, size_t i, const struct sample *s)
{
    struct rng *r = &p->rng;
    bool ev = (i == p->first && p->first > 0) || s->swapped;
    ev = (rng_unit(r) < p->load_p) || ev;
    if (!ev || !p->has_load)
        return -1;
    double ms = p->load_median_ms * det_exp(0.5 * rng_normal(r));
    return llround(clampd(ms, 500.0, 120000.0));
}

/* ---- arguments ------------------------------------------------------------------------- */

struct opts {
    const char *out;
    enum kind kind;
    uint64_t pods, hours, step_s, seed;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --out DIR --kind KIND [--pods N] [--hours H | --days D] [--step S]\n"
            "       [--seed N]\n"
            "Writes a synthetic GPU-memory trace laid out like shared/traces (genai_pod_vram.csv,\n"
            "genai_pod_gpu_util.csv, genai_model_load_ms.csv) into DIR, for\n"
            "'oversub simulate --genai DIR'. The same arguments give the same bytes anywhere.\n"
            "  --out DIR     the folder to write (created if missing; its parent must exist)\n"
            "  --kind KIND   diurnal   a daily sine cycle per pod, pods in groups that peak "
            "together\n"
            "                bursty    a flat base with rare short bursts (like the real trace)\n"
            "                heavytail per-sample demand with a Pareto tail, clipped to 78 GiB\n"
            "                step      levels that step up or down at random times (model swaps)\n"
            "                grow      bursty, but about 10%% of pods leak past 80 GiB\n"
            "                mix       pods drawn from all of the above\n"
            "  --pods N      pods, 1..%d (60)\n"
            "  --hours H     length in whole hours, 1..%d (24)\n"
            "  --days D      or in whole days, 1..%d (--days 30 is --hours 720)\n"
            "  --step S      seconds between samples, 1..%d (57)\n"
            "  --seed N      0..2^64-1 (1)\n"
            "About a quarter of the pods start late or end early. Exit status: 0 written,\n"
            "1 a file could not be written, 2 bad arguments. See docs/gentrace.md.\n",
            MAX_PODS, MAX_HOURS, MAX_HOURS / 24, MAX_STEP_S);
}

/* A decimal integer in [lo, hi]: digits only, no sign, no spaces. */
static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (*s == '\0')
        return -1;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

GT_PRINTF(1, 2)
static int bad(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '" PROG " --help'.\n");
    va_end(ap);
    return -1;
}

/* Returns 0 to run, 1 after --help, -1 after a usage error (already reported). */
static int parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){NULL, K_COUNT, 60, 24, 57, 1};
    static const char *const names[] = {"--out",  "--kind", "--pods", "--hours",
                                        "--step", "--seed", "--days"};
    enum { N_NAMES = sizeof(names) / sizeof(names[0]) };
    bool seen[N_NAMES] = {false};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 1;
        }
        int which = -1;
        const char *val = NULL;
        for (int k = 0; k < N_NAMES; k++) {
            size_t n = strlen(names[k]);
            if (strncmp(arg, names[k], n) == 0 && (arg[n] == '\0' || arg[n] == '=')) {
                which = k;
                val = arg[n] == '=' ? arg + n + 1 : NULL;
                break;
            }
        }
        if (which < 0)
            return bad(arg[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'", arg);
        if (seen[which])
            return bad("%s given twice", names[which]);
        if ((which == 3 && seen[6]) || (which == 6 && seen[3]))
            return bad("give --hours or --days, not both");
        seen[which] = true;
        if (val == NULL) {
            if (i + 1 >= argc)
                return bad("%s needs a value", names[which]);
            val = argv[++i];
        }
        switch (which) {
        case 0:
            if (*val == '\0')
                return bad("--out needs a folder");
            o->out = val;
            break;
        case 1:
            for (int k = 0; k < K_COUNT; k++)
                if (strcmp(val, kind_names[k]) == 0)
                    o->kind = (enum kind)k;
            if (o->kind == K_COUNT)
                return bad("unknown kind '%s' (diurnal, bursty, heavytail, step, grow or mix)",
                           val);
            break;
        case 2:
            if (parse_u64(val, 1, MAX_PODS, &o->pods) != 0)
                return bad("--pods must be a whole number from 1 to %d, not '%s'", MAX_PODS, val);
            break;
        case 3:
            if (parse_u64(val, 1, MAX_HOURS, &o->hours) != 0)
                return bad("--hours must be a whole number from 1 to %d, not '%s'", MAX_HOURS, val);
            break;
        case 4:
            if (parse_u64(val, 1, MAX_STEP_S, &o->step_s) != 0)
                return bad("--step must be a whole number of seconds from 1 to %d, not '%s'",
                           MAX_STEP_S, val);
            break;
        case 5:
            if (parse_u64(val, 0, UINT64_MAX, &o->seed) != 0)
                return bad("--seed must be a whole number from 0 to 2^64-1, not '%s'", val);
            break;
        default:
            if (parse_u64(val, 1, MAX_HOURS / 24, &o->hours) != 0)
                return bad("--days must be a whole number from 1 to %d, not '%s'", MAX_HOURS / 24,
                           val);
            o->hours *= 24;
            break;
        }
    }
    if (o->out == NULL)
        return bad("--out DIR is required");
    if (o->kind == K_COUNT)
        return bad("--kind is required (diurnal, bursty, heavytail, step, grow or mix)");
    uint64_t samples = o->pods * (o->hours * 3600 / o->step_s + 1);
    if (samples > MAX_ROWS)
        return bad("--pods x samples per pod is %llu, more than %d: give fewer pods, fewer hours "
                   "or a longer --step",
                   (unsigned long long)samples, MAX_ROWS);
    return 0;
}

/* ---- output ---------------------------------------------------------------------------- */

/* Creates dir unless it is already a folder; its parent must exist. */
static int make_dir(const char *dir)
{
    if (mkdir(dir, 0777) == 0)
        return 0;
    int e = errno;
    struct stat st;
    if (e == EEXIST) {
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
            return 0;
        fprintf(stderr, PROG ": %s exists and is not a folder\n", dir);
        return -1;
    }
    fprintf(stderr, PROG ": cannot create the folder %s: %s%s\n", dir, strerror(e),
            e == ENOENT ? " (its parent must exist)" : "");
    return -1;
}

/* One output file, written through a buffer of our own: the rows are formatted here rather
 * than by fprintf, which took 84% of the generator's instructions. */
struct out {
    FILE *f;
    size_t len;
    char buf[1 << 16];
    char path[4096];
};

static void out_flush(struct out *o)
{
    if (o->len > 0 && fwrite(o->buf, 1, o->len, o->f) != o->len && !ferror(o->f))
        errno = EIO;
    o->len = 0;
}

/* Writes v in decimal at p; returns the end. */
static char *put_i64(char *p, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    if (v < 0)
        *p++ = '-';
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* One row: "t,pod,whole" then ".tenth" when tenth >= 0, then a newline. */
static void out_row(struct out *o, int64_t t, const char *pod, int64_t whole, int64_t tenth)
{
    if (o->len > sizeof(o->buf) - 96)
        out_flush(o);
    char *p = o->buf + o->len;
    p = put_i64(p, t);
    *p++ = ',';
    for (const char *c = pod; *c; c++)
        *p++ = *c;
    *p++ = ',';
    p = put_i64(p, whole);
    if (tenth >= 0) {
        *p++ = '.';
        p = put_i64(p, tenth);
    }
    *p++ = '\n';
    o->len = (size_t)(p - o->buf);
}

static int out_open(struct out *o, const char *dir, const char *name, const char *header)
{
    int n = snprintf(o->path, sizeof(o->path), "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof(o->path)) {
        fprintf(stderr, PROG ": %s: the path is too long\n", dir);
        return -1;
    }
    o->f = fopen(o->path, "w");
    if (o->f == NULL) {
        fprintf(stderr, PROG ": %s: %s\n", o->path, strerror(errno));
        return -1;
    }
    fprintf(o->f, "%s\n", header);
    return 0;
}

/* Closes o (NULL f is fine); -1 after reporting a failed write. */
static int out_close(struct out *o)
{
    if (o->f == NULL)
        return 0;
    out_flush(o);
    int bad_write = ferror(o->f);
    int e = errno;
    if (fclose(o->f) != 0 && !bad_write) {
        bad_write = 1;
        e = errno;
    }
    o->f = NULL;
    if (bad_write) {
        if (e == 0)
            e = EIO;
        fprintf(stderr, PROG ": %s: %s\n", o->path, strerror(e));
        return -1;
    }
    return 0;
}

/* ---- the trace ------------------------------------------------------------------------- */

/* 12 hex digits from the seed and the pod's index, unique within the trace (ids[] holds the
 * 48-bit values, compared in place of the strings they print as). */
static int make_ids(struct pod *pods, size_t n, uint64_t seed)
{
    uint64_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    if (ids == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        for (uint64_t attempt = 0;; attempt++) {
            uint64_t h =
                mix64(mix64(seed ^ 0x706f642d6964ULL) + (uint64_t)i * 0x9e3779b97f4a7c15ULL +
                      attempt * 0xd1b54a32d192ed03ULL);
            ids[i] = h & 0xffffffffffffULL;
            size_t j = 0;
            while (j < i && ids[j] != ids[i])
                j++;
            if (j == i)
                break;
        }
        snprintf(pods[i].id, sizeof(pods[i].id), "%012llx", (unsigned long long)ids[i]);
    }
    free(ids);
    return 0;
}

/* Marks the first k of a seeded permutation of 0..n-1 in flags. */
static void pick(struct rng *r, size_t n, size_t k, size_t *perm, bool *flags)
{
    for (size_t i = 0; i < n; i++) {
        perm[i] = i;
        flags[i] = false;
    }
    for (size_t i = n; i > 1; i--) {
        size_t j = rng_below(r, i), t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < k && i < n; i++)
        flags[perm[i]] = true;
}

/* A partial pod starts late (40%), ends early (40%) or both (20%), and lives at least 5% of
 * the trace (2 samples at least). */
static void pod_life(struct pod *p, bool partial, size_t steps)
{
    struct rng *r = &p->rng;
    double s = (double)steps;
    p->first = 0;
    p->last = steps - 1;
    if (!partial)
        return;
    size_t min_len = steps / 20 > 2 ? steps / 20 : 2;
    double u = rng_unit(r);
    if (u < 0.4) {
        p->first = (size_t)(s * rng_range(r, 0.05, 0.6));
    } else if (u < 0.8) {
        p->last = (size_t)(s * rng_range(r, 0.4, 0.95));
    } else {
        p->first = (size_t)(s * rng_range(r, 0.05, 0.4));
        p->last = p->first + (size_t)(s * rng_range(r, 0.2, 0.55));
    }
    if (p->last > steps - 1)
        p->last = steps - 1;
    if (p->last + 1 < p->first + min_len) {
        if (p->first + min_len <= steps) {
            p->last = p->first + min_len - 1;
        } else {
            p->last = steps - 1;
            p->first = steps - min_len;
        }
    }
}

/* mix: diurnal 30%, bursty 30%, heavytail 15%, step 20%, leak 5% */
static enum model mix_model(struct rng *r)
{
    double u = rng_unit(r);
    return u < 0.30   ? MODEL_DIURNAL
           : u < 0.60 ? MODEL_BURSTY
           : u < 0.75 ? MODEL_HEAVYTAIL
           : u < 0.95 ? MODEL_STEP
                      : MODEL_LEAK;
}

struct totals {
    size_t partial, leaking, vram_rows, util_rows, load_rows;
    int64_t peak_bytes;
};

static int generate(const struct opts *o, struct pod *pods, struct totals *tot)
{
    size_t n = (size_t)o->pods, steps = (size_t)(o->hours * 3600 / o->step_s + 1);
    double step_s = (double)o->step_s;
    size_t *perm = malloc(n * sizeof(*perm));
    bool *partial = malloc(n * sizeof(*partial)), *leak = malloc(n * sizeof(*leak));
    if (perm == NULL || partial == NULL || leak == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        free(perm);
        free(partial);
        free(leak);
        return -1;
    }
    struct rng g;
    rng_seed(&g, o->seed, 0);
    double group_phase[DIURNAL_GROUPS];
    for (int k = 0; k < DIURNAL_GROUPS; k++)
        group_phase[k] = rng_range(&g, 0.0, 2.0 * PI);
    pick(&g, n, (n + 2) / 4, perm, partial);
    size_t n_leak = (n + 5) / 10 > 0 ? (n + 5) / 10 : 1; /* a tenth, rounded, at least one */
    pick(&g, n, o->kind == K_GROW ? n_leak : 0, perm, leak);

    if (make_ids(pods, n, o->seed) != 0) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    memset(tot, 0, sizeof(*tot));
    for (size_t i = 0; i < n; i++) {
        struct pod *p = &pods[i];
        rng_seed(&p->rng, o->seed, 1 + (uint64_t)i);
        pod_life(p, partial[i], steps);
        enum model m;
        switch (o->kind) {
        case K_DIURNAL:
            m = MODEL_DIURNAL;
            break;
        case K_BURSTY:
            m = MODEL_BURSTY;
            break;
        case K_HEAVYTAIL:
            m = MODEL_HEAVYTAIL;
            break;
        case K_STEP:
            m = MODEL_STEP;
            break;
        case K_GROW:
            m = leak[i] ? MODEL_LEAK : MODEL_BURSTY;
            break;
        default:
            m = mix_model(&p->rng);
            break;
        }
        pod_init(p, m, step_s, group_phase);
        tot->partial += p->first > 0 || p->last < steps - 1;
        tot->leaking += m == MODEL_LEAK;
    }
    free(perm);
    free(partial);
    free(leak);

    struct out *outs = calloc(3, sizeof(*outs));
    if (outs == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    struct out *vram = &outs[0], *util = &outs[1], *load = &outs[2];
    int rc = -1;
    if (out_open(vram, o->out, "genai_pod_vram.csv", "timestamp_s,pod,vram_bytes") != 0 ||
        out_open(util, o->out, "genai_pod_gpu_util.csv", "timestamp_s,pod,gpu_util_pct") != 0 ||
        out_open(load, o->out, "genai_model_load_ms.csv", "timestamp_s,pod,load_ms") != 0)
        goto err_close;
    for (size_t i = 0; i < steps; i++) {
        int64_t t = T0_S + (int64_t)i * (int64_t)o->step_s;
        for (size_t k = 0; k < n; k++) {
            struct pod *p = &pods[k];
            if (i < p->first || i > p->last)
                continue;
            struct sample s;
            pod_sample(p, i, (double)i * step_s, step_s, &s);
            int64_t bytes = llround(s.gib * GIB);
            int64_t u = pod_util_tenths(p, &s);
            int64_t ms = pod_load_ms(p, i, &s);
            out_row(vram, t, p->id, bytes, -1);
            out_row(util, t, p->id, u / 10, u % 10);
            tot->vram_rows++;
            tot->util_rows++;
            if (ms >= 0) {
                out_row(load, t, p->id, ms, -1);
                tot->load_rows++;
            }
            if (bytes > tot->peak_bytes)
                tot->peak_bytes = bytes;
        }
    }
    rc = 0;
err_close:
    for (int k = 0; k < 3; k++)
        if (out_close(&outs[k]) != 0)
            rc = -1;
    free(outs);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc > 0 ? EXIT_OK : EXIT_USAGE;
    if (make_dir(o.out) != 0)
        return EXIT_IO;
    struct pod *pods = calloc((size_t)o.pods, sizeof(*pods));
    if (pods == NULL) {
        fprintf(stderr, PROG ": out of memory\n");
        return EXIT_IO;
    }
    struct totals tot;
    rc = generate(&o, pods, &tot);
    free(pods);
    if (rc != 0)
        return EXIT_IO;
    fprintf(stderr,
            PROG ": %s: %s, seed %llu: %llu pods (%zu start late or end early, %zu leak past 80 "
                 "GiB) over %llu h in %llu s steps: %zu memory and %zu utilisation samples, %zu "
                 "load times; largest sample %.1f GiB\n",
            o.out, kind_names[o.kind], (unsigned long long)o.seed, (unsigned long long)o.pods,
            tot.partial, tot.leaking, (unsigned long long)o.hours, (unsigned long long)o.step_s,
            tot.vram_rows, tot.util_rows, tot.load_rows, (double)tot.peak_bytes / GIB);
    return EXIT_OK;
}
