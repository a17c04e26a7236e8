/* api_handlers.c - the API's handlers: the pool, services (submit, commands, backends), GPUs */
#define _GNU_SOURCE
#include "api_int.h"

/* ---- handlers ------------------------------------------------------------------------ */

void osubd__api_h_pool(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m)
{
    if (m == EVHTTP_REQ_GET) {
        /* the pool changes only by commands: its text is kept until the next one */
        if (d->pool_text == NULL || d->pool_text_version != osubd_core_version(d->core)) {
            free(d->pool_text);
            json_t *p = osubd__api_pool_json(d);
            d->pool_text = p ? osubd_json_dumps(p, JSON_COMPACT) : NULL;
            json_decref(p);
            d->pool_text_len = d->pool_text ? strlen(d->pool_text) : 0;
            d->pool_text_version = osubd_core_version(d->core);
        }
        struct evbuffer *b = d->pool_text ? evbuffer_new() : NULL;
        if (b == NULL || evbuffer_add(b, d->pool_text, d->pool_text_len) != 0 ||
            evbuffer_add(b, "\n", 1) != 0) {
            if (b != NULL)
                evbuffer_free(b);
            if (d->pool_text == NULL)
                d->pool_text_version =
                    osubd_core_version(d->core) - 1; /* not kept: made again next time */
            osubd__api_reply_oom(d, req);
            return;
        }
        osubd__api_reply_buf(d, req, 200, b);
        return;
    }
    if (m != EVHTTP_REQ_PUT) {
        osubd__api_reply_error(d, req, 405, "method_not_allowed", "GET or PUT /v1/pool");
        return;
    }
    json_t *j = osubd__api_read_body(d, req, false);
    if (j == NULL)
        return;
    static const char *const allowed[] = {"ratio", NULL};
    if (!osubd__api_only_fields(d, req, j, allowed)) {
        json_decref(j);
        return;
    }
    json_t *r = json_object_get(j, "ratio");
    char text[64];
    if (json_is_string(r) && json_string_length(r) >= sizeof(text)) {
        json_decref(j);
        osubd__api_reply_error(d, req, 422, "invalid_ratio",
                               "field 'ratio' is too long to be a ratio");
        return;
    } else if (json_is_string(r))
        snprintf(text, sizeof(text), "%s", json_string_value(r));
    else if (json_is_number(r))
        snprintf(text, sizeof(text), "%.9f", json_number_value(r));
    else {
        json_decref(j);
        osubd__api_reply_error(d, req, 422, "invalid_ratio",
                               "field 'ratio' is required: a number or a string");
        return;
    }
    /* a JSON number carries binary noise: trim the zeros %.9f adds */
    size_t tl = strlen(text);
    while (strchr(text, '.') && tl > 0 && text[tl - 1] == '0')
        text[--tl] = '\0';
    int32_t milli;
    int rc = osub_parse_ratio(text, &milli);
    json_decref(j);
    if (rc != 0) {
        osubd__api_reply_error(d, req, 422, osub_errcode(rc), osub_strerror(rc));
        return;
    }
    json_t *cmd = json_pack("{s:s, s:i}", "op", "ratio", "ratio_milli", milli);
    char err[256];
    rc = osubd_apply(d->core, cmd, NULL, err, sizeof(err));
    json_decref(cmd);
    if (rc != 0) {
        osubd__api_reply_rc(d, req, rc);
        return;
    }
    osubd__api_reply_json(d, req, 200, osubd__api_pool_json(d));
}

/* What a submit staged for the modules: kept when the engine accepts the service, saved with
 * the command; dropped otherwise. */
struct submit_stage {
    struct osubd_api *d;
    const char *id;
    struct osubd_route *route; /* taken when kept */
    json_t *exec;
    bool route_conflict; /* a retry with other gateway settings or another way to run */
    bool stored;
    bool dry;
};

