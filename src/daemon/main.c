/* main.c - oversubd: flags, configuration, start-up and the event loop */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "core.h"
#include "monitor.h"
#include <signal.h>
#include "log.h"
#include "deviceplugin.h"
#include "jsonmem.h"
#include "notify.h"
#include "netpolicy.h"
#include "oversub/units.h"
#include "spec_json.h"
#include "suspender.h"

#ifndef OSUB_VERSION
#define OSUB_VERSION "0.1.0"
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: oversubd [options]\n"
            "\n"
            "Runs the oversub daemon: the engine behind a JSON control API, with its state in\n"
            "SQLite. Flags override the configuration file.\n"
            "\n"
            "  --config FILE        a YAML configuration (see oversub.yaml)\n"
            "  --listen HOST:PORT   the control API (127.0.0.1:7070; port 0: the OS picks)\n"
            "  --gateway HOST:PORT  the entry for services' traffic, a reverse proxy with\n"
            "                       overload protection (off by default; oversub.yaml: :8080)\n"
            "  --socket PATH        the control API on a Unix socket, mode 0600\n"
            "                       (beside the state: STATE.sock, .db taken off; \"\" for none)\n"
            "  --state PATH         the SQLite state (var/oversub.db)\n"
            "  --gpus POOL          auto, or a simulated pool: sim:8x81920, sim:4x81920,4x40960\n"
            "  --ratio R            the oversell ratio of a new state (1.3)\n"
            "  --token-file FILE    the admin token: mutations need Authorization: Bearer it;\n"
            "                       required to listen on anything but loopback\n"
            "  --tick-ms N          how often timers, pressure and the queue run (1000)\n"
            "  --nvml-lib PATH      the NVML library to load with --gpus auto\n"
            "                       (libnvidia-ml.so.1 from the loader's path)\n"
            "  --device-plugin DIR  serve the kubelet device plugin (oversub.io/vram-mib) in\n"
            "                       the kubelet's folder DIR (/var/lib/kubelet/device-plugins)\n"
            "  --kube-api URL       where pods are evicted: auto (in a cluster), none, or the\n"
            "                       API server's URL (oversub.yaml: kubernetes_api)\n"
            "  --new-state          start although STATE.marker says the state lost commands\n"
            "                       (a deleted -wal file, an emptied or replaced database)\n"
            "  --allow-root-services  managed services given no user may run as root (make run,\n"
            "                       as root, passes it; the key allow_root_services)\n"
            "  --log-level LEVEL    debug, info (the default), warn or error: what oversubd logs\n"
            "                       on stderr (oversub.yaml: log_level)\n"
            "  --help, --version\n");
}

static int parse_hostport(const char *s, char *host, size_t hostlen, int *port_out)
{
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || (size_t)(colon - s) >= hostlen)
        return -1;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535 || colon[1] == '\0')
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port_out = (int)port;
    return 0;
}

static int parse_gateway(const char *s, struct osubd_config *c)
{
    if (s[0] == '\0') {
        c->gateway_host[0] = '\0';
        return 0;
    }
    return parse_hostport(s, c->gateway_host, sizeof(c->gateway_host), &c->gateway_port);
}

static int parse_listen(const char *s, struct osubd_config *c)
{
    return parse_hostport(s, c->listen_host, sizeof(c->listen_host), &c->listen_port);
}

static bool loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

static int read_token(const char *path, struct osubd_config *c)
{
    char err[700];
    if (osubd_read_token(path, c->token, sizeof(c->token), err, sizeof(err)) != 0) {
        osubd_log(OSUBD_LOG_ERROR, "--token-file %s", err);
        return -1;
    }
    return 0;
}

/* The line of the file where key is set (for messages; 0 when not found). */
static int key_line(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char line[1024];
    size_t kl = strlen(key);
    int n = 0, found = 0;
    while (!found && fgets(line, sizeof(line), f)) {
        n++;
        const char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, key, kl) == 0 && (p[kl] == ':' || p[kl] == ' '))
            found = n;
    }
    fclose(f);
    return found;
}

/* Integer settings: the engine's timings and watermarks (for a new state; a state keeps the
 * ones it was made with), and the size of a service's log. */
struct engine_key {
    const char *name;
    int64_t *i64;
    int32_t *i32;
    long long lo, hi;
};

