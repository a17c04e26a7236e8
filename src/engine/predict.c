/* predict.c - each service's usage predictor: its predicted peak from its own reports */
#include "internal.h"

/* How fast the moving mean and deviation follow new reports: 1/16 of the way each time. */
#define PRED_SHIFT 4
/* Deviations above the mean that a peak may still reach. */
#define PRED_DEVS 4

void osub__pred_init(struct pred *p)
{
    p->n = 0;
    p->first_ms = -1;
    p->mean16 = p->dev16 = p->peak = p->jump = p->last = 0;
}

void osub__pred_observe(struct pred *p, int64_t used_total, int64_t now_ms)
{
    int64_t x16 = used_total * 16;
    if (p->n == 0) {
        p->first_ms = now_ms;
        p->mean16 = x16;
        p->dev16 = 0;
        p->peak = used_total;
        p->jump = 0;
    } else {
        int64_t d = x16 - p->mean16;
        p->mean16 += d / (1 << PRED_SHIFT);
        int64_t ad = d < 0 ? -d : d;
        p->dev16 += (ad - p->dev16) / (1 << PRED_SHIFT);
        if (used_total > p->peak)
            p->peak = used_total;
        if (used_total - p->last > p->jump)
            p->jump = used_total - p->last;
    }
    p->last = used_total;
    if (p->n < UINT32_MAX)
        p->n++;
}

int64_t osub__pred_peak(const struct pred *p, int64_t cap, int64_t now_ms, int64_t trust_ms)
{
    if (p->n == 0 || p->first_ms < 0)
        return cap;
    int64_t learned = (p->mean16 + PRED_DEVS * p->dev16 + 15) / 16;
    if (p->peak > learned)
        learned = p->peak;
    /* a rise as large as the largest seen may come on top of the mean at any time */
    int64_t rise = (p->mean16 + 15) / 16 + p->jump;
    if (rise > learned)
        learned = rise;
    if (learned >= cap)
        return cap;
    /* whole minutes: the prediction moves with time only once a minute, when the planner's
     * index is refreshed anyway */
    int64_t age = now_ms / 60000 * 60000 - p->first_ms;
    if (age < 0)
        age = 0;
    /* shrink from the request toward what was learned as the history grows: a history of
     * trust_ms weighs as much as the request (a young service's prediction stays near its
     * request, an old one's near what it has shown) */
    if (trust_ms < 1)
        trust_ms = 1;
    int64_t extra;
    if (cap - learned < (INT64_C(1) << 31) && trust_ms < (INT64_C(1) << 31))
        extra = (cap - learned) * trust_ms / (trust_ms + age); /* fits 64 bits */
    else
        extra = (int64_t)((osub_i128)(cap - learned) * trust_ms / (trust_ms + age));
    return learned + extra;
}

int64_t osub__slot_rise(const osub_engine_t *e, const struct svc *s, int32_t gpu)
{
    for (int32_t i = 0; i < s->n_slots; i++) {
        if (s->slots[i].gpu != gpu)
            continue;
        int64_t pred = osub__pred_peak(&s->pred, s->full_total, e->now, e->cfg.prediction_trust_ms);
        int64_t top = osub__share(pred, s->k, i);
        if (top > s->slots[i].grant)
            top = s->slots[i].grant;
        int64_t up = top - s->slots[i].held;
        return up > 0 ? up : 0;
    }
    return 0;
}

int64_t osub__charge_total(const osub_engine_t *e, const struct svc *s)
{
    if (s->backed)
        return s->full_total;
    return osub__pred_peak(&s->pred, s->full_total, e->now, e->cfg.prediction_trust_ms);
}
