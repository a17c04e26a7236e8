/* main.c - the oversub command-line client: simulate and advise (offline, over traces) */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "advise.h"
#include "advise_daemon.h"
#include "daemon_cmds.h"
#include "demo.h"
#include "oversub/units.h"
#include "report.h"
#include "sim.h"
#include "trace.h"

#ifndef OSUB_VERSION
#define OSUB_VERSION "0.1.0"
#endif

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

/* The commands that work without a daemon, after the daemon's in oversub --help. */
static const struct {
    const char *name, *summary;
} offline_cmds[] = {
    {"simulate", "replay a usage trace through the engine and compare policies"},
    {"advise", "recommend an oversell ratio, with the evidence"},
};

static void usage_main(FILE *f)
{
    fprintf(f, "usage: oversub [--url URL] [--json] <command> [options]\n"
               "\n"
               "Commands that talk to oversubd:\n");
    cli_daemon_list(f);
    fprintf(f, "\nCommands that work offline, on a usage trace:\n");
    for (size_t i = 0; i < sizeof(offline_cmds) / sizeof(offline_cmds[0]); i++)
        fprintf(f, "  %-10s %s\n", offline_cmds[i].name, offline_cmds[i].summary);
    fprintf(f,
            "\nOther commands:\n"
            "  %-10s %s\n"
            "  %-10s %s\n"
            "\n"
            "Global options (before or after the command):\n"
            "  --url URL   the daemon: http://HOST:PORT or unix:PATH (default: OVERSUB_URL, else\n"
            "              ./var/oversub.sock when present, else http://127.0.0.1:7070)\n"
            "  --json      the daemon's JSON, one document, instead of tables and lines\n"
            "  -h, --help  this, or a command's usage: oversub deploy --help, oversub help deploy\n"
            "  --version\n"
            "The admin token, when oversubd has one, comes from OVERSUB_TOKEN.\n"
            "\n"
            "Exit codes: 0 ok; 1 refused by the daemon (ready: the service failed or is gone);\n"
            "2 usage error; 3 oversubd unreachable (ready: timed out).\n",
            "demo", "DESIGN.md's worked scenario on a daemon of its own, narrated", "help",
            "a command's usage: oversub help deploy");
}