static const struct engine_key *engine_key(const char *name, struct osubd_config *c)
{
    static struct engine_key keys[24];
    const struct engine_key all[] = {
        {"ack_timeout_ms", &c->engine.ack_timeout_ms, NULL, 100, 3600000},
        {"grace_ms", &c->engine.grace_ms, NULL, 0, 86400000},
        {"hysteresis_ms", &c->engine.hysteresis_ms, NULL, 0, 86400000},
        {"min_runtime_ms", &c->engine.min_runtime_ms, NULL, 0, 86400000},
        {"restart_cost_ms", &c->engine.restart_cost_ms, NULL, 0, 86400000},
        {"prediction_trust_ms", &c->engine.prediction_trust_ms, NULL, 1, 30LL * 86400000},
        {"floor_start_after_ms", &c->engine.floor_start_after_ms, NULL, -1, 30LL * 86400000},
        {"suspend_mib_per_s", &c->engine.suspend_mib_per_s, NULL, 1, 1LL << 30},
        {"suspend_timeout_ms", &c->engine.suspend_timeout_ms, NULL, 100, 3600000},
        {"suspend_min_runtime_ms", &c->engine.suspend_min_runtime_ms, NULL, 0, 86400000},
        {"high_watermark_pct", NULL, &c->engine.high_watermark_pct, 1, 100},
        {"low_watermark_pct", NULL, &c->engine.low_watermark_pct, 1, 100},
        {"service_log_max", &c->service_log_max, NULL, 4096, 1LL << 40},
        {"gateway_conns_per_client", NULL, &c->gateway_conns_per_client, 1, 1000000},
        {"api_conns_per_client", NULL, &c->api_conns_per_client, 1, 1000000},
        {"api_conns_max", NULL, &c->api_conns_max, 1, 1000000},
    };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (strcmp(all[i].name, name) == 0) {
            keys[i] = all[i];
            return &keys[i];
        }
    return NULL;
}

/* The true/false keys. */
static bool bool_key(const char *key)
{
    return strcmp(key, "metrics_per_service") == 0 || strcmp(key, "allow_root_services") == 0 ||
           strcmp(key, "gateway_defer_accept") == 0;
}

/* The numeric and true/false keys: 0, -1 (said why), or 1 (not one of them). */
static int config_number(struct osubd_config *c, const char *key, const char *sv, const char *where)
{
    int rc = 0;
    if (strcmp(key, "events_keep") == 0 || strcmp(key, "events_days") == 0) {
        char *end;
        long long t = strtoll(sv, &end, 10);
        if (*end != '\0' || sv[0] == '\0' || t < 0 || t > 1000000000LL) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key '%s' must be 0 to 1000000000", where, key);
            rc = -1;
        }
        if (key[7] == 'k')
            c->events_keep = t;
        else
            c->events_days = t;
    } else if (bool_key(key)) {
        bool *b = key[0] == 'm'   ? &c->metrics_per_service
                  : key[0] == 'a' ? &c->allow_root_services
                                  : &c->gateway_accept_at_once;
        bool flip = key[0] == 'g'; /* stored as its opposite: false, the default, defers */
        if (strcmp(sv, "true") == 0)
            *b = !flip;
        else if (strcmp(sv, "false") == 0)
            *b = flip;
        else {
            osubd_log(OSUBD_LOG_ERROR, "%s: key '%s' must be true or false", where, key);
            rc = -1;
        }
    } else if (engine_key(key, c) != NULL) {
        const struct engine_key *k = engine_key(key, c);
        char *end;
        errno = 0;
        long long t = strtoll(sv, &end, 10);
        if (*end != '\0' || sv[0] == '\0' || errno != 0 || t < k->lo || t > k->hi) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key '%s' must be an integer from %lld to %lld", where,
                      key, k->lo, k->hi);
            rc = -1;
        } else if (k->i64 != NULL) {
            *k->i64 = t;
        } else {
            *k->i32 = (int32_t)t;
        }
    } else if (strcmp(key, "suspend_host_mib") == 0) {
        int64_t mib;
        if (osub_parse_size_mib(sv, 0, &mib) != 0 || mib > (INT64_C(1) << 40)) {
            osubd_log(OSUBD_LOG_ERROR,
                      "%s: key 'suspend_host_mib' must be a size (MiB, or 64GiB; 0: suspend off)",
                      where);
            rc = -1;
        } else {
            c->engine.suspend_host_mib = mib;
            c->suspend_host_auto = false;
        }
    } else if (strcmp(key, "shutdown_grace_ms") == 0) {
        char *end;
        long t = strtol(sv, &end, 10);
        if (*end != '\0' || sv[0] == '\0' || t < 0 || t > 600000) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key 'shutdown_grace_ms' must be 0 to 600000", where);
            rc = -1;
        }
        c->shutdown_grace_ms = t;
    } else if (strcmp(key, "poll_ms") == 0) {
        char *end;
        long t = strtol(sv, &end, 10);
        if (*end != '\0' || t < 10 || t > 60000) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key 'poll_ms' must be 10 to 60000", where);
            rc = -1;
        }
        c->poll_ms = t;
    } else if (strcmp(key, "log_level") == 0) {
        if (osubd_log_parse_level(sv) < 0) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key 'log_level' must be debug, info, warn or error",
                      where);
            rc = -1;
        } else {
            osubd_log_set_level(osubd_log_parse_level(sv));
        }
    } else if (strcmp(key, "tick_ms") == 0) {
        char *end;
        long t = strtol(sv, &end, 10);
        if (*end != '\0' || t < 10 || t > 60000) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key 'tick_ms' must be 10 to 60000", where);
            rc = -1;
        }
        c->tick_ms = t;
    } else {
        return 1;
    }
    return rc;
}