static void submit_commit(void *arg, int rc, const osub_submit_result_t *r)
{
    struct submit_stage *st = arg;
    struct osubd_api *d = st->d;
    if (rc == 0 && r->outcome == OSUB_SUBMIT_EXISTS) {
        /* a retry of a live service: the same spec, the same gateway settings (PUT
         * .../backends changes backends) and the same way to run it (or none given) */
        st->route_conflict = !osubd_route_equal(st->route, osubd_routes_get(d->routes, st->id)) ||
                             (st->exec != NULL && !osubd_act_exec_equal(d->act, st->id, st->exec));
        return;
    }
    if (rc != 0 || st->dry ||
        (r->outcome != OSUB_SUBMIT_STARTED && r->outcome != OSUB_SUBMIT_PENDING &&
         r->outcome != OSUB_SUBMIT_QUEUED))
        return;
    st->stored = osubd_routes_set(d->routes, st->id, st->route) == 0;
    st->route = NULL;
    if (st->exec != NULL)
        st->stored = osubd_act_commit_exec(d->act, st->id, st->exec) == 0 && st->stored;
    if (!st->stored)
        osubd_fatal(d->core, "out of memory keeping a service's gateway or run settings");
}

/* A route whose backend is oversubd's own API or gateway: the gateway never forwards there,
 * whatever allowed_destinations says (else a service's backends are a way around the token).
 * 0, or -1 with a sentence in err. */
static int route_not_self(struct osubd_api *d, const struct osubd_route *r, char *err,
                          size_t errlen)
{
    const char *mw =
        r != NULL && r->metrics_url[0] ? osubd_self_url(d->self, r->metrics_url) : NULL;
    if (mw != NULL) {
        snprintf(err, errlen, "metrics_url %.200s is oversubd's own %s, not the engine's",
                 r->metrics_url, mw);
        return -1;
    }
    for (int32_t i = 0; r != NULL && i < r->n_backends; i++) {
        const char *w = osubd_self_url(d->self, r->backends[i]);
        if (w != NULL) {
            snprintf(err, errlen,
                     "backends[%d] %.200s is oversubd's own %s: the gateway never forwards to "
                     "oversubd",
                     (int)i, r->backends[i], w);
            return -1;
        }
    }
    return 0;
}

/* A webhook or a suspend endpoint at oversubd's own API or gateway would have oversubd call
 * itself (a loop, or a service's directive answered by the daemon): refused, as backends are. */
static int urls_not_self(struct osubd_api *d, const json_t *spec, char *err, size_t errlen)
{
    static const char *const names[] = {"control_url", "suspend.url"};
    const char *urls[] = {
        json_string_value(json_object_get(spec, "control_url")),
        json_string_value(json_object_get(json_object_get(spec, "suspend"), "url"))};
    for (size_t i = 0; i < 2; i++) {
        const char *w = urls[i] != NULL ? osubd_self_url(d->self, urls[i]) : NULL;
        if (w != NULL) {
            snprintf(err, errlen, "%s %.200s is oversubd's own %s: oversubd never calls itself",
                     names[i], urls[i], w);
            return -1;
        }
    }
    return 0;
}

/* idle_suspend_ms suspends the service: it must say how (its "suspend"). */
static int idle_needs_suspend(const json_t *spec, const struct osubd_route *route, char *err,
                              size_t errlen)
{
    if (route == NULL || route->idle_suspend_ms == 0 || json_object_get(spec, "suspend") != NULL)
        return 0;
    snprintf(err, errlen,
             "field 'idle_suspend_ms' needs 'suspend' (how the service is suspended: "
             "{\"method\": \"cuda\"}, {\"method\": \"vllm\", \"url\": ...})");
    return -1;
}

