/* main.c - oversub-scheduler: flags and the event loop */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "extender.h"

#ifndef OSUB_VERSION
#define OSUB_VERSION "0.1.0"
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: oversub-scheduler [options]\n"
            "\n"
            "A kube-scheduler extender: filter, prioritize, preempt and bind for pods asking for\n"
            "oversub.io/vram-mib, each answered by the oversubd of the nodes concerned (a dry\n"
            "run of the pod there). See docs/kubernetes.md.\n"
            "\n"
            "  --listen HOST:PORT     where kube-scheduler calls (127.0.0.1:8888; port 0: the OS "
            "picks)\n"
            "  --node NAME=URL        a node and its oversubd (http://HOST:PORT); repeatable\n"
            "  --kube-nodes           also find nodes through the API server: Node objects\n"
            "                         annotated oversub.io/url=http://HOST:PORT\n"
            "  --kube-api URL         the API server (in a cluster: from "
            "KUBERNETES_SERVICE_HOST);\n"
            "                         needed to bind (the Binding) and for --kube-nodes\n"
            "  --kube-token-file F    its bearer token, read before each request\n"
            "                         (/var/run/secrets/kubernetes.io/serviceaccount/token)\n"
            "  --kube-ca-file F       its CA (/var/run/secrets/kubernetes.io/serviceaccount/"
            "ca.crt)\n"
            "  --kube-timeout-ms MS   one API server request at most (4000: a bind answers\n"
            "                         within kube-scheduler's 5 s)\n"
            "  --token-file F         the nodes' oversubd admin token\n"
            "  --online-priority N    a pod with no oversub.io/class annotation is online from\n"
            "                         this spec.priority (1000) ...\n"
            "  --batch-priority N     ... batch from this one (0), experiment below\n"
            "  --node-timeout MS      how long one oversubd may take (2000)\n"
            "  --scheduler-counts-vram  kube-scheduler counts oversub.io/vram-mib too\n"
            "                         (ignoredByScheduler: false): preempt spares its victims\n"
            "                         on oversub's GPUs that oversub would not evict\n"
            "  --cache-ms MS          a node's answer for a pod is reused this long (10000)\n"
            "  --pool-refresh-ms MS   each node's pool is read this often (5000)\n"
            "  --help, --version\n");
}