/* The keys whose value is text (addresses, paths, names): 0, -1 (said why), or 1 (not one of
 * them). */
static int config_text(struct osubd_config *c, const char *key, const char *sv, const char *where,
                       char *token_file, size_t tlen)
{
    int rc = 0;
    char err[400];
    if (strcmp(key, "listen") == 0) {
        if (parse_listen(sv, c) != 0) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key 'listen': '%s' is not HOST:PORT", where, sv);
            rc = -1;
        }
    } else if (strcmp(key, "gateway") == 0) {
        if (parse_gateway(sv, c) != 0) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key 'gateway': '%s' is not HOST:PORT or \"\"", where,
                      sv);
            rc = -1;
        }
    } else if (strcmp(key, "socket") == 0) {
        snprintf(c->socket_path, sizeof(c->socket_path), "%.511s", sv);
        c->socket_set = true;
    } else if (strcmp(key, "state") == 0) {
        snprintf(c->state_path, sizeof(c->state_path), "%.511s", sv);
    } else if (strcmp(key, "gpus") == 0) {
        snprintf(c->gpus, sizeof(c->gpus), "%.511s", sv);
    } else if (strcmp(key, "ratio") == 0) {
        if (osub_parse_ratio(sv, &c->ratio_milli) != 0) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key 'ratio': '%s' is not a ratio such as 1.3", where,
                      sv);
            rc = -1;
        }
    } else if (strcmp(key, "gateway_access_log") == 0) {
        snprintf(c->gateway_access_log, sizeof(c->gateway_access_log), "%.511s", sv);
    } else if (strcmp(key, "cgroup") == 0) {
        if (strcmp(sv, "auto") != 0 && strcmp(sv, "none") != 0 && sv[0] != '/') {
            osubd_log(OSUBD_LOG_ERROR,
                      "%s: key 'cgroup' must be auto, none or the absolute path of "
                      "a cgroup v2 folder",
                      where);
            rc = -1;
        }
        snprintf(c->cgroup, sizeof(c->cgroup), "%.511s", sv);
    } else if (strcmp(key, "allowed_destinations") == 0) {
        if (osubd_parse_destinations(sv, NULL, err, sizeof(err)) != 0) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key 'allowed_destinations': %s", where, err);
            rc = -1;
        }
        snprintf(c->allowed_destinations, sizeof(c->allowed_destinations), "%s", sv);
    } else if (strcmp(key, "api_hostnames") == 0) {
        /* names a browser may reach the API by (Host: NAME:PORT); IP literals of the
         * listeners and localhost always */
        for (const char *q = sv; *q != '\0'; q++)
            if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
                  (*q >= '0' && *q <= '9') || *q == '-' || *q == '.' || *q == ',' || *q == ' ')) {
                osubd_log(OSUBD_LOG_ERROR,
                          "%s: key 'api_hostnames': host names separated by commas "
                          "(letters, digits, '-', '.'), not '%s'",
                          where, sv);
                rc = -1;
                break;
            }
        snprintf(c->api_hostnames, sizeof(c->api_hostnames), "%.511s", sv);
    } else if (strcmp(key, "device_plugin") == 0) {
        if (sv[0] != '\0' && sv[0] != '/') {
            osubd_log(OSUBD_LOG_ERROR,
                      "%s: key 'device_plugin' must be the absolute path of the "
                      "kubelet's device-plugin folder, or \"\"",
                      where);
            rc = -1;
        }
        snprintf(c->device_plugin, sizeof(c->device_plugin), "%.511s", sv);
    } else if (strcmp(key, "kubernetes_api") == 0) {
        if (strcmp(sv, "auto") != 0 && strcmp(sv, "none") != 0 && strncmp(sv, "https://", 8) != 0 &&
            strncmp(sv, "http://", 7) != 0) {
            osubd_log(OSUBD_LOG_ERROR,
                      "%s: key 'kubernetes_api' must be auto, none or the API "
                      "server's https:// URL",
                      where);
            rc = -1;
        }
        snprintf(c->kube_api, sizeof(c->kube_api), "%.511s", sv);
    } else if (strcmp(key, "kubernetes_node") == 0) {
        snprintf(c->kube_node, sizeof(c->kube_node), "%.253s", sv);
    } else if (strcmp(key, "kubernetes_token_file") == 0) {
        snprintf(c->kube_token_file, sizeof(c->kube_token_file), "%.511s", sv);
    } else if (strcmp(key, "kubernetes_ca_file") == 0) {
        snprintf(c->kube_ca_file, sizeof(c->kube_ca_file), "%.511s", sv);
    } else if (strcmp(key, "cuda_shim") == 0) {
        snprintf(c->cuda_shim, sizeof(c->cuda_shim), "%.511s", sv);
    } else if (strcmp(key, "cuda_lib") == 0) {
        snprintf(c->cuda_lib, sizeof(c->cuda_lib), "%.511s", sv);
    } else if (strcmp(key, "nvml_lib") == 0) {
        snprintf(c->nvml_lib, sizeof(c->nvml_lib), "%.511s", sv);
    } else if (strcmp(key, "token_file") == 0) {
        snprintf(token_file, tlen, "%.511s", sv);
    } else {
        return 1;
    }
    return rc;
}