static void h_services_post(struct osubd_api *d, const struct osubd_caller *who,
                            struct evhttp_request *req, bool dry)
{
    json_t *spec = osubd__api_read_body(d, req, false);
    if (spec == NULL)
        return;
    osub_spec_t sp;
    char err[300];
    /* what the gateway and the actuators keep of the service is staged here and kept only if
     * the engine accepts the submit: a refused submit changes nothing anywhere */
    struct osubd_route *route = NULL;
    if (osubd_route_take(spec, false, d->dest, &route, err, sizeof(err)) != 0 ||
        route_not_self(d, route, err, sizeof(err)) != 0 ||
        urls_not_self(d, spec, err, sizeof(err)) != 0 ||
        idle_needs_suspend(spec, route, err, sizeof(err)) != 0) {
        json_decref(spec);
        free(route);
        osubd__api_reply_error(d, req, 422, "invalid_spec", err);
        return;
    }
    /* running a program is for the Unix socket, or for the admin token (with a token set,
     * every submit over TCP carries it) */
    json_t *exec = NULL;
    int trc = osubd_act_take(d->act, spec, who->trusted || d->cfg->token[0] != '\0',
                             osubd_dp_cut_mib(d->dp), &exec, err, sizeof(err));
    if (trc != 0) {
        json_decref(spec);
        free(route);
        bool forbidden = trc == OSUBD_ACT_FORBIDDEN;
        osubd__api_reply_error(d, req, forbidden ? 403 : 422,
                               forbidden ? "forbidden" : "invalid_spec", err);
        return;
    }
    int src = osub_spec_from_json(spec, &sp, err, sizeof(err));
    if (src != 0) {
        json_decref(spec);
        free(route);
        json_decref(exec);
        osubd__api_reply_error(d, req, src == OSUB_SPEC_UNKNOWN_FIELD ? 400 : 422, "invalid_spec",
                               err);
        return;
    }
    json_t *cmd = json_pack("{s:s, s:O, s:b}", "op", "submit", "spec", spec, "dry_run", dry);
    json_decref(spec);
    osub_submit_result_t r;
    memset(&r, 0, sizeof(r));
    struct submit_stage st = {.d = d, .id = sp.id, .route = route, .exec = exec, .dry = dry};
    int rc = cmd != NULL ? osubd_apply_with(d->core, cmd, &r, err, sizeof(err), submit_commit, &st)
                         : OSUB_ENOMEM;
    json_decref(cmd);
    if (dry && err[0] == '\0')
        submit_commit(&st, rc, &r); /* a dry run keeps nothing, but answers the same */
    free(st.route);
    json_decref(exec);
    if (st.route_conflict) {
        osubd__api_reply_error(
            d, req, 409, osub_errcode(OSUB_ESPEC_CONFLICT),
            "a service with this id runs with other gateway settings or another "
            "command; change its backends with PUT /v1/services/ID/backends, or release "
            "it first");
        return;
    }
    if (err[0]) {
        osubd__api_reply_error(d, req, 422, "invalid_spec", err);
        return;
    }
    static const char *const outcomes[] = {"started", "pending", "queued", "exists", "rejected"};
    json_t *dec = json_pack("{s:s}", "outcome", outcomes[r.outcome]);
    if (r.outcome == OSUB_SUBMIT_REJECTED || r.outcome == OSUB_SUBMIT_QUEUED) {
        json_object_set_new(dec, "check", json_string(osub_check_name(r.check)));
        if (r.check_gpu >= 0)
            json_object_set_new(dec, "gpu", json_integer(r.check_gpu));
        /* the shortfall in the check's own unit */
        const char *unit = r.check == OSUB_CHECK_COMPUTE     ? "shortfall_pct"
                           : r.check == OSUB_CHECK_EXCLUSIVE ? "shortfall_services"
                           : r.check == OSUB_CHECK_GPUS      ? "shortfall_gpus"
                                                             : "shortfall_mib";
        if (r.check != OSUB_CHECK_NONE) /* none: a plan, but the queue's head comes first */
            json_object_set_new(dec, unit, json_integer(r.shortfall_mib));
    }
    if (r.n_victims > 0) {
        json_t *v = json_array();
        for (int32_t i = 0; i < r.n_victims; i++) {
            json_t *o =
                json_pack("{s:s, s:s, s:I}", "service", r.victims[i].service, "action",
                          r.victims[i].evict     ? "evict"
                          : r.victims[i].suspend ? "suspend"
                                                 : "degrade",
                          "deadline_unix_ms",
                          (json_int_t)osubd_engine_to_unix(d->core, r.victims[i].deadline_ms));
            /* who it is, for a scheduler ranking nodes by what they would disturb: its class,
             * its level, what a restart costs it, and the pod it is (if one) */
            osub_service_info_t vi;
            if (o != NULL && osub_engine_service_info(d->e, r.victims[i].service, &vi) == 0) {
                json_object_set_new(o, "class", json_string(vi.spec->class_name));
                json_object_set_new(o, "level", json_integer(vi.level));
                json_object_set_new(o, "restart_cost_ms", json_integer(vi.spec->restart_cost_ms));
                const char *uid =
                    json_string_value(json_object_get(osubd_act_kube(d->act, vi.spec->id), "uid"));
                if (uid != NULL)
                    json_object_set_new(o, "pod_uid", json_string(uid));
            }
            json_array_append_new(v, o);
        }
        json_object_set_new(dec, "victims", v);
    }
    if (r.queue_position > 0)
        json_object_set_new(dec, "queue_position", json_integer(r.queue_position));
    if (r.n_gpus > 0) { /* where it starts (or waits for its victims) */
        json_t *g = json_array();
        for (int32_t i = 0; i < r.n_gpus; i++)
            json_array_append_new(g, json_integer(r.gpus[i]));
        json_object_set_new(dec, "gpus", g);
        /* a dry run: how full its first GPU is now, for a scheduler scoring the placement */
        osub_gpu_info_t gi;
        if (dry && osub_engine_gpu_info(d->e, r.gpus[0], &gi) == 0)
            json_object_set_new(
                dec, "gpu_now",
                json_pack("{s:I, s:I, s:I, s:I}", "held_mib", (json_int_t)gi.held_mib,
                          "granted_mib", (json_int_t)gi.granted_mib, "usable_mib",
                          (json_int_t)gi.usable_mib, "logical_mib", (json_int_t)gi.logical_mib));
    }
    if (rc != 0 && r.outcome == OSUB_SUBMIT_REJECTED) {
        json_object_set_new(dec, "code", json_string(osub_errcode(rc)));
        json_object_set_new(dec, "message", json_string(osub_strerror(rc)));
        osubd__api_reply_json(d, req, 409,
                              json_pack("{s:{s:s, s:s}, s:o}", "error", "code", osub_errcode(rc),
                                        "message", osub_strerror(rc), "decision", dec));
        return;
    }
    if (rc != 0) {
        json_decref(dec);
        osubd__api_reply_rc(d, req, rc);
        return;
    }
    json_t *body = dry ? json_object() : osubd__api_service_json(d, who, sp.id);
    if (body == NULL)
        body = json_object();
    json_object_set_new(body, "decision", dec);
    if (!dry) {
        /* for the service's own calls: usage, ready, ack, exited */
        char tok[65];
        osubd_service_token(d->core, sp.id, tok);
        json_object_set_new(body, "token", json_string(tok));
    }
    int code = r.outcome == OSUB_SUBMIT_STARTED ? 201 : r.outcome == OSUB_SUBMIT_EXISTS ? 200 : 202;
    if (dry)
        code = 200;
    osubd__api_reply_json(d, req, code, body);
}