static void usage_simulate(FILE *f, const char *cmd)
{
    fprintf(
        f,
        "usage: oversub %s (--genai DIR | --services FILE --usage FILE) [options]\n"
        "%s"
        "\n"
        "%s\n"
        "\n"
        "Input\n"
        "  --genai DIR          a folder laid out like shared/traces (genai_pod_vram.csv,\n"
        "                       and when present genai_pod_gpu_util.csv, genai_model_load_ms.csv)\n"
        "  --services FILE      service specs, JSON or YAML (a list, or {\"services\": [...]})\n"
        "  --usage FILE         CSV: timestamp_s,service,vram_mib[,compute_pct]\n"
        "  --buffer X           --genai: request = peak x (1 + X) (0.3)\n"
        "  --floor pNN          --genai: degraded floor = that percentile of usage (p50)\n"
        "  --classes A:B:C      --genai: online:batch:experiment split by hash of the pod "
        "(20:40:40)\n"
        "  --pods K/N           --genai: only part K of N (0-based) of the pods, split by a\n"
        "                       hash of the pod id: tune on one part, report on another\n"
        "  --window A:B         --genai: only the samples from hour A to hour B of the trace\n"
        "                       (0:11.4 and 11.4:23 split the GenAI day in two)\n"
        "Pool and policies\n"
        "  --gpus POOL          8x81920, 4x81920,4x40960, or min[:SIZE] (min:81920): the\n"
        "                       smallest pool each policy needs within the budgets (min)\n"
        "  --policy LIST        static,brief,oversub,hindsight (all)\n"
        "  --ratio R|A:B:S      oversub's ratio, or a sweep from A to B by S (1.3)\n"
        "Budgets (for --gpus min, and what 'feasible' means)\n"
        "  --evict-budget N     batch+experiment evictions a week (5)\n"
        "  --unmet-budget X     demand left unmet by degrades, fraction (0.01)\n"
        "  --max-wait S         no service waits longer than S seconds to start (300)\n"
        "Engine (oversub policy)\n"
        "  --predict-trust H    a usage history of H hours weighs as much as the request in a\n"
        "                       service's predicted peak (1)\n"
        "  --floor-start S      a degradable service with no room starts at its floor once\n"
        "                       every placed service is measured (loaded, reported, not\n"
        "                       moving memory), at the latest after S seconds (120; 'never':\n"
        "                       no degraded starts, floor_start_after_ms -1)\n"
        "  --degrade WHO        which batch and experiment services answer a degrade (written\n"
        "                       for oversub): all, none, or a fraction picked by a hash of the\n"
        "                       id; the others keep no floor (a --services file's too), as\n"
        "                       vLLM, SGLang or a PyTorch job would be declared (all)\n"
        "Suspend (oversub policy; docs/simulate.md)\n"
        "  --suspend WHO        which batch and experiment services may be suspended (their\n"
        "                       memory moved to the host, no reload): all, none, or a fraction\n"
        "                       such as 0.5 picked by a hash of the id (none)\n"
        "  --suspend-host-mib M the host memory suspended services may fill (the pool's VRAM;\n"
        "                       0: no suspend)\n"
        "  --suspend-residual M what a suspended service keeps on each of its GPUs (1024)\n"
        "  --relocate           a suspended service of one GPU (method cuda) whose GPU stays\n"
        "                       full resumes on another GPU of the same chip that has room,\n"
        "                       from its checkpoint (the driver's GPU remap, 580+): no reload\n"
        "Output\n"
        "  --json               JSON on stdout instead of the table\n"
        "  --plot FILE.svg      used utilisation and events over time, and the ratio sweep\n"
        "  --events FILE        the engine's every decision and every OOM, a JSON object a line\n"
        "                       (a fixed --gpus pool; '-' for stdout)\n"
        "  --quiet              no progress on stderr\n"
        "  -h, --help           this\n"
        "\n"
        "Example:\n"
        "  oversub %s --genai ../shared/traces --gpus min --ratio 1.0:1.6:0.1 --plot out.svg\n",
        cmd,
        strcmp(cmd, "advise") == 0
            ? "   or: oversub advise --from-daemon [--url URL] [--json]\n"
              "       (the brief's rule on a running daemon's degrades and evictions)\n"
            : "",
        strcmp(cmd, "advise") == 0
            ? "Recommends an oversell ratio three ways (the brief's rule on the simulated\n"
              "preemptions, the highest ratio of a sweep within the budgets, a peak-prediction\n"
              "risk bound) and prints the evidence and its caveats."
            : "Replays per-service usage through the engine on a virtual clock, beside static\n"
              "reservations, the brief's algorithm and a hindsight packing, and compares\n"
              "utilisation, OOMs, degrades and evictions (a table, --json or --plot).",
        cmd);
}

struct cli {
    const char *genai, *services, *usage, *plot;
    const char *events_path; /* --events */
    FILE *events;
    const char *genai_only; /* a --genai option given (refused with --services) */
    const char *gpus;
    bool policies[POL__COUNT];
    int32_t r_from, r_to, r_step;
    struct genai_opts g;
    struct sim_budget b;
    int32_t suspend_milli;        /* --suspend: thousandths of the preemptible services */
    int32_t degrade_milli;        /* --degrade: thousandths that answer a degrade */
    bool relocate;                /* --relocate */
    int64_t suspend_residual_mib; /* per GPU */
    bool json, quiet;
    /* advise */
    const char *history;
};

static int parse_classes(const char *s, int32_t out[3])
{
    int a, b, c;
    char tail;
    if (sscanf(s, "%d:%d:%d%c", &a, &b, &c, &tail) != 3 || a < 0 || b < 0 || c < 0 ||
        a + b + c != 100)
        return -1;
    out[0] = a;
    out[1] = b;
    out[2] = c;
    return 0;
}

/* "0.3" as thousandths, via the exact ratio parser (1 + X). */
static int parse_fraction_milli(const char *s, int32_t *out)
{
    char buf[64];
    if (strlen(s) > 40 || s[0] == '-')
        return -1;
    /* reuse the exact decimal parser: parse 1+X as a ratio */
    int32_t m;
    snprintf(buf, sizeof(buf), "%s", s);
    char *dot = strchr(buf, '.');
    int64_t ip = 0;
    int64_t fp = 0;
    int nf = 0;
    for (char *p = buf; *p && p != dot; p++) {
        if (!isdigit((unsigned char)*p))
            return -1;
        ip = ip * 10 + (*p - '0');
        if (ip > 1000)
            return -1;
    }
    if (dot) {
        for (char *p = dot + 1; *p; p++) {
            if (!isdigit((unsigned char)*p))
                return -1;
            if (nf < 3) {
                fp = fp * 10 + (*p - '0');
                nf++;
            } else if (*p != '0') {
                return -1;
            }
        }
    }
    while (nf < 3) {
        fp *= 10;
        nf++;
    }
    m = (int32_t)(ip * 1000 + fp);
    *out = m;
    return 0;
}