/* The configuration file: every key documented in oversub.yaml. */
static int read_config(const char *path, struct osubd_config *c, char *token_file, size_t tlen)
{
    char err[400];
    json_t *root = osub_yaml_load_file(path, err, sizeof(err));
    if (root == NULL) {
        osubd_log(OSUBD_LOG_ERROR, "%s", err);
        return -1;
    }
    if (!json_is_object(root)) {
        osubd_log(OSUBD_LOG_ERROR, "%s: expected a mapping of settings", path);
        json_decref(root);
        return -1;
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v)
    {
        char where[600];
        snprintf(where, sizeof(where), "%s:%d", path, key_line(path, key));
        const char *sv = json_string_value(v);
        char num[64];
        if (sv == NULL && json_is_number(v)) {
            snprintf(num, sizeof(num), json_is_integer(v) ? "%.0f" : "%.6g", json_number_value(v));
            sv = num;
        }
        if (sv == NULL && json_is_boolean(v))
            sv = json_is_true(v) ? "true" : "false";
        char joined[1024] = "";
        if (sv == NULL && json_is_array(v) &&
            (strcmp(key, "allowed_destinations") == 0 || strcmp(key, "api_hostnames") == 0)) {
            /* a YAML list: its items, comma-separated */
            size_t i;
            json_t *it;
            json_array_foreach(v, i, it)
            {
                size_t l = strlen(joined);
                snprintf(joined + l, sizeof(joined) - l, "%s%s", i ? "," : "",
                         json_is_string(it) ? json_string_value(it) : "?");
            }
            sv = joined;
        }
        if (sv == NULL) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key '%s' must be %s", where, key,
                      bool_key(key) ? "true or false" : "a string or a number");
            rc = -1;
            break;
        }
        if (strlen(sv) > 511 && strcmp(key, "allowed_destinations") != 0) {
            osubd_log(OSUBD_LOG_ERROR, "%s: key '%s': the value is too long (at most 511 bytes)",
                      where, key);
            rc = -1;
            break;
        }
        int r = config_text(c, key, sv, where, token_file, tlen);
        if (r == 1)
            r = config_number(c, key, sv, where);
        if (r == 1) {
            osubd_log(OSUBD_LOG_ERROR, "%s: unknown key '%s'", where, key);
            r = -1;
        }
        rc = r;
        if (rc != 0)
            break;
    }
    json_decref(root);
    return rc;
}

/* ---- the wiring: every part made, registered and started in order, then stopped --------- */

struct daemon {
    struct osubd_config cfg;
    struct osubd_gpus gpus;          /* the monitor fills it; the actuators, the API read it */
    struct osubd_self self;          /* the addresses the API and the gateway listen on */
    struct osubd_destinations *dest; /* allowed_destinations, parsed */
    struct osubd_core *core;
    struct osubd_monitor *mon;
    struct osubd_routes *routes;
    struct osubd_act *act;
    struct osubd_pods *pods;
    struct osubd_gateway *gw;
    struct osubd_api *api;
    struct osubd_dp *dp;
    struct osubd_sus *sus; /* the suspend mechanisms, run by the actuators */
    struct event *sigint_ev, *sigterm_ev, *sighup_ev;
    struct event *drain_ev; /* while stopping gracefully: checks the gateway has drained */
    int64_t drain_until_ms; /* engine time the grace ends */
};