/* A ready's PID: kept when the engine accepted the command (saved with it). */
struct pid_stage {
    struct osubd_api *d;
    const char *id;
    pid_t pid;
    bool stored;
};

static void pid_commit(void *arg, int rc, const osub_submit_result_t *r)
{
    (void)r;
    struct pid_stage *st = arg;
    struct osubd_api *d = st->d;
    if (rc == 0 && st->pid > 0 &&
        osub_engine_service_info(d->e, st->id, &(osub_service_info_t){0}) == 0 &&
        osubd_act_set_pid(d->act, st->id, st->pid) != 0) {
        st->stored = false;
        osubd_fatal(d->core, "out of memory keeping a service's PID");
    }
}

/* An operator's suspend or resume refused: the sentence names the service's state and what it
 * needs (true: replied). */
static bool suspend_refusal(struct osubd_api *d, struct evhttp_request *req, const char *id,
                            const char *op, int rc)
{
    bool sus = strcmp(op, "suspend") == 0;
    osub_service_info_t si;
    char msg[400];
    if (strcmp(op, "resize") == 0 && rc == OSUB_EBAD_STATE &&
        osub_engine_service_info(d->e, id, &si) == 0 &&
        (si.state == OSUB_STATE_SUSPENDING || si.state == OSUB_STATE_SUSPENDED ||
         si.state == OSUB_STATE_RESUMING)) {
        snprintf(msg, sizeof(msg),
                 "%s is %s: a suspended service keeps the grant it left with; resize it once it "
                 "has resumed",
                 id, osub_state_name(si.state));
        osubd__api_reply_error(d, req, 409, osub_errcode(rc), msg);
        return true;
    }
    if ((!sus && strcmp(op, "resume") != 0) || osub_engine_service_info(d->e, id, &si) != 0)
        return false;
    size_t nc;
    const osub_class_t *cls = osub_engine_classes(d->e, &nc);
    bool backed = si.spec->preemptible == OSUB_TRI_NO;
    for (size_t c = 0; c < nc && si.spec->preemptible == OSUB_TRI_DEFAULT; c++)
        backed = backed || (strcmp(cls[c].name, si.spec->class_name) == 0 && !cls[c].preemptible);
    if (rc == OSUB_ENOT_SUSPENDABLE && backed)
        snprintf(msg, sizeof(msg),
                 "%s is %s: a backed service is never suspended (nor degraded or evicted)", id,
                 si.spec->class_name);
    else if (rc == OSUB_EBAD_STATE && sus && si.state == OSUB_STATE_DEGRADED && si.ack_pending)
        snprintf(msg, sizeof(msg),
                 "%s is degraded and has not acknowledged its degrade yet: it can be suspended "
                 "once it has (its usage at or under its degraded grant, or POST .../ack)",
                 id);
    else if (rc == OSUB_EBAD_STATE && sus)
        snprintf(msg, sizeof(msg),
                 "%s is %s: only a running or degraded service (its degrade acknowledged) can be "
                 "suspended",
                 id, osub_state_name(si.state));
    else if (rc == OSUB_EBAD_STATE)
        snprintf(msg, sizeof(msg),
                 "%s is %s: only a suspending or suspended service can be resumed", id,
                 osub_state_name(si.state));
    else
        return false;
    osubd__api_reply_error(d, req, rc == OSUB_EBAD_STATE ? 409 : 422, osub_errcode(rc), msg);
    return true;
}