static int parse_ratio_arg(const char *s, struct cli *c)
{
    char a[32], b[32], st[32];
    if (strchr(s, ':') != NULL) {
        if (sscanf(s, "%31[^:]:%31[^:]:%31s", a, b, st) != 3)
            return -1;
        if (osub_parse_ratio(a, &c->r_from) != 0 || osub_parse_ratio(b, &c->r_to) != 0)
            return -1;
        if (parse_fraction_milli(st, &c->r_step) != 0 || c->r_step <= 0 || c->r_to < c->r_from)
            return -1;
        if ((c->r_to - c->r_from) / c->r_step > 200)
            return -1;
        return 0;
    }
    if (osub_parse_ratio(s, &c->r_from) != 0)
        return -1;
    c->r_to = c->r_from;
    c->r_step = 1000;
    return 0;
}

static int parse_policies(const char *s, struct cli *c)
{
    memset(c->policies, 0, sizeof(c->policies));
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    char *save = NULL;
    int n = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int p;
        for (p = 0; p < POL__COUNT; p++)
            if (strcmp(tok, sim_policy_name((enum sim_policy)p)) == 0)
                break;
        if (p == POL__COUNT)
            return -1;
        c->policies[p] = true;
        n++;
    }
    return n > 0 ? 0 : -1;
}

/* --pods K/N */
static int opt_pods(const char *arg, struct cli *c)
{
    c->genai_only = "--pods";
    char *end;
    long k = -1, n = -1;
    const char *slash = strchr(arg, '/');
    if (slash != NULL) {
        errno = 0;
        k = strtol(arg, &end, 10);
        if (end != slash || errno)
            k = -1;
        n = strtol(slash + 1, &end, 10);
        if (*end != '\0' || errno || slash[1] == '\0')
            n = -1;
    }
    if (k < 0 || n < 1 || n > 1000 || k >= n) {
        fprintf(stderr,
                "oversub: --pods: '%s' is not K/N with 0 <= K < N <= 1000 (0/2 and 1/2 "
                "are the two halves)\n",
                arg);
        return -1;
    }
    c->g.part = (int32_t)k;
    c->g.parts = (int32_t)n;
    return 0;
}

/* --window A:B, in hours */
static int opt_window(const char *arg, struct cli *c)
{
    c->genai_only = "--window";
    char *end;
    const char *colon = strchr(arg, ':');
    double a = -1, b = -1;
    if (colon != NULL) {
        errno = 0;
        a = strtod(arg, &end);
        if (end != colon || errno || arg == colon)
            a = -1;
        b = strtod(colon + 1, &end);
        if (*end != '\0' || errno || colon[1] == '\0')
            b = -1;
    }
    if (!(a >= 0 && b > a && b <= 24.0 * 366)) {
        fprintf(stderr,
                "oversub: --window: '%s' is not A:B in hours with 0 <= A < B (such as "
                "0:11.4)\n",
                arg);
        return -1;
    }
    c->g.window = true;
    c->g.from_s = (int64_t)(a * 3600.0 + 0.5);
    c->g.to_s = (int64_t)(b * 3600.0 + 0.5);
    if (c->g.to_s <= c->g.from_s)
        c->g.to_s = c->g.from_s + 1; /* a window shorter than a second: one second */
    return 0;
}

/* --predict-trust H */
static int opt_trust(const char *arg, struct cli *c)
{
    char *end;
    errno = 0;
    double h = strtod(arg, &end);
    if (*end != '\0' || errno || end == arg || !(h > 0 && h <= 24 * 30)) {
        fprintf(stderr,
                "oversub: --predict-trust: '%s' is not a number of hours (0 < H <= "
                "720)\n",
                arg);
        return -1;
    }
    c->b.trust_ms = (int64_t)(h * 3600000.0 + 0.5);
    if (c->b.trust_ms < 1)
        c->b.trust_ms = 1;
    return 0;
}

/* --floor-start S|never */
static int opt_floor_start(const char *arg, struct cli *c)
{
    if (strcmp(arg, "never") == 0) {
        c->b.floor_start_ms = -1;
        return 0;
    }
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (*end != '\0' || errno || end == arg || v < 0 || v > 86400 * 30) {
        fprintf(stderr, "oversub: --floor-start: '%s' is not a number of seconds or 'never'\n",
                arg);
        return -1;
    }
    c->b.floor_start_ms = v == 0 ? 1 : v * 1000; /* 0 s: at once (1 ms) */
    return 0;
}