static int num(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "oversub-scheduler: %s must be a whole number from %lld to %lld\n", flag,
                (long long)lo, (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

static void on_signal(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

enum {
    O_KAPI = 256,
    O_KTOK,
    O_KCA,
    O_KNODES,
    O_ONLINE,
    O_BATCH,
    O_NT,
    O_CACHE,
    O_POOL,
    O_KT,
    O_SCV
};

/* What the command line said: the extender's config and the --node NAME=URL pairs. */
struct flags {
    struct osub_ext_config cfg;
    char *nodes[1024];
    size_t n_nodes;
    bool api_given;
};

/* One flag (getopt's c and optarg). Returns -1 to go on, else the exit code (0 after --help or
 * --version, 2 on a usage error, said on stderr). */
static int flag(int c, char *arg, struct flags *f)
{
    struct osub_ext_config *cfg = &f->cfg;
    int64_t v;
    switch (c) {
    case 'l': {
        const char *colon = strrchr(arg, ':');
        if (colon == NULL || colon == arg || (size_t)(colon - arg) >= sizeof(cfg->listen_host) ||
            num("--listen's port", colon + 1, 0, 65535, &v) != 0) {
            fprintf(stderr, "oversub-scheduler: --listen takes HOST:PORT\n");
            return 2;
        }
        memcpy(cfg->listen_host, arg, (size_t)(colon - arg));
        cfg->listen_host[colon - arg] = '\0';
        cfg->listen_port = (int)v;
        break;
    }
    case 'n':
        if (f->n_nodes == sizeof(f->nodes) / sizeof(f->nodes[0]) || strchr(arg, '=') == NULL) {
            fprintf(stderr, "oversub-scheduler: --node takes NAME=http://HOST:PORT (at most "
                            "1024; more come from --kube-nodes)\n");
            return 2;
        }
        f->nodes[f->n_nodes++] = arg;
        break;
    case O_KNODES:
        cfg->kube_nodes = true;
        break;
    case O_KAPI:
        snprintf(cfg->kube_opts.api, sizeof(cfg->kube_opts.api), "%s", arg);
        f->api_given = true;
        break;
    case O_KTOK:
        snprintf(cfg->kube_opts.token_file, sizeof(cfg->kube_opts.token_file), "%s", arg);
        break;
    case O_KCA:
        snprintf(cfg->kube_opts.ca_file, sizeof(cfg->kube_opts.ca_file), "%s", arg);
        break;
    case O_SCV:
        cfg->scheduler_counts_vram = true;
        break;
    case O_KT:
        if (num("--kube-timeout-ms", arg, 100, 60000, &v) != 0)
            return 2;
        cfg->kube_opts.timeout_ms = (long)v;
        break;
    case 't':
        snprintf(cfg->token_file, sizeof(cfg->token_file), "%s", arg);
        break;
    case O_ONLINE:
        if (num("--online-priority", arg, -2147483648LL, 2147483647LL, &v) != 0)
            return 2;
        cfg->policy.online_min = v;
        break;
    case O_BATCH:
        if (num("--batch-priority", arg, -2147483648LL, 2147483647LL, &v) != 0)
            return 2;
        cfg->policy.batch_min = v;
        break;
    case O_NT:
        if (num("--node-timeout", arg, 100, 60000, &v) != 0)
            return 2;
        cfg->node_timeout_ms = v;
        break;
    case O_CACHE:
        if (num("--cache-ms", arg, 0, 3600000, &v) != 0)
            return 2;
        cfg->cache_ms = v;
        break;
    case O_POOL:
        if (num("--pool-refresh-ms", arg, 100, 3600000, &v) != 0)
            return 2;
        cfg->pool_refresh_ms = v;
        break;
    case 'h':
        usage(stdout);
        return 0;
    case 'V':
        printf("oversub-scheduler %s\n", OSUB_VERSION);
        return 0;
    default:
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Parses the command line into f. Returns -1 to go on, else the exit code. */
static int parse_flags(int argc, char **argv, struct flags *f)
{
    memset(f, 0, sizeof(*f));
    osub_ext_config_default(&f->cfg);
    static const struct option opts[] = {{"listen", required_argument, NULL, 'l'},
                                         {"node", required_argument, NULL, 'n'},
                                         {"kube-nodes", no_argument, NULL, O_KNODES},
                                         {"kube-api", required_argument, NULL, O_KAPI},
                                         {"kube-token-file", required_argument, NULL, O_KTOK},
                                         {"kube-ca-file", required_argument, NULL, O_KCA},
                                         {"kube-timeout-ms", required_argument, NULL, O_KT},
                                         {"scheduler-counts-vram", no_argument, NULL, O_SCV},
                                         {"token-file", required_argument, NULL, 't'},
                                         {"online-priority", required_argument, NULL, O_ONLINE},
                                         {"batch-priority", required_argument, NULL, O_BATCH},
                                         {"node-timeout", required_argument, NULL, O_NT},
                                         {"cache-ms", required_argument, NULL, O_CACHE},
                                         {"pool-refresh-ms", required_argument, NULL, O_POOL},
                                         {"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'V'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int ex = flag(c, optarg, f);
        if (ex >= 0)
            return ex;
    }
    if (optind < argc) {
        fprintf(stderr, "oversub-scheduler: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (f->cfg.policy.batch_min > f->cfg.policy.online_min) {
        fprintf(stderr,
                "oversub-scheduler: --batch-priority must not be above --online-priority\n");
        return 2;
    }
    /* the API server: given, or the cluster's (needed to bind) */
    f->cfg.kube = f->api_given || f->cfg.kube_opts.api[0] != '\0';
    if (f->cfg.kube_nodes && !f->cfg.kube) {
        fprintf(stderr, "oversub-scheduler: --kube-nodes needs the API server: give --kube-api "
                        "(or run in a cluster)\n");
        return 2;
    }
    if (f->n_nodes == 0 && !f->cfg.kube_nodes) {
        fprintf(stderr, "oversub-scheduler: no nodes: give --node NAME=URL or --kube-nodes\n");
        return 2;
    }
    return -1;
}

/* The extender on an event loop until SIGINT or SIGTERM. Returns the exit code. */
static int serve(struct flags *f)
{
    const struct osub_ext_config *cfg = &f->cfg;
    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    struct osub_ext *x = NULL;
    char err[600];
    if (base == NULL || osub_ext_new(base, cfg, &x, err, sizeof(err)) != 0) {
        fprintf(stderr, "oversub-scheduler: %s\n", base ? err : "out of memory");
        return 1;
    }
    for (size_t i = 0; i < f->n_nodes; i++) {
        char *eq = strchr(f->nodes[i], '=');
        *eq = '\0';
        if (osub_ext_node(x, f->nodes[i], eq + 1, err, sizeof(err)) != 0) {
            fprintf(stderr, "oversub-scheduler: --node: %s\n", err);
            osub_ext_free(x);
            event_base_free(base);
            return 2;
        }
    }
    if (osub_ext_start(x, err, sizeof(err)) != 0) {
        fprintf(stderr, "oversub-scheduler: %s\n", err);
        osub_ext_free(x);
        event_base_free(base);
        return 1;
    }
    if (cfg->kube)
        fprintf(stderr, "oversub-scheduler: API server %s\n", cfg->kube_opts.api);
    struct event *si = evsignal_new(base, SIGINT, on_signal, base);
    struct event *st = evsignal_new(base, SIGTERM, on_signal, base);
    if (si == NULL || st == NULL || event_add(si, NULL) != 0 || event_add(st, NULL) != 0) {
        fprintf(stderr, "oversub-scheduler: out of memory\n");
        return 1;
    }
    event_base_dispatch(base);
    fprintf(stderr, "oversub-scheduler: stopping\n");
    event_free(si);
    event_free(st);
    osub_ext_free(x);
    event_base_free(base);
    return 0;
}

int main(int argc, char **argv)
{
    struct flags f;
    int ex = parse_flags(argc, argv, &f);
    if (ex >= 0)
        return ex;
    return serve(&f);
}