static void h_service_cmd(struct osubd_api *d, const struct osubd_caller *who,
                          struct evhttp_request *req, const char *id, const char *op)
{
    json_t *j = osubd__api_read_body(d, req, true);
    if (j == NULL)
        return;
    static const char *const f_usage[] = {"vram_mib", "gpus", "compute_pct", NULL};
    static const char *const f_ck[] = {"checkpoint", NULL};
    static const char *const f_none[] = {NULL};
    static const char *const f_resize[] = {"vram_mib", "min_vram_mib", "batch_size", NULL};
    static const char *const f_ready[] = {"pid", NULL};
    const char *const *allowed = strcmp(op, "usage") == 0     ? f_usage
                                 : strcmp(op, "resize") == 0  ? f_resize
                                 : strcmp(op, "ready") == 0   ? f_ready
                                 : strcmp(op, "release") == 0 ? f_none
                                 : strcmp(op, "suspend") == 0 ? f_none
                                 : strcmp(op, "resume") == 0  ? f_none
                                                              : f_ck;
    if (!osubd__api_only_fields(d, req, j, allowed)) {
        json_decref(j);
        return;
    }
    /* ready may name the service's process: NVML's memory for that PID becomes its usage */
    json_t *pidv = json_object_get(j, "pid");
    pid_t pid = 0; /* staged: kept only when the engine accepts the command */
    if (pidv != NULL) {
        if (!json_is_integer(pidv) || json_integer_value(pidv) < 1 ||
            json_integer_value(pidv) > 4194304) {
            json_decref(j);
            osubd__api_reply_error(d, req, 422, "invalid_argument",
                                   "\"pid\" must be a process id (1 to 4194304)");
            return;
        }
        pid = (pid_t)json_integer_value(pidv);
        json_object_del(j, "pid");
    }
    /* an operator's checkpoint of a service with no process to checkpoint would only fail and
     * evict it: refused up front */
    pid_t some[1];
    if (strcmp(op, "suspend") == 0 && osubd_act_sus_is_cuda(d->act, id) &&
        osubd_act_service_pids(d->act, id, some, 1) == 0) {
        json_decref(j);
        osubd__api_reply_error(
            d, req, 409, "bad_state",
            "no process of this service is known to checkpoint (method cuda): a managed "
            "service's is; an external one tells its PID with POST .../ready {\"pid\": N}");
        return;
    }
    json_t *ck = json_object_get(j, "checkpoint");
    if (ck != NULL &&
        (!json_is_string(ck) || json_string_length(ck) == 0 || json_string_length(ck) > 1024 ||
         strlen(json_string_value(ck)) != json_string_length(ck))) {
        json_decref(j);
        osubd__api_reply_error(
            d, req, 422, "invalid_argument",
            "\"checkpoint\" must be a non-empty string (a path or a name, at most 1024 "
            "bytes, no NUL)");
        return;
    }
    /* the per-GPU form takes objects {gpu, vram_mib}: turn it into the command's list */
    json_t *gpus = json_object_get(j, "gpus");
    if (json_is_array(gpus) && strcmp(op, "usage") == 0) {
        size_t gi;
        json_t *g;
        json_array_foreach(gpus, gi, g)
        {
            if (!json_is_object(g) || !json_is_integer(json_object_get(g, "gpu")) ||
                !json_is_integer(json_object_get(g, "vram_mib")) || json_object_size(g) != 2) {
                json_decref(j);
                osubd__api_reply_error(
                    d, req, 422, "invalid_usage",
                    "each item of \"gpus\" must be {\"gpu\": INDEX, \"vram_mib\": "
                    "MIB} with integers and nothing else");
                return;
            }
        }
        osub_service_info_t si;
        if (osub_engine_service_info(d->e, id, &si) != 0) {
            json_decref(j);
            osubd__api_reply_rc(d, req, OSUB_EUNKNOWN_SERVICE);
            return;
        }
        json_t *list = json_array();
        for (int32_t s = 0; s < si.n_slots; s++) {
            json_int_t v = -1;
            size_t i;
            json_t *it;
            json_array_foreach(gpus, i, it)
            {
                if (json_integer_value(json_object_get(it, "gpu")) == si.slots[s].gpu &&
                    json_is_integer(json_object_get(it, "vram_mib")))
                    v = json_integer_value(json_object_get(it, "vram_mib"));
            }
            if (v < 0) {
                json_decref(list);
                json_decref(j);
                osubd__api_reply_error(
                    d, req, 422, "invalid_usage",
                    "\"gpus\" must give {\"gpu\", \"vram_mib\"} for each of the service's "
                    "GPUs");
                return;
            }
            json_array_append_new(list, json_integer(v));
        }
        json_object_set_new(j, "gpus", list);
    }
    json_object_set_new(j, "op", json_string(op));
    json_object_set_new(j, "id", json_string(id));
    /* under NVML, a released service's process may still hold its memory (draining, or an
     * external one oversubd cannot watch): counted as system memory until the next poll says
     * what is left, so nothing is started or restored into it */
    if (strcmp(op, "release") == 0 && strcmp(osubd_core_pool(d->core), "nvml") == 0)
        json_object_set_new(j, "measured", json_true());
    char err[256];
    struct pid_stage st = {.d = d, .id = id, .pid = pid, .stored = true};
    int rc = osubd_apply_with(d->core, j, NULL, err, sizeof(err), pid_commit, &st);
    json_decref(j);
    if (!st.stored) {
        osubd__api_reply_error(d, req, 500, "out_of_memory",
                               "out of memory keeping the service's PID");
        return;
    }
    if (err[0]) {
        osubd__api_reply_error(d, req, 422, "invalid_argument", err);
        return;
    }
    osub_pool_config_t cfg;
    osub_engine_config(d->e, &cfg);
    if (rc == OSUB_EHOST_FULL && cfg.suspend_host_mib == 0) {
        osubd__api_reply_error(d, req, 409, osub_errcode(rc),
                               "suspend is off on this pool: its suspend_host_mib is 0 (the host "
                               "memory suspended services may fill: set it in oversubd's "
                               "configuration when the state is made; a state keeps the "
                               "engine's settings it was made with)");
        return;
    }
    if (rc != 0 && suspend_refusal(d, req, id, op, rc))
        return;
    if (rc != 0) {
        osubd__api_reply_rc(d, req, rc);
        return;
    }
    json_t *body = osubd__api_service_json(d, who, id);
    if (body == NULL)
        body = json_pack("{s:s, s:s}", "id", id, "state", "released");
    osubd__api_reply_json(d, req, 200, body);
}