/* --suspend and --degrade: all|none|FRACTION of the batch and experiment services */
static int opt_share(const char *opt, const char *arg, int32_t *out)
{
    int32_t m = -1;
    if (strcmp(arg, "all") == 0)
        m = 1000;
    else if (strcmp(arg, "none") == 0)
        m = 0;
    else if (arg[0] != '\0' && parse_fraction_milli(arg, &m) != 0)
        m = -1;
    if (m < 0 || m > 1000) {
        fprintf(stderr,
                "oversub: %s: '%s' is not all, none or a fraction from 0 to 1 (at most "
                "three decimals, such as 0.5) of the batch and experiment services\n",
                opt, arg);
        return -1;
    }
    *out = m;
    return 0;
}

/* --suspend-host-mib and --suspend-residual: a size (a bare number is MiB), 0 allowed */
static int opt_suspend_size(const char *opt, const char *arg, int64_t *out)
{
    if (osub_parse_size_mib(arg, 1, out) != 0) {
        fprintf(stderr, "oversub: %s: '%s' is not a size (MiB, or such as 512GiB)\n", opt, arg);
        return -1;
    }
    return 0;
}

/* One option (getopt's ch and optarg). Returns 0, 1 when the usage was asked for (printed on
 * stdout), -1 on a usage error (said on stderr). */
static int parse_option(int ch, const char *arg, struct cli *c, bool advise)
{
    char *end;
    long v;
    switch (ch) {
    case 'G':
        c->genai = arg;
        break;
    case 'S':
        c->services = arg;
        break;
    case 'U':
        c->usage = arg;
        break;
    case 'g':
        c->gpus = arg;
        break;
    case 'p':
        if (parse_policies(arg, c) != 0) {
            fprintf(stderr,
                    "oversub: --policy: '%s' is not a list of static, brief, "
                    "oversub, hindsight\n",
                    arg);
            return -1;
        }
        break;
    case 'r':
        if (parse_ratio_arg(arg, c) != 0) {
            fprintf(stderr,
                    "oversub: --ratio: '%s' is not a ratio (1.3, at most three "
                    "decimals, 1.0 to 100) or a sweep FROM:TO:STEP (1.0:2.0:0.1)\n",
                    arg);
            return -1;
        }
        break;
    case 'B':
        c->genai_only = "--buffer";
        if (parse_fraction_milli(arg, &c->g.buffer_milli) != 0) {
            fprintf(stderr, "oversub: --buffer: '%s' is not a fraction such as 0.3\n", arg);
            return -1;
        }
        break;
    case 'F':
        c->genai_only = "--floor";
        v = arg[0] == 'p' ? strtol(arg + 1, &end, 10) : -1;
        if (arg[0] != 'p' || *end != '\0' || v < 1 || v > 100) {
            fprintf(stderr, "oversub: --floor: '%s' is not a percentile such as p50\n", arg);
            return -1;
        }
        c->g.floor_pct = (int32_t)v;
        break;
    case 'C':
        c->genai_only = "--classes";
        if (parse_classes(arg, c->g.classes) != 0) {
            fprintf(stderr, "oversub: --classes: '%s' is not A:B:C adding up to 100\n", arg);
            return -1;
        }
        break;
    case 'K':
        return opt_pods(arg, c);
    case 'W':
        return opt_window(arg, c);
    case 'T':
        return opt_trust(arg, c);
    case 'L':
        return opt_floor_start(arg, c);
    case 'X':
        return opt_share("--suspend", arg, &c->suspend_milli);
    case 'D':
        return opt_share("--degrade", arg, &c->degrade_milli);
    case 'Y':
        return opt_suspend_size("--suspend-host-mib", arg, &c->b.suspend_host_mib);
    case 'Z':
        return opt_suspend_size("--suspend-residual", arg, &c->suspend_residual_mib);
    case 'R':
        c->relocate = true;
        break;
    case 'e':
        errno = 0;
        v = strtol(arg, &end, 10);
        if (*end != '\0' || errno || v < 0 || v > 100000) {
            fprintf(stderr, "oversub: --evict-budget: '%s' is not a count\n", arg);
            return -1;
        }
        c->b.evict_budget_per_week = (int32_t)v;
        break;
    case 'u':
        if (parse_fraction_milli(arg, &c->b.unmet_budget_milli) != 0 ||
            c->b.unmet_budget_milli > 1000) {
            fprintf(stderr,
                    "oversub: --unmet-budget: '%s' is not a fraction such as "
                    "0.01\n",
                    arg);
            return -1;
        }
        break;
    case 'w':
        errno = 0;
        v = strtol(arg, &end, 10);
        if (*end != '\0' || errno || v < 0 || v > 86400 * 30) {
            fprintf(stderr, "oversub: --max-wait: '%s' is not a number of seconds\n", arg);
            return -1;
        }
        c->b.max_wait_s = v;
        break;
    case 'j':
        c->json = true;
        break;
    case 'P':
        c->plot = arg;
        break;
    case 'E':
        c->events_path = arg;
        break;
    case 'q':
        c->quiet = true;
        break;
    case 'H':
        c->history = arg;
        break;
    case 'h':
        usage_simulate(stdout, advise ? "advise" : "simulate");
        return 1;
    default:
        fprintf(stderr, "\n");
        usage_simulate(stderr, advise ? "advise" : "simulate");
        return -1;
    }
    return 0;
}