static void on_drain(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct daemon *d = arg;
    int open = osubd_gateway_open_clients(d->gw);
    if (open == 0) {
        osubd_log(OSUBD_LOG_INFO, "the gateway drained: stopping");
        osubd_core_break(d->core);
    } else if (osubd_engine_now(d->core) >= d->drain_until_ms) {
        osubd_log(OSUBD_LOG_INFO,
                  "the grace period (%lld ms) ended with %d gateway connection(s) still "
                  "open: stopping",
                  (long long)d->cfg.shutdown_grace_ms, open);
        osubd_core_break(d->core);
    }
}

/* SIGTERM, SIGINT: the gateway stops accepting and lets what is in flight (streams too)
 * finish, up to shutdown_grace_ms; a second signal stops at once. */
static void on_signal(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct daemon *d = arg;
    if (d->drain_ev != NULL || d->gw == NULL || d->cfg.shutdown_grace_ms == 0) {
        osubd_log(OSUBD_LOG_INFO, "stopping");
        osubd_core_break(d->core);
        return;
    }
    int open = osubd_gateway_drain(d->gw);
    osubd_log(OSUBD_LOG_INFO,
              "stopping: the gateway accepts no more connections and lets %d finish "
              "(at most %lld ms; a second signal stops at once)",
              open, (long long)d->cfg.shutdown_grace_ms);
    d->drain_until_ms = osubd_engine_now(d->core) + d->cfg.shutdown_grace_ms;
    d->drain_ev = event_new(osubd_core_base(d->core), -1, EV_PERSIST, on_drain, d);
    struct timeval tv = {0, 50000};
    if (d->drain_ev == NULL || event_add(d->drain_ev, &tv) != 0)
        osubd_core_break(d->core);
    else
        on_drain(-1, 0, d);
}

/* SIGHUP: never a stop. The admin token is read again from its file; other settings are read
 * at start, and the message says so. */
static void on_hup_read(struct daemon *d, char *err, size_t errlen);

static void on_hup(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct daemon *d = arg;
    char err[600];
    /* systemd's ExecReload (kill -HUP): reloading, then ready again */
    osubd_notify("RELOADING=1");
    on_hup_read(d, err, sizeof(err));
    osubd_notify("READY=1");
}

static void on_hup_read(struct daemon *d, char *err, size_t errlen)
{
    if (d->cfg.token_file[0] == '\0') {
        osubd_log(OSUBD_LOG_INFO, "SIGHUP: nothing to reload (no --token-file); other settings "
                                  "are read at start: restart oversubd to change them");
        return;
    }
    if (osubd_read_token(d->cfg.token_file, d->cfg.token, sizeof(d->cfg.token), err, errlen) != 0) {
        osubd_log(OSUBD_LOG_INFO, "SIGHUP: %s: the old token stays", err);
        return;
    }
    osubd_log(OSUBD_LOG_INFO,
              "SIGHUP: the admin token was read again from %s; other settings "
              "are read at start: restart oversubd to change them",
              d->cfg.token_file);
}

/* The pool: NVML's GPUs ("auto" when a driver answers, "nvml"), else simulated ("auto",
 * "sim:8x81920"). names and d->uuids are filled for NVML. */

/* The modules each keep their records in the state: made and registered before the core
 * loads them, in the order they hear of commands (routes, then the actuators). */