/* PUT /v1/services/{id}/backends {"backends": [...]}: a service (a managed one once it
 * listens) registers where the gateway reaches it; the route's other settings stay. */
static void h_backends(struct osubd_api *d, const struct osubd_caller *who,
                       struct evhttp_request *req, const char *id)
{
    json_t *j = osubd__api_read_body(d, req, false);
    if (j == NULL)
        return;
    static const char *const allowed[] = {"backends", NULL};
    if (!osubd__api_only_fields(d, req, j, allowed)) {
        json_decref(j);
        return;
    }
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0) {
        json_decref(j);
        osubd__api_reply_rc(d, req, osub_id_valid(id) ? OSUB_EUNKNOWN_SERVICE : OSUB_EBAD_ID);
        return;
    }
    struct osubd_route *route = NULL;
    char err[300];
    if (json_object_get(j, "backends") == NULL) {
        json_decref(j);
        osubd__api_reply_error(d, req, 422, "invalid_backends", "field 'backends' is required");
        return;
    }
    if (osubd_route_take(j, true, d->dest, &route, err, sizeof(err)) != 0 ||
        route_not_self(d, route, err, sizeof(err)) != 0) {
        json_decref(j);
        free(route);
        osubd__api_reply_error(d, req, 422, "invalid_backends", err);
        return;
    }
    json_decref(j);
    int src = osubd_routes_set_backends(d->routes, id, route);
    json_t *list = json_array();
    for (int32_t i = 0; i < route->n_backends; i++)
        json_array_append_new(list, json_string(route->backends[i]));
    free(route);
    if (src != 0) {
        json_decref(list);
        osubd__api_reply_error(d, req, 500, "out_of_memory", "out of memory keeping the backends");
        return;
    }
    osubd_core_touch(d->core); /* the gateway's view of the service is stale */
    char *text = osubd_json_dumps(list, JSON_COMPACT);
    json_decref(list);
    osubd_note(d->core, id, "gateway", "backends", "%s registered its backends for the gateway: %s",
               id, text ? text : "?");
    free(text);
    json_t *body = osubd__api_service_json(d, who, id);
    osubd__api_reply_json(d, req, 200, body ? body : json_object());
}