static void cli_defaults(struct cli *c, bool advise)
{
    memset(c, 0, sizeof(*c));
    genai_opts_default(&c->g);
    c->gpus = "min";
    for (int p = 0; p < POL__COUNT; p++)
        c->policies[p] = true;
    c->r_from = c->r_to = 1300;
    c->r_step = 1000;
    c->b.evict_budget_per_week = 5;
    c->b.unmet_budget_milli = 10;
    c->b.max_wait_s = 300;
    c->b.suspend_host_mib = -1; /* the pool's VRAM, when a service is suspendable */
    c->suspend_residual_mib = 1024;
    c->degrade_milli = 1000;
    if (advise) {
        c->r_from = 1000;
        c->r_to = 2000;
        c->r_step = 100;
    }
}

/* The input options go together: --genai, or --services with --usage. */
static int check_inputs(const struct cli *c)
{
    if ((c->genai == NULL) == (c->services == NULL && c->usage == NULL)) {
        fprintf(stderr, "oversub: give either --genai DIR or --services FILE --usage FILE\n");
        return -1;
    }
    if (c->genai == NULL && (c->services == NULL || c->usage == NULL)) {
        fprintf(stderr, "oversub: --services and --usage go together\n");
        return -1;
    }
    if (c->genai == NULL && c->genai_only != NULL) {
        fprintf(stderr,
                "oversub: %s applies to --genai only (a services file says each service's "
                "request, floor and class itself)\n",
                c->genai_only);
        return -1;
    }
    return 0;
}

