/* command.c - engine commands as JSON: applied live, and replayed from the log */
#include "command.h"

#include <stdio.h>
#include <string.h>

#include "spec_json.h"

static int bad(char *err, size_t len, const char *what, const char *op)
{
    snprintf(err, len, "command '%s': %s", op, what);
    return OSUB_EINVAL;
}

static const char *str_of(const json_t *cmd, const char *key)
{
    return json_string_value(json_object_get(cmd, key));
}

static bool int_of(const json_t *cmd, const char *key, int64_t *out)
{
    const json_t *v = json_object_get(cmd, key);
    if (!json_is_integer(v))
        return false;
    *out = json_integer_value(v);
    return true;
}

int osubd__cmd_apply(osub_engine_t *e, const json_t *cmd, int64_t now_ms, osub_submit_result_t *res,
                     char *err, size_t errlen)
{
    const char *op = str_of(cmd, "op");
    if (op == NULL)
        return bad(err, errlen, "no \"op\"", "?");
    const char *id = str_of(cmd, "id");
    int64_t x, y, z;
    if (strcmp(op, "submit") == 0) {
        osub_spec_t spec;
        char e2[256];
        if (osub_spec_from_json(json_object_get(cmd, "spec"), &spec, e2, sizeof(e2)) != 0)
            return bad(err, errlen, e2, op);
        unsigned flags = 0;
        if (json_is_true(json_object_get(cmd, "dry_run")))
            flags |= OSUB_SUBMIT_DRY_RUN;
        if (json_is_true(json_object_get(cmd, "running")))
            flags |= OSUB_SUBMIT_RUNNING;
        osub_submit_result_t tmp;
        return osub_engine_submit(e, &spec, now_ms, flags, res ? res : &tmp);
    }
    if (strcmp(op, "note") == 0)
        return 0; /* the daemon's own event (a process started, exited...): nothing to apply */
    if (strcmp(op, "tick") == 0)
        return osub_engine_tick(e, now_ms);
    if (strcmp(op, "ratio") == 0) {
        if (!int_of(cmd, "ratio_milli", &x) || x < 0 || x > INT32_MAX)
            return bad(err, errlen, "\"ratio_milli\" must be an integer", op);
        return osub_engine_set_ratio(e, (int32_t)x, now_ms);
    }
    if (strcmp(op, "system") == 0 || strcmp(op, "cordon") == 0 || strcmp(op, "drain") == 0 ||
        strcmp(op, "lost") == 0) {
        if (!int_of(cmd, "gpu", &x) || x < INT32_MIN || x > INT32_MAX)
            return bad(err, errlen, "\"gpu\" must be an integer", op);
        int32_t gpu = (int32_t)x;
        if (op[0] == 's') {
            if (!int_of(cmd, "vram_mib", &y))
                return bad(err, errlen, "\"vram_mib\" must be an integer", op);
            return osub_engine_system_usage(e, gpu, y, now_ms);
        }
        if (op[0] == 'c')
            return osub_engine_cordon(e, gpu, !json_is_false(json_object_get(cmd, "on")), now_ms);
        if (op[0] == 'd')
            return osub_engine_drain_gpu(e, gpu, now_ms);
        return osub_engine_gpu_lost(e, gpu, now_ms);
    }
    if (id == NULL)
        return bad(err, errlen, "\"id\" must be a string", op);
    if (strcmp(op, "release") == 0)
        return json_is_true(json_object_get(cmd, "measured"))
                   ? osub_engine_release_measured(e, id, now_ms)
                   : osub_engine_release(e, id, now_ms);
    if (strcmp(op, "ready") == 0)
        return osub_engine_ready(e, id, now_ms);
    if (strcmp(op, "ack") == 0)
        return osub_engine_ack(e, id, str_of(cmd, "checkpoint"), now_ms);
    if (strcmp(op, "exited") == 0)
        return osub_engine_exited(e, id, str_of(cmd, "checkpoint"), now_ms);
    if (strcmp(op, "fail") == 0)
        return osub_engine_fail(e, id, str_of(cmd, "why"), now_ms);
    /* suspend: an operator's (or the gateway's idle) suspend and resume, the mechanisms' reports */
    if (strcmp(op, "suspend") == 0)
        return osub_engine_suspend(
            e, id, json_is_true(json_object_get(cmd, "idle")) ? OSUB_SUSPEND_IDLE : 0, now_ms);
    if (strcmp(op, "resume") == 0)
        return osub_engine_resume(e, id, now_ms);
    if (strcmp(op, "suspended") == 0) {
        if (!int_of(cmd, "residual_mib", &x) || x < 0)
            return bad(err, errlen, "\"residual_mib\" must be an integer >= 0", op);
        return osub_engine_suspended(e, id, x, now_ms);
    }
    if (strcmp(op, "resumed") == 0)
        return osub_engine_resumed(e, id, now_ms);
    if (strcmp(op, "suspend_failed") == 0)
        return osub_engine_suspend_failed(e, id, str_of(cmd, "why"), now_ms);
    if (strcmp(op, "resize") == 0) {
        x = y = z = 0;
        if ((json_object_get(cmd, "vram_mib") && !int_of(cmd, "vram_mib", &x)) ||
            (json_object_get(cmd, "min_vram_mib") && !int_of(cmd, "min_vram_mib", &y)) ||
            (json_object_get(cmd, "batch_size") && !int_of(cmd, "batch_size", &z)) || z < 0 ||
            z > INT32_MAX)
            return bad(err, errlen, "sizes must be integers", op);
        return osub_engine_resize(e, id, x, y, (int32_t)z, now_ms);
    }
    if (strcmp(op, "usage") == 0) {
        const json_t *gpus = json_object_get(cmd, "gpus");
        if (json_is_array(gpus)) {
            int64_t per[64];
            size_t n = json_array_size(gpus);
            if (n == 0 || n > 64)
                return bad(err, errlen, "\"gpus\" must list 1 to 64 sizes", op);
            for (size_t i = 0; i < n; i++) {
                const json_t *v = json_array_get(gpus, i);
                if (!json_is_integer(v))
                    return bad(err, errlen, "\"gpus\" must list integers", op);
                per[i] = json_integer_value(v);
            }
            return osub_engine_usage_per_gpu(e, id, per, n, now_ms);
        }
        if (!int_of(cmd, "vram_mib", &x))
            return bad(err, errlen, "\"vram_mib\" must be an integer", op);
        y = -1;
        if (json_object_get(cmd, "compute_pct") &&
            (!int_of(cmd, "compute_pct", &y) || y < 0 || y > 100))
            return bad(err, errlen, "\"compute_pct\" must be 0 to 100", op);
        return osub_engine_usage(e, id, x, (int32_t)y, now_ms);
    }
    return bad(err, errlen, "unknown operation", op);
}