void osubd__api_h_services(struct osubd_api *d, const struct osubd_caller *who,
                           struct evhttp_request *req, enum evhttp_cmd_type m, const char *rest,
                           const char *query)
{
    if (*rest == '\0') {
        if (m == EVHTTP_REQ_GET) {
            /* one service at a time into the buffer: 10,000 services never exist as one
             * JSON tree */
            struct evbuffer *b = evbuffer_new();
            bool ok = b != NULL && evbuffer_add_printf(b, "{\"services\":[") > 0;
            for (size_t i = 0; ok && i < osub_engine_service_count(d->e); i++) {
                json_t *o = osubd__api_service_json(d, who, osub_engine_service_id(d->e, i));
                char *text = o ? osubd_json_dumps(o, JSON_COMPACT) : NULL;
                json_decref(o);
                ok = text != NULL && (i == 0 || evbuffer_add(b, ",", 1) == 0) &&
                     evbuffer_add(b, text, strlen(text)) == 0;
                free(text);
            }
            ok = ok && evbuffer_add_printf(b, "]}\n") > 0;
            if (!ok) {
                if (b != NULL)
                    evbuffer_free(b);
                osubd__api_reply_oom(d, req);
                return;
            }
            osubd__api_reply_buf(d, req, 200, b);
        } else if (m == EVHTTP_REQ_POST) {
            /* ?dry_run=1|true|0|false, and nothing else */
            struct evkeyvalq q;
            TAILQ_INIT(&q);
            bool dry = false, ok = query == NULL || evhttp_parse_query_str(query, &q) == 0;
            struct evkeyval *kv;
            TAILQ_FOREACH(kv, &q, next)
            {
                if (strcmp(kv->key, "dry_run") != 0) {
                    ok = false;
                } else if (strcmp(kv->value, "1") == 0 || strcmp(kv->value, "true") == 0) {
                    dry = true;
                } else if (strcmp(kv->value, "0") != 0 && strcmp(kv->value, "false") != 0) {
                    ok = false;
                }
            }
            evhttp_clear_headers(&q);
            if (!ok) {
                osubd__api_reply_error(
                    d, req, 400, "bad_query",
                    "POST /v1/services takes one query parameter: dry_run=1 (or true, "
                    "0, false)");
                return;
            }
            h_services_post(d, who, req, dry);
        } else {
            osubd__api_reply_error(d, req, 405, "method_not_allowed", "GET or POST /v1/services");
        }
        return;
    }
    char id[OSUB_ID_MAX + 2];
    const char *slash = strchr(rest, '/');
    size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
    if (len == 0 || len > OSUB_ID_MAX) {
        osubd__api_reply_rc(d, req, OSUB_EBAD_ID);
        return;
    }
    memcpy(id, rest, len);
    id[len] = '\0';
    const char *action = slash ? slash + 1 : "";
    if (*action == '\0') {
        if (m == EVHTTP_REQ_GET) {
            json_t *s = osubd__api_service_json(d, who, id);
            if (s == NULL)
                osubd__api_reply_rc(d, req,
                                    osub_id_valid(id) ? OSUB_EUNKNOWN_SERVICE : OSUB_EBAD_ID);
            else
                osubd__api_reply_json(d, req, 200, s);
        } else if (m == EVHTTP_REQ_DELETE) {
            h_service_cmd(d, who, req, id, "release");
        } else if (m == EVHTTP_REQ_PATCH) {
            h_service_cmd(d, who, req, id, "resize");
        } else {
            osubd__api_reply_error(d, req, 405, "method_not_allowed",
                                   "GET, PATCH or DELETE a service");
        }
        return;
    }
    if (strcmp(action, "backends") == 0 && m == EVHTTP_REQ_PUT)
        h_backends(d, who, req, id);
    else if (strcmp(action, "directives") == 0 && m == EVHTTP_REQ_GET)
        osubd_act_directives(d->act, req, id, query);
    else if (strcmp(action, "usage") == 0 && m == EVHTTP_REQ_PUT)
        h_service_cmd(d, who, req, id, "usage");
    else if ((strcmp(action, "ready") == 0 || strcmp(action, "ack") == 0 ||
              strcmp(action, "exited") == 0 || strcmp(action, "suspend") == 0 ||
              strcmp(action, "resume") == 0) &&
             m == EVHTTP_REQ_POST)
        h_service_cmd(d, who, req, id, action);
    else
        osubd__api_reply_error(d, req, 404, "not_found", "no such endpoint");
}