static int parse_common(int argc, char **argv, struct cli *c, bool advise)
{
    cli_defaults(c, advise);
    static const struct option opts[] = {{"genai", required_argument, NULL, 'G'},
                                         {"services", required_argument, NULL, 'S'},
                                         {"usage", required_argument, NULL, 'U'},
                                         {"gpus", required_argument, NULL, 'g'},
                                         {"policy", required_argument, NULL, 'p'},
                                         {"ratio", required_argument, NULL, 'r'},
                                         {"buffer", required_argument, NULL, 'B'},
                                         {"floor", required_argument, NULL, 'F'},
                                         {"classes", required_argument, NULL, 'C'},
                                         {"pods", required_argument, NULL, 'K'},
                                         {"window", required_argument, NULL, 'W'},
                                         {"predict-trust", required_argument, NULL, 'T'},
                                         {"floor-start", required_argument, NULL, 'L'},
                                         {"suspend", required_argument, NULL, 'X'},
                                         {"degrade", required_argument, NULL, 'D'},
                                         {"suspend-host-mib", required_argument, NULL, 'Y'},
                                         {"suspend-residual", required_argument, NULL, 'Z'},
                                         {"relocate", no_argument, NULL, 'R'},
                                         {"evict-budget", required_argument, NULL, 'e'},
                                         {"unmet-budget", required_argument, NULL, 'u'},
                                         {"max-wait", required_argument, NULL, 'w'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"plot", required_argument, NULL, 'P'},
                                         {"events", required_argument, NULL, 'E'},
                                         {"quiet", no_argument, NULL, 'q'},
                                         {"history", required_argument, NULL, 'H'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = parse_option(ch, optarg, c, advise);
        if (rc != 0)
            return rc;
    }
    if (optind < argc) {
        fprintf(stderr, "oversub: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    return check_inputs(c);
}

static int load_trace(const struct cli *c, struct trace *tr)
{
    char err[512];
    trace_set_progress(c->quiet ? NULL : stderr); /* long imports and replays say how they go */
    int rc = c->genai ? trace_import_genai(c->genai, &c->g, tr, err, sizeof(err))
                      : trace_import_files(c->services, c->usage, tr, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "oversub: %s\n", err);
        return rc;
    }
    sim_mark_degrade(tr, c->degrade_milli);
    size_t n = sim_mark_suspend(tr, c->suspend_milli, c->suspend_residual_mib);
    if (c->relocate && n == 0) {
        fprintf(stderr, "oversub: --relocate: no service is suspendable: %s\n",
                c->suspend_milli == 0
                    ? "--suspend is none (the default); give --suspend all or a fraction above 0"
                    : "the --suspend fraction marked none of the batch and experiment services");
        trace_free(tr);
        return -1;
    }
    if (c->relocate)
        sim_mark_relocate(tr);
    return rc;
}

/* The pool: explicit sizes, or min[:SIZE]. */
static int parse_gpus(const char *s, int64_t **pool, size_t *n, int64_t *min_size)
{
    *min_size = 0;
    if (strncmp(s, "min", 3) == 0) {
        *min_size = 81920;
        if (s[3] == ':') {
            if (osub_parse_gpu_size(s + 4, min_size) != 0)
                return -1;
        } else if (s[3] != '\0') {
            return -1;
        }
        return 0;
    }
    *pool = malloc(4096 * sizeof(int64_t));
    if (*pool == NULL)
        return -1;
    if (osub_parse_pool(s, *pool, 4096, n) != 0) {
        free(*pool);
        *pool = NULL;
        return -1;
    }
    return 0;
}

/* Runs every asked-for policy and ratio; results owned by the caller. */
int run_policies(const struct cli *c, const struct trace *tr, struct sim_result **out,
                 size_t *n_out, bool timeline);
int run_policies(const struct cli *c, const struct trace *tr, struct sim_result **out,
                 size_t *n_out, bool timeline)
{
    int64_t *pool = NULL, min_size;
    size_t n_pool = 0;
    if (parse_gpus(c->gpus, &pool, &n_pool, &min_size) != 0) {
        fprintf(stderr,
                "oversub: --gpus: '%s' is not a pool (8x81920, 4x81920,4x40960, "
                "8xA100-80GB) or min[:SIZE]\n",
                c->gpus);
        return -1;
    }
    size_t n_ratios = (size_t)((c->r_to - c->r_from) / c->r_step) + 1;
    size_t cap = 3 + n_ratios;
    struct sim_result *res = calloc(cap, sizeof(*res));
    if (res == NULL) {
        free(pool);
        return -1;
    }
    size_t n = 0;
    char err[256];
    int32_t lb = min_size ? sim_lower_bound(tr, min_size) : 0;
    int32_t hi = 0;
    for (size_t i = 0; i < tr->n; i++)
        hi += tr->svcs[i].spec.gpus > 0 ? tr->svcs[i].spec.gpus : 1;
    for (int p = 0; p < POL__COUNT; p++) {
        if (!c->policies[p])
            continue;
        size_t nr = p == POL_OVERSUB || p == POL_BRIEF ? n_ratios : 1;
        if (p == POL_BRIEF)
            nr = 1; /* the brief at the sweep's first ratio (its own 1.5 is no better) */
        for (size_t k = 0; k < nr; k++) {
            int32_t ratio = p == POL_STATIC ? 1000 : c->r_from + (int32_t)k * c->r_step;
            if (!c->quiet)
                fprintf(stderr, "simulate: %s at %d.%03d%s ...\n",
                        sim_policy_name((enum sim_policy)p), ratio / 1000, ratio % 1000,
                        min_size && p != POL_HINDSIGHT ? ", searching the smallest pool" : "");
            struct sim_result *r = &res[n];
            int rc = 0;
            if (p == POL_HINDSIGHT) {
                int64_t one = min_size ? min_size : pool[0];
                struct sim_opts o = {.policy = POL_HINDSIGHT,
                                     .ratio_milli = 1000,
                                     .pool = &one,
                                     .n_pool = 1,
                                     .timeline = timeline};
                rc = sim_run(tr, &o, &c->b, r, err, sizeof(err));
            } else if (min_size) {
                int32_t g = sim_min_gpus(tr, (enum sim_policy)p, ratio, min_size, lb, hi, &c->b,
                                         timeline, r, err, sizeof(err));
                if (g < 0)
                    rc = -1;
                else if (g == 0) {
                    /* why: the largest pool's run says (a service larger than a GPU is not
                     * a budget problem) */
                    const char *why = "no pool up to the services' GPU count meets the budgets";
                    int64_t *big = malloc((size_t)(hi > 0 ? hi : 1) * sizeof(*big));
                    struct sim_result last;
                    uint32_t too_big = 0;
                    if (big != NULL) {
                        for (int32_t q = 0; q < hi; q++)
                            big[q] = min_size;
                        struct sim_opts o = {.policy = (enum sim_policy)p,
                                             .ratio_milli = ratio,
                                             .pool = big,
                                             .n_pool = (size_t)(hi > 0 ? hi : 1)};
                        if (sim_run(tr, &o, &c->b, &last, err, sizeof(err)) == 0) {
                            if (last.too_big > 0)
                                why = "a service larger than a GPU";
                            too_big = last.too_big;
                            sim_result_free(&last);
                        }
                        free(big);
                    }
                    memset(r, 0, sizeof(*r));
                    r->policy = (enum sim_policy)p;
                    r->ratio_milli = ratio;
                    r->n_gpus = 0;
                    r->feasible = false;
                    r->why_infeasible = why;
                    r->too_big = too_big;
                    r->samples = (int64_t)trace_samples(tr);
                }
            } else {
                struct sim_opts o = {.policy = (enum sim_policy)p,
                                     .ratio_milli = ratio,
                                     .pool = pool,
                                     .n_pool = n_pool,
                                     .timeline = timeline,
                                     .events = c->events};
                rc = sim_run(tr, &o, &c->b, r, err, sizeof(err));
            }
            if (rc != 0) {
                fprintf(stderr, "oversub: %s\n", err);
                for (size_t j = 0; j < n; j++)
                    sim_result_free(&res[j]);
                free(res);
                free(pool);
                return -1;
            }
            n++;
        }
    }
    free(pool);
    *out = res;
    *n_out = n;
    return 0;
}

static json_t *trace_json(const struct trace *tr)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I}", "services", (json_int_t)tr->n, "samples",
                     (json_int_t)trace_samples(tr), "start_s", (json_int_t)tr->t0, "end_s",
                     (json_int_t)tr->t1, "step_s", (json_int_t)tr->step_s);
}