static int daemon_modules(struct daemon *d, char *err, size_t errlen)
{
    char e2[600];
    if (osubd_parse_destinations(d->cfg.allowed_destinations, &d->dest, e2, sizeof(e2)) != 0) {
        snprintf(err, errlen, "allowed_destinations: %s", e2);
        return -1;
    }
    d->routes = osubd_routes_new();
    if (d->routes == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    osubd_routes_allow(d->routes, d->dest);
    d->act = osubd_act_new(d->core, &d->gpus, d->dest, e2, sizeof(e2));
    if (d->act == NULL) {
        snprintf(err, errlen, "%.100s: %.300s", d->cfg.state_path, e2);
        return -1;
    }
    d->sus = osubd_sus_new(osubd_core_base(d->core), d->cfg.cuda_lib, osubd_act_sus_done, d->act);
    if (d->sus == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    osubd_act_set_suspender(d->act, d->sus);
    struct osubd_module mods[3] = {osubd_routes_module(d->routes), osubd_act_module(d->act)};
    size_t n = 2;
    if (d->cfg.device_plugin[0] != '\0') {
        d->dp = osubd_dp_new(d->core, d->act, &d->gpus, err, errlen);
        if (d->dp == NULL)
            return -1;
        mods[n++] = osubd_dp_module(d->dp);
    }
    for (size_t i = 0; i < n; i++)
        if (osubd_core_register(d->core, &mods[i]) != 0) {
            snprintf(err, errlen, "too many modules");
            return -1;
        }
    return 0;
}

/* The runners and the API, once the state is open: registered before the core loads. */
static int daemon_runners(struct daemon *d, char *err, size_t errlen)
{
    d->pods = osubd_pods_new(d->core, d->act, err, errlen);
    if (d->pods == NULL)
        return -1;
    if (d->cfg.gateway_host[0] != '\0') {
        d->gw = osubd_gateway_new(d->core, d->routes, &d->self, err, errlen);
        if (d->gw == NULL)
            return -1;
    }
    struct osubd_api_deps dep = {.act = d->act,
                                 .routes = d->routes,
                                 .gw = d->gw,
                                 .dp = d->dp,
                                 .gpus = &d->gpus,
                                 .dest = d->dest,
                                 .self = &d->self};
    d->api = osubd_api_new(d->core, &dep, err, errlen);
    if (d->api == NULL)
        return -1;
    struct osubd_module later[3] = {osubd_api_module(d->api), osubd_pods_module(d->pods)};
    size_t n = 2;
    if (d->gw != NULL)
        later[n++] = osubd_gateway_module(d->gw);
    for (size_t i = 0; i < n; i++)
        if (osubd_core_register(d->core, &later[i]) != 0) {
            snprintf(err, errlen, "too many modules");
            return -1;
        }
    return 0;
}

static int daemon_signals(struct daemon *d, char *err, size_t errlen)
{
    struct event_base *base = osubd_core_base(d->core);
    d->sigint_ev = evsignal_new(base, SIGINT, on_signal, d);
    d->sigterm_ev = evsignal_new(base, SIGTERM, on_signal, d);
    d->sighup_ev = evsignal_new(base, SIGHUP, on_hup, d);
    if (d->sigint_ev == NULL || d->sigterm_ev == NULL || d->sighup_ev == NULL ||
        event_add(d->sigint_ev, NULL) != 0 || event_add(d->sigterm_ev, NULL) != 0 ||
        event_add(d->sighup_ev, NULL) != 0) {
        snprintf(err, errlen, "cannot set up the event loop");
        return -1;
    }
    return 0;
}

/* Opens the state (the engine restored or made), loads the modules, checks the GPUs, starts
 * the writer, listens, starts the actuators and the device plugin. 0, or -1 with a sentence. */
static int daemon_start(struct daemon *d, char *err, size_t errlen)
{
    d->core = osubd_core_new(&d->cfg);
    d->mon = osubd_monitor_new(&d->cfg, &d->gpus);
    if (d->core == NULL || d->mon == NULL) {
        snprintf(err, errlen, "cannot create the event loop");
        return -1;
    }
    /* every module registers before the core loads them (core.h) */
    if (osubd_core_open(d->core, osubd_monitor_pool, d->mon, err, errlen) != 0 ||
        daemon_modules(d, err, errlen) != 0 || daemon_runners(d, err, errlen) != 0 ||
        osubd_core_load(d->core, err, errlen) != 0 ||
        osubd_monitor_start(d->mon, d->core, d->act, err, errlen) != 0 ||
        osubd_core_start(d->core, err, errlen) != 0 || osubd_api_listen(d->api, err, errlen) != 0)
        return -1;
    d->cfg.listen_port = osubd_api_port(d->api); /* port 0: the one the OS picked, which the
                                                  * services are told (OVERSUB_CONTROL_URL) */
    if (osubd_act_start(d->act, err, errlen) != 0 || daemon_signals(d, err, errlen) != 0)
        return -1;
    if (d->dp != NULL && osubd_dp_start(d->dp, err, errlen) != 0)
        return -1;
    return 0;
}

static void daemon_stop(struct daemon *d)
{
    osubd_dp_stop(d->dp);
    d->dp = NULL;
    if (d->core != NULL)
        osubd_core_stop(d->core); /* what was handed over is durable, its replies sent */
    osubd_gateway_free(d->gw);
    osubd_act_free(d->act);
    osubd_sus_free(d->sus); /* after the actuators: nothing is started any more */
    osubd_pods_free(d->pods);
    osubd_destinations_free(d->dest);
    osubd_routes_free(d->routes);
    struct event *evs[] = {d->sigint_ev, d->sigterm_ev, d->sighup_ev, d->drain_ev};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i] != NULL)
            event_free(evs[i]);
    osubd_monitor_free(d->mon);
    osubd_api_free(d->api);
    osubd_core_free(d->core); /* a last snapshot; the lock goes */
}