void osubd__api_h_gpu(struct osubd_api *d, struct evhttp_request *req, enum evhttp_cmd_type m,
                      const char *rest)
{
    char *end;
    errno = 0;
    long gpu = strtol(rest, &end, 10);
    if (end == rest || *end != '/' || m != EVHTTP_REQ_POST || rest[0] < '0' || rest[0] > '9') {
        osubd__api_reply_error(d, req, 404, "not_found",
                               "POST /v1/gpus/{index}/cordon, /uncordon or /drain");
        return;
    }
    const char *action = end + 1;
    if (errno != 0 || gpu > OSUB_POOL_GPUS_MAX) { /* never cut down to some other GPU's index */
        osubd__api_reply_rc(d, req, OSUB_EBAD_GPU);
        return;
    }
    json_t *cmd;
    if (strcmp(action, "cordon") == 0 || strcmp(action, "uncordon") == 0)
        cmd = json_pack("{s:s, s:i, s:b}", "op", "cordon", "gpu", (int)gpu, "on", action[0] == 'c');
    else if (strcmp(action, "drain") == 0)
        cmd = json_pack("{s:s, s:i}", "op", "drain", "gpu", (int)gpu);
    else {
        osubd__api_reply_error(d, req, 404, "not_found", "cordon, uncordon or drain");
        return;
    }
    char err[256];
    int rc = osubd_apply(d->core, cmd, NULL, err, sizeof(err));
    json_decref(cmd);
    if (rc != 0) {
        osubd__api_reply_rc(d, req, rc);
        return;
    }
    osubd__api_reply_json(d, req, 200, osubd__api_pool_json(d));
}
