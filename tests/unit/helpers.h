/* helpers.h - small helpers shared by the engine's unit tests */
#ifndef OSUB_TEST_HELPERS_H
#define OSUB_TEST_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "oversub/engine.h"
#include "oversub/units.h"

static inline osub_engine_t *mk_engine(int n, int64_t vram, int32_t ratio_milli)
{
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = ratio_milli;
    int64_t v[256];
    for (int i = 0; i < n; i++)
        v[i] = vram;
    osub_engine_t *e = NULL;
    assert_int_equal(osub_engine_new(&cfg, v, NULL, (size_t)n, NULL, 0, &e), 0);
    return e;
}

static inline osub_engine_t *mk_engine_cfg(int n, const int64_t *vram,
                                           const osub_pool_config_t *cfg)
{
    osub_engine_t *e = NULL;
    assert_int_equal(osub_engine_new(cfg, vram, NULL, (size_t)n, NULL, 0, &e), 0);
    return e;
}

static inline osub_spec_t spec(const char *id, const char *cls, int64_t vram, int32_t gpus,
                               int64_t min_vram)
{
    osub_spec_t s;
    osub_spec_init(&s, id, cls);
    s.vram_mib = vram;
    s.gpus = gpus;
    s.min_vram_mib = min_vram;
    return s;
}

static inline osub_submit_outcome_t sub(osub_engine_t *e, osub_spec_t s, int64_t now)
{
    osub_submit_result_t r;
    int rc = osub_engine_submit(e, &s, now, 0, &r);
    if (rc != 0 && r.outcome != OSUB_SUBMIT_REJECTED)
        fail_msg("submit %s: %s", s.id, osub_strerror(rc));
    return r.outcome;
}

static inline osub_service_info_t info(osub_engine_t *e, const char *id)
{
    osub_service_info_t si;
    int rc = osub_engine_service_info(e, id, &si);
    if (rc != 0)
        fail_msg("service_info %s: %s", id, osub_strerror(rc));
    return si;
}

static inline osub_gpu_info_t ginfo(osub_engine_t *e, int32_t g)
{
    osub_gpu_info_t gi;
    assert_int_equal(osub_engine_gpu_info(e, g, &gi), 0);
    return gi;
}

/* Number of events of the last command of this kind (and service, when not NULL). */
static inline int count_ev(osub_engine_t *e, osub_event_kind_t k, const char *svc)
{
    size_t n;
    const osub_event_t *ev = osub_engine_events(e, &n);
    int c = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == k && (svc == NULL || strcmp(ev[i].service, svc) == 0))
            c++;
    return c;
}

static inline const osub_event_t *find_ev(osub_engine_t *e, osub_event_kind_t k, const char *svc)
{
    size_t n;
    const osub_event_t *ev = osub_engine_events(e, &n);
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == k && (svc == NULL || strcmp(ev[i].service, svc) == 0))
            return &ev[i];
    return NULL;
}

static inline void check_ok(osub_engine_t *e)
{
    char why[512];
    if (osub_engine_check(e, why, sizeof(why)) != 0)
        fail_msg("invariant: %s", why);
}

#endif