/* The flags (after the configuration file: they override it). -1 to go on, else the exit
 * code (--help, --version, a bad flag). */
static int parse_flags(int argc, char **argv, struct osubd_config *c, char *token_file, size_t tlen)
{
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"listen", required_argument, NULL, 'l'},
                                         {"socket", required_argument, NULL, 's'},
                                         {"state", required_argument, NULL, 'S'},
                                         {"gpus", required_argument, NULL, 'g'},
                                         {"ratio", required_argument, NULL, 'r'},
                                         {"token-file", required_argument, NULL, 't'},
                                         {"tick-ms", required_argument, NULL, 'T'},
                                         {"nvml-lib", required_argument, NULL, 'N'},
                                         {"gateway", required_argument, NULL, 'G'},
                                         {"new-state", no_argument, NULL, 'n'},
                                         {"allow-root-services", no_argument, NULL, 'A'},
                                         {"help", no_argument, NULL, 'h'},
                                         {"version", no_argument, NULL, 'v'},
                                         {"device-plugin", required_argument, NULL, 'D'},
                                         {"kube-api", required_argument, NULL, 'K'},
                                         {"log-level", required_argument, NULL, 'L'},
                                         {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            break;
        case 'l':
            if (parse_listen(optarg, c) != 0) {
                osubd_log(OSUBD_LOG_ERROR, "--listen: '%s' is not HOST:PORT", optarg);
                return 2;
            }
            break;
        case 's':
            snprintf(c->socket_path, sizeof(c->socket_path), "%s", optarg);
            c->socket_set = true;
            break;
        case 'S':
            snprintf(c->state_path, sizeof(c->state_path), "%s", optarg);
            break;
        case 'g':
            snprintf(c->gpus, sizeof(c->gpus), "%s", optarg);
            break;
        case 'r':
            if (osub_parse_ratio(optarg, &c->ratio_milli) != 0) {
                osubd_log(OSUBD_LOG_ERROR,
                          "--ratio: '%s' is not a ratio such as 1.3 (at most "
                          "three decimals, 1.0 to 100)",
                          optarg);
                return 2;
            }
            break;
        case 't':
            snprintf(token_file, tlen, "%s", optarg);
            break;
        case 'G':
            if (parse_gateway(optarg, c) != 0) {
                osubd_log(OSUBD_LOG_ERROR, "--gateway: '%s' is not HOST:PORT (or \"\" for none)",
                          optarg);
                return 2;
            }
            break;
        case 'D':
            if (optarg[0] != '\0' && optarg[0] != '/') {
                osubd_log(OSUBD_LOG_ERROR,
                          "--device-plugin: '%s' is not an absolute path (or \"\" for "
                          "none)",
                          optarg);
                return 2;
            }
            snprintf(c->device_plugin, sizeof(c->device_plugin), "%s", optarg);
            break;
        case 'K':
            if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "none") != 0 &&
                strncmp(optarg, "https://", 8) != 0 && strncmp(optarg, "http://", 7) != 0) {
                osubd_log(OSUBD_LOG_ERROR,
                          "--kube-api: '%s' is not auto, none or an https:// "
                          "URL",
                          optarg);
                return 2;
            }
            snprintf(c->kube_api, sizeof(c->kube_api), "%s", optarg);
            break;
        case 'n':
            c->new_state = true;
            break;
        case 'A':
            c->allow_root_services = true;
            break;
        case 'N':
            snprintf(c->nvml_lib, sizeof(c->nvml_lib), "%s", optarg);
            break;
        case 'T': {
            char *end;
            long t = strtol(optarg, &end, 10);
            if (*end != '\0' || t < 10 || t > 60000) {
                osubd_log(OSUBD_LOG_ERROR, "--tick-ms: 10 to 60000");
                return 2;
            }
            c->tick_ms = t;
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        case 'L':
            if (osubd_log_parse_level(optarg) < 0) {
                osubd_log(OSUBD_LOG_ERROR, "--log-level: '%s' is not debug, info, warn or error",
                          optarg);
                return 2;
            }
            osubd_log_set_level(osubd_log_parse_level(optarg));
            break;
        case 'v':
            printf("oversubd %s\n", OSUB_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        osubd_log(OSUBD_LOG_ERROR, "unexpected argument '%s'", argv[optind]);
        return 2;
    }
    return -1;
}