static int cmd_simulate(int argc, char **argv)
{
    struct cli c;
    int rc = parse_common(argc, argv, &c, false);
    if (rc != 0)
        return rc > 0 ? EXIT_OK : EXIT_USAGE;
    if (c.events_path != NULL && strncmp(c.gpus, "min", 3) == 0) {
        fprintf(stderr, "oversub: --events needs a fixed pool (--gpus 16x81920): --gpus min "
                        "replays many pools\n");
        return EXIT_USAGE;
    }
    if (c.events_path != NULL) {
        c.events = strcmp(c.events_path, "-") == 0 ? stdout : fopen(c.events_path, "w");
        if (c.events == NULL) {
            fprintf(stderr, "oversub: --events %s: %s\n", c.events_path, strerror(errno));
            return EXIT_USAGE;
        }
    }
    struct trace tr;
    if (load_trace(&c, &tr) != 0) {
        if (c.events != NULL && c.events != stdout)
            fclose(c.events);
        return EXIT_USAGE;
    }
    if (!c.quiet)
        fprintf(stderr, "simulate: %zu services, %zu samples, %.1f hours in %lld s steps\n", tr.n,
                trace_samples(&tr), (double)(tr.t1 - tr.t0 + tr.step_s) / 3600.0,
                (long long)tr.step_s);
    struct sim_result *res;
    size_t n;
    int prc = run_policies(&c, &tr, &res, &n, c.plot != NULL);
    if (c.events != NULL && c.events != stdout && fclose(c.events) != 0 && prc == 0) {
        fprintf(stderr, "oversub: --events %s: %s\n", c.events_path, strerror(errno));
        prc = -1;
        for (size_t i = 0; i < n; i++)
            sim_result_free(&res[i]);
        free(res);
    }
    if (prc != 0) {
        trace_free(&tr);
        return EXIT_USAGE;
    }
    if (c.json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, report_json(&res[i]));
        json_t *root = json_pack("{s:o, s:o}", "trace", trace_json(&tr), "results", arr);
        json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        fputc('\n', stdout);
        json_decref(root);
    } else {
        report_table(stdout, res, n);
    }
    int ex = EXIT_OK;
    if (c.plot != NULL && report_svg(c.plot, &tr, res, n) != 0) {
        fprintf(stderr, "oversub: --plot %s: %s\n", c.plot, strerror(errno));
        ex = EXIT_USAGE;
    }
    for (size_t i = 0; i < n; i++)
        sim_result_free(&res[i]);
    free(res);
    trace_free(&tr);
    return ex;
}

