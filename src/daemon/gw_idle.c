/* gw_idle.c - idle suspend (DESIGN.md "Suspend", issue 25): a service whose route has
 * idle_suspend_ms and that had no gateway request for that long is suspended (reason idle),
 * lending its memory; its next request resumes it when its GPUs have room without victims
 * (the engine decides) and waits in its queue meanwhile. A request that cannot be answered
 * before its deadline because its service is suspended or resuming gets 503 with Retry-After
 * at once; one that waited its deadline out gets the same from the deadline timer. */
#include "gw.h"

#include <jansson.h>

static bool in_suspend(osub_state_t st)
{
    return st == OSUB_STATE_SUSPENDING || st == OSUB_STATE_SUSPENDED || st == OSUB_STATE_RESUMING;
}

static int apply(struct osubd_gateway *g, json_t *cmd)
{
    char err[256];
    int rc = cmd != NULL ? osubd_apply(g->core, cmd, NULL, err, sizeof(err)) : OSUB_ENOMEM;
    json_decref(cmd);
    return rc;
}

/* One service: suspended when it has been idle long enough (serving, nothing in flight or
 * queued, no request since idle_suspend_ms). A suspend the engine refuses (its host budget is
 * full, a degrade not yet acknowledged) is tried again after another idle period. */
static void idle_check(struct osubd_gateway *g, const char *id, int64_t now)
{
    const struct osubd_route *route = osubd__gw_route_of(g, id);
    osub_service_info_t si;
    if (route == NULL || route->idle_suspend_ms <= 0 ||
        osub_engine_service_info(g->e, id, &si) != 0 || !osubd__gw_serving(&si))
        return;
    struct gw_svc *s = osubd__gw_svc_of(g, id);
    if (s == NULL || s->inflight > 0 || s->queue != NULL)
        return;
    /* quiet since it began serving, its last request's arrival and its last answer's end */
    int64_t quiet = now - si.since_ms;
    double last = s->last_req > s->last_done ? s->last_req : s->last_done;
    if (last > 0 && (int64_t)((now_s() - last) * 1000) < quiet)
        quiet = (int64_t)((now_s() - last) * 1000);
    /* a service that resumed is not suspended again before suspend_min_runtime_ms (no thrash) */
    osub_pool_config_t cfg;
    osub_engine_config(g->e, &cfg);
    if (si.woke_ms > 0 && now - si.woke_ms < cfg.suspend_min_runtime_ms)
        return;
    if (quiet < route->idle_suspend_ms ||
        (s->idle_tried_ms > 0 && now - s->idle_tried_ms < route->idle_suspend_ms))
        return;
    s->idle_tried_ms = now;
    int rc = apply(g, json_pack("{s:s, s:s, s:b}", "op", "suspend", "id", id, "idle", 1));
    if (rc != 0)
        osubd_note(g->core, id, "suspend", "idle_refused",
                   "%s: no request for %lld ms, but it cannot be suspended now (%s): tried "
                   "again after another idle period",
                   id, (long long)quiet, osub_errcode(rc));
}

void osubd__gw_idle_tick(struct osubd_gateway *g)
{
    size_t n;
    osubd__idmap_key_t *ids = osubd_routes_idle_ids(g->routes, &n);
    int64_t now = osubd_engine_now(g->core);
    for (size_t i = 0; i < n; i++)
        idle_check(g, ids[i], now);
    free(ids);
}

/* When the service can answer, as far as is known: ms from now, or -1 (not known: it waits for
 * room, or for its suspend to end first). */
static int64_t ready_in(struct osubd_gateway *g, const osub_service_info_t *si)
{
    if (si->state != OSUB_STATE_RESUMING)
        return -1;
    int64_t left = si->since_ms + si->resume_cost_ms - osubd_engine_now(g->core);
    return left > 0 ? left : 0;
}

/* A service suspended for idleness with a request for it: resumed (now if its GPUs have room,
 * else as soon as they do). */
static void resume_idle(struct osubd_gateway *g, struct gw_svc *s, const osub_service_info_t *si)
{
    if (si->state != OSUB_STATE_SUSPENDED || !si->suspend_idle)
        return;
    osubd_note(g->core, s->id, "suspend", "request",
               "%s: a request waits for it, suspended for idleness: it resumes when its GPUs "
               "have room",
               s->id);
    apply(g, json_pack("{s:s, s:s}", "op", "resume", "id", s->id));
}

void osubd__gw_wake_queued(struct osubd_gateway *g, struct gw_svc *s)
{
    osub_service_info_t si;
    if (s->queue != NULL && osub_engine_service_info(g->e, s->id, &si) == 0)
        resume_idle(g, s, &si);
}

bool osubd__gw_wake(struct osubd_gateway *g, struct gw_svc *s, struct gw_req *r)
{
    osub_service_info_t si;
    if (osub_engine_service_info(g->e, s->id, &si) != 0 || !in_suspend(si.state))
        return false;
    if (si.state == OSUB_STATE_SUSPENDED && si.suspend_idle) {
        resume_idle(g, s, &si);
        if (osub_engine_service_info(g->e, s->id, &si) != 0)
            return false;
    }
    if (si.state == OSUB_STATE_SUSPENDED && si.suspend_hold && !si.suspend_idle) {
        s->rej_unavailable++;
        osubd__gw_reply(r, 503, "Service Unavailable", "unavailable", "suspended",
                        "the service is suspended by an operator: it answers again once resumed "
                        "(oversub resume ID)",
                        60000);
        return true;
    }
    int64_t in = ready_in(g, &si);
    if (in > r->deadline_ms) {
        /* its retry is due then: no idle suspend counts from before it */
        s->last_req = now_s() + (double)in / 1000.0;
        s->rej_unavailable++;
        osubd__gw_reply(r, 503, "Service Unavailable", "unavailable", "resuming",
                        "the service is resuming from suspend and cannot answer before the "
                        "request's deadline",
                        in < 1000 ? 1000 : (int)(in < 600000 ? in : 600000));
        return true;
    }
    return false;
}

int osubd__gw_suspend_retry_ms(struct osubd_gateway *g, const char *id)
{
    osub_service_info_t si;
    if (osub_engine_service_info(g->e, id, &si) != 0 || !in_suspend(si.state))
        return -1;
    int64_t in = ready_in(g, &si);
    if (in < 0)
        in = si.resume_cost_ms; /* once it has room: its resume */
    return in < 1000 ? 1000 : (int)(in < 600000 ? in : 600000);
}