/* The settings checked before anything is touched: 0, or 2 with the reason said. */
static int check_settings(struct osubd_config *c)
{
    /* the pool, checked before anything is touched: auto, nvml, or sim:POOL */
    if (strcmp(c->gpus, "auto") != 0 && strcmp(c->gpus, "nvml") != 0) {
        static int64_t pv[OSUB_POOL_GPUS_MAX];
        size_t pn = 0;
        if (strncmp(c->gpus, "sim:", 4) != 0 ||
            osub_parse_pool(c->gpus + 4, pv, OSUB_POOL_GPUS_MAX, &pn) != 0) {
            osubd_log(OSUBD_LOG_ERROR,
                      "--gpus: '%s' is not auto, nvml or sim:POOL (sim:8x81920, "
                      "sim:4x81920,4x40960; at most %d GPUs)",
                      c->gpus, OSUB_POOL_GPUS_MAX);
            return 2;
        }
    }
    if (!loopback(c->listen_host) && c->token[0] == '\0') {
        osubd_log(OSUBD_LOG_ERROR,
                  "refusing to listen on %s without an admin token: give --token-file "
                  "(or listen on 127.0.0.1)",
                  c->listen_host);
        return 2;
    }
    char aerr[600];
    if (osubd_act_check_config(c, aerr, sizeof(aerr)) != 0) {
        osubd_log(OSUBD_LOG_ERROR, "%s", aerr);
        return 2;
    }
    /* the engine's settings, checked before the state is touched (a trial engine of one GPU) */
    {
        const osub_pool_config_t *ec = &c->engine;
        if (ec->low_watermark_pct > ec->high_watermark_pct) {
            osubd_log(OSUBD_LOG_ERROR,
                      "low_watermark_pct (%d) must not be above high_watermark_pct (%d)",
                      (int)ec->low_watermark_pct, (int)ec->high_watermark_pct);
            return 2;
        }
        int64_t one = 81920;
        osub_engine_t *trial = NULL;
        int trc = osub_engine_new(ec, &one, NULL, 1, NULL, 0, &trial);
        osub_engine_free(trial);
        if (trc != 0) {
            osubd_log(OSUBD_LOG_ERROR, "the engine settings of the configuration: %s",
                      osub_strerror(trc));
            return 2;
        }
    }
    if (!c->socket_set) {
        /* the socket belongs beside the state it serves, named after it: var/oversub.sock for
         * var/oversub.db (two states in one folder get two sockets) */
        size_t sl = strlen(c->state_path);
        if (sl > 3 && strcmp(c->state_path + sl - 3, ".db") == 0)
            sl -= 3;
        snprintf(c->socket_path, sizeof(c->socket_path), "%.*s.sock", (int)sl, c->state_path);
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct daemon d;
    memset(&d, 0, sizeof(d));
    osubd_json_init();
    osubd_config_default(&d.cfg);
    /* the configuration file first, so that flags override it */
    char token_file[512] = "";
    for (int i = 1; i < argc; i++) {
        const char *cf = NULL;
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            cf = argv[i + 1];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            cf = argv[i] + 9;
        if (cf != NULL && read_config(cf, &d.cfg, token_file, sizeof(token_file)) != 0)
            return 2;
    }
    int rc = parse_flags(argc, argv, &d.cfg, token_file, sizeof(token_file));
    if (rc >= 0)
        return rc;
    snprintf(d.cfg.token_file, sizeof(d.cfg.token_file), "%s", token_file);
    if (token_file[0] && read_token(token_file, &d.cfg) != 0)
        return 2;
    if (check_settings(&d.cfg) != 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    char err[700];
    if (daemon_start(&d, err, sizeof(err)) != 0) {
        osubd_log(OSUBD_LOG_ERROR, "%s", err);
        daemon_stop(&d);
        return 1;
    }
    char status[300];
    snprintf(status, sizeof(status), "READY=1\nMAINPID=%d\nSTATUS=serving on %s:%d", (int)getpid(),
             d.cfg.listen_host, osubd_api_port(d.api));
    osubd_notify(status);
    event_base_dispatch(osubd_core_base(d.core));
    osubd_notify("STOPPING=1");
    bool fatal = osubd_core_fatal(d.core);
    daemon_stop(&d);
    return fatal ? 1 : 0;
}