static int cmd_advise(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage_simulate(stdout, "advise");
            return EXIT_OK;
        }
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--from-daemon") == 0)
            return cli_advise_daemon(argc, argv);
    struct cli c;
    int rc = parse_common(argc, argv, &c, true);
    if (rc == 0 && c.events_path != NULL) {
        fprintf(stderr, "oversub: advise: --events is simulate's (oversub simulate --events)\n");
        rc = -1;
    }
    if (rc != 0)
        return rc > 0 ? EXIT_OK : EXIT_USAGE;
    struct trace tr;
    if (load_trace(&c, &tr) != 0)
        return EXIT_USAGE;
    rc = advise_run(&c.b, c.gpus, c.r_from, c.r_to, c.r_step, &tr, c.json, c.quiet);
    trace_free(&tr);
    return rc == 0 ? EXIT_OK : EXIT_USAGE;
}

/* oversub help [COMMAND] */
static int cmd_help(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stdout);
        return EXIT_OK;
    }
    const char *c = argv[1];
    if (argc > 2) {
        fprintf(stderr, "oversub help: one command at a time\n");
        return EXIT_USAGE;
    }
    if (strcmp(c, "-h") == 0 || strcmp(c, "--help") == 0 || strcmp(c, "help") == 0) {
        printf("usage: oversub help [COMMAND]\n\nPrints a command's usage, or the list of "
               "commands.\n\nExample:\n  oversub help deploy\n");
        return EXIT_OK;
    }
    if (cli_daemon_usage(c, stdout) == 0)
        return EXIT_OK;
    if (strcmp(c, "simulate") == 0 || strcmp(c, "advise") == 0) {
        usage_simulate(stdout, c);
        return EXIT_OK;
    }
    if (strcmp(c, "demo") == 0) {
        cli_demo_usage(stdout);
        return EXIT_OK;
    }
    fprintf(stderr, "oversub help: unknown command '%s'\n\n", c);
    usage_main(stderr);
    return EXIT_USAGE;
}

int main(int argc, char **argv)
{
    /* global options before the command (--url URL, --json) go after it, where every command
     * reads them */
    int i = 1;
    char **globals = calloc((size_t)argc + 1, sizeof(char *));
    if (globals == NULL)
        return EXIT_USAGE;
    int ng = 0;
    while (i < argc && argv[i][0] == '-') {
        const char *o = argv[i];
        if (strcmp(o, "--json") == 0 || strncmp(o, "--url=", 6) == 0) {
            globals[ng++] = argv[i++];
        } else if (strcmp(o, "--url") == 0 && i + 1 < argc) {
            globals[ng++] = argv[i++];
            globals[ng++] = argv[i++];
        } else if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage_main(stdout);
            free(globals);
            return EXIT_OK;
        } else if (strcmp(o, "--version") == 0) {
            printf("oversub %s\n", OSUB_VERSION);
            free(globals);
            return EXIT_OK;
        } else {
            fprintf(stderr, "oversub: unknown option '%s'\n\n", o);
            usage_main(stderr);
            free(globals);
            return EXIT_USAGE;
        }
    }
    if (i >= argc) {
        usage_main(stderr);
        free(globals);
        return EXIT_USAGE;
    }
    /* argv for the command: its name, the global options, then its own arguments */
    char **cargv = calloc((size_t)argc + 1, sizeof(char *));
    if (cargv == NULL) {
        free(globals);
        return EXIT_USAGE;
    }
    int cargc = 0;
    cargv[cargc++] = argv[i];
    for (int k = 0; k < ng; k++)
        cargv[cargc++] = globals[k];
    for (int k = i + 1; k < argc; k++)
        cargv[cargc++] = argv[k];
    free(globals);
    const char *cmd = cargv[0];
    int ex;
    if (strcmp(cmd, "help") == 0)
        ex = cmd_help(argc - i, argv + i); /* help reads no global option */
    else if (strcmp(cmd, "simulate") == 0)
        ex = cmd_simulate(cargc, cargv);
    else if (strcmp(cmd, "demo") == 0)
        ex = cli_demo(cargc, cargv);
    else if (strcmp(cmd, "advise") == 0)
        ex = cmd_advise(cargc, cargv);
    else if (cli_daemon_has(cmd))
        ex = cli_daemon_cmd(cargc, cargv);
    else {
        fprintf(stderr, "oversub: unknown command '%s'\n\n", cmd);
        usage_main(stderr);
        ex = EXIT_USAGE;
    }
    free(cargv);
    return ex;
}
