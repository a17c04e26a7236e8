/* spec_json.c - service specs from JSON, and YAML documents read as JSON values */
#include "spec_json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "oversub/units.h"

OSUB_PRINTF(3, 4)
static int fail(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

static int get_int(const json_t *v, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   char *err, size_t len)
{
    if (!json_is_integer(v)) {
        snprintf(err, len, "field '%s' must be an integer", key);
        return -1;
    }
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        snprintf(err, len, "field '%s' must be between %lld and %lld", key, (long long)lo,
                 (long long)hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int get_size(const json_t *v, const char *key, int64_t *out, char *err, size_t len)
{
    if (json_is_string(v)) {
        if (osub_parse_size_mib(json_string_value(v), 1, out) != 0) {
            snprintf(err, len, "field '%s': '%s' is not a size (a number of MiB, or 0.5GiB, 80GB)",
                     key, json_string_value(v));
            return -1;
        }
        return 0;
    }
    return get_int(v, key, 0, INT64_C(1) << 40, out, err, len);
}

static int get_tri(const json_t *v, const char *key, osub_tri_t *out, char *err, size_t len)
{
    if (!json_is_boolean(v))
        return fail(err, len, "field '%s' must be true or false", key);
    *out = json_is_true(v) ? OSUB_TRI_YES : OSUB_TRI_NO;
    return 0;
}

/* The spec's "suspend" object, as far as the engine knows it: the method and the residual
 * expected once suspended; the mechanism's url and paths are type-checked here and kept by the
 * daemon (its suspender checks them against where it may connect). */
static int get_suspend(const json_t *v, osub_suspend_spec_t *out, char *err, size_t len)
{
    static const char *const methods[] = {"cuda", "vllm", "sglang", "http"};
    if (!json_is_object(v))
        return fail(err, len,
                    "field 'suspend' must be an object: {\"method\": \"cuda\"}, "
                    "{\"method\": \"vllm\", \"url\": U}, ...");
    const char *m = json_string_value(json_object_get(v, "method"));
    out->method = OSUB_SUSPEND_NONE;
    for (int i = 0; m != NULL && i < 4; i++)
        if (strcmp(m, methods[i]) == 0)
            out->method = (osub_suspend_method_t)(OSUB_SUSPEND_CUDA + i);
    if (out->method == OSUB_SUSPEND_NONE)
        return fail(err, len, "field 'suspend.method' must be cuda, vllm, sglang or http");
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x)
    {
        if (strcmp(key, "method") == 0)
            continue;
        if (strcmp(key, "url") == 0 || strcmp(key, "suspend") == 0 || strcmp(key, "resume") == 0) {
            if (!json_is_string(x))
                return fail(err, len, "field 'suspend.%s' must be a string", key);
        } else if (strcmp(key, "residual_mib") == 0 || strcmp(key, "residual") == 0) {
            int64_t r;
            if (get_size(x, "suspend.residual", &r, err, len) != 0)
                return -1;
            out->residual_mib = r;
        } else if (strcmp(key, "relocate") == 0) {
            if (!json_is_boolean(x))
                return fail(err, len, "field 'suspend.relocate' must be true or false");
            if (json_is_true(x) && out->method != OSUB_SUSPEND_CUDA)
                return fail(err, len,
                            "field 'suspend.relocate' is for method cuda only (restoring a "
                            "checkpoint onto another GPU is the CUDA driver's remap)");
            out->relocate = json_is_true(x);
        } else {
            return fail(err, len,
                        "field 'suspend.%.40s' is unknown (method, url, suspend, resume, "
                        "residual, relocate)",
                        key);
        }
    }
    return 0;
}

int osub_spec_from_json(const json_t *obj, osub_spec_t *spec, char *err, size_t errlen)
{
    if (!json_is_object(obj))
        return fail(err, errlen, "a service spec must be a JSON object");
    const json_t *id = json_object_get(obj, "id");
    const json_t *cls = json_object_get(obj, "class");
    if (!json_is_string(id))
        return fail(err, errlen, "field 'id' is required and must be a string");
    if (cls != NULL && !json_is_string(cls))
        return fail(err, errlen, "field 'class' must be a string");
    if (strlen(json_string_value(id)) > OSUB_ID_MAX || !osub_id_valid(json_string_value(id)))
        return fail(err, errlen,
                    "field 'id': '%s' is not 1-63 characters of [a-z0-9-] starting with a letter",
                    json_string_value(id));
    if (cls != NULL && strlen(json_string_value(cls)) > OSUB_CLASS_NAME_MAX)
        return fail(err, errlen, "field 'class': '%s' is too long", json_string_value(cls));
    osub_spec_init(spec, json_string_value(id), cls ? json_string_value(cls) : "batch");
    const char *key;
    json_t *v;
    int64_t x;
    json_object_foreach((json_t *)obj, key, v)
    {
        if (strcmp(key, "id") == 0 || strcmp(key, "class") == 0)
            continue;
        if (strcmp(key, "vram_mib") == 0 || strcmp(key, "vram") == 0) {
            if (get_size(v, key, &x, err, errlen) != 0)
                return -1;
            spec->vram_mib = x;
        } else if (strcmp(key, "min_vram_mib") == 0 || strcmp(key, "min_vram") == 0) {
            if (get_size(v, key, &x, err, errlen) != 0)
                return -1;
            spec->min_vram_mib = x;
        } else if (strcmp(key, "gpus") == 0) {
            if (get_int(v, key, 0, 64, &x, err, errlen) != 0)
                return -1;
            spec->gpus = (int32_t)x;
        } else if (strcmp(key, "compute_pct") == 0) {
            if (get_int(v, key, 0, 100, &x, err, errlen) != 0)
                return -1;
            spec->compute_pct = (int32_t)x;
        } else if (strcmp(key, "batch_size") == 0) {
            if (get_int(v, key, 0, 1 << 20, &x, err, errlen) != 0)
                return -1;
            spec->batch_size = (int32_t)x;
        } else if (strcmp(key, "min_batch_size") == 0) {
            if (get_int(v, key, 0, 1 << 20, &x, err, errlen) != 0)
                return -1;
            spec->min_batch_size = (int32_t)x;
        } else if (strcmp(key, "exclusive") == 0) {
            if (!json_is_boolean(v))
                return fail(err, errlen, "field '%s' must be true or false", key);
            spec->exclusive = json_is_true(v);
        } else if (strcmp(key, "resumable") == 0) {
            if (!json_is_boolean(v))
                return fail(err, errlen, "field '%s' must be true or false", key);
            spec->resumable = json_is_true(v);
        } else if (strcmp(key, "preemptible") == 0) {
            if (get_tri(v, key, &spec->preemptible, err, errlen) != 0)
                return -1;
        } else if (strcmp(key, "queue") == 0) {
            if (get_tri(v, key, &spec->queue, err, errlen) != 0)
                return -1;
        } else if (strcmp(key, "on_evict") == 0) {
            const char *s = json_string_value(v);
            if (s != NULL && strcmp(s, "requeue") == 0)
                spec->on_evict = OSUB_ON_EVICT_REQUEUE;
            else if (s != NULL && strcmp(s, "release") == 0)
                spec->on_evict = OSUB_ON_EVICT_RELEASE;
            else
                return fail(err, errlen, "field '%s' must be \"requeue\" or \"release\"", key);
        } else if (strcmp(key, "restart_cost_ms") == 0) {
            if (get_int(v, key, 0, 86400000, &x, err, errlen) != 0)
                return -1;
            spec->restart_cost_ms = x;
        } else if (strcmp(key, "grace_ms") == 0) {
            if (get_int(v, key, 0, 86400000, &x, err, errlen) != 0)
                return -1;
            spec->grace_ms = x;
        } else if (strcmp(key, "suspend") == 0) {
            if (get_suspend(v, &spec->suspend, err, errlen) != 0)
                return -1;
        } else if (strcmp(key, "resume_cost_ms") == 0) {
            if (get_int(v, key, 0, 86400000, &x, err, errlen) != 0)
                return -1;
            spec->resume_cost_ms = x;
        } else {
            fail(err, errlen, "unknown field '%s'", key);
            return OSUB_SPEC_UNKNOWN_FIELD;
        }
    }
    if (spec->vram_mib <= 0)
        return fail(err, errlen, "field 'vram_mib' is required and must be positive");
    if (spec->suspend.relocate && (spec->gpus > 1 || spec->exclusive))
        return fail(err, errlen,
                    "field 'suspend.relocate' is for a service of one GPU that is not exclusive "
                    "(a multi-GPU service is NCCL across processes: it cannot be checkpointed)");
    if (spec->suspend.method != OSUB_SUSPEND_NONE && spec->suspend.residual_mib > spec->vram_mib)
        return fail(err, errlen,
                    "field 'suspend.residual' (%lld MiB) is more than the request (vram_mib "
                    "%lld): what stays on the GPUs once suspended is part of what it holds",
                    (long long)spec->suspend.residual_mib, (long long)spec->vram_mib);
    return 0;
}

json_t *osub_spec_to_json(const osub_spec_t *s)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:i, s:i, s:I, s:i, s:i, s:b, s:b, s:b, s:s, s:I, "
                          "s:b, s:I}",
                          "id", s->id, "class", s->class_name, "vram_mib", (json_int_t)s->vram_mib,
                          "gpus", s->gpus, "compute_pct", s->compute_pct, "min_vram_mib",
                          (json_int_t)s->min_vram_mib, "batch_size", s->batch_size,
                          "min_batch_size", s->min_batch_size, "exclusive", s->exclusive,
                          "preemptible", s->preemptible == OSUB_TRI_YES, "resumable", s->resumable,
                          "on_evict", s->on_evict == OSUB_ON_EVICT_REQUEUE ? "requeue" : "release",
                          "restart_cost_ms", (json_int_t)s->restart_cost_ms, "queue",
                          s->queue == OSUB_TRI_YES, "grace_ms", (json_int_t)s->grace_ms);
    if (o != NULL && s->suspend.method != OSUB_SUSPEND_NONE) {
        static const char *const methods[] = {"none", "cuda", "vllm", "sglang", "http"};
        json_object_set_new(o, "suspend",
                            json_pack("{s:s, s:I}", "method", methods[s->suspend.method],
                                      "residual_mib", (json_int_t)s->suspend.residual_mib));
        if (s->suspend.relocate)
            json_object_set_new(json_object_get(o, "suspend"), "relocate", json_true());
        if (s->resume_cost_ms >= 0)
            json_object_set_new(o, "resume_cost_ms", json_integer(s->resume_cost_ms));
    }
    return o;
}

/* ---- YAML ------------------------------------------------------------------------------ */

static json_t *scalar_value(const yaml_event_t *ev)
{
    const char *v = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return json_stringn(v, n);
    if (n == 0 || strcmp(v, "~") == 0 || strcmp(v, "null") == 0)
        return json_null();
    if (strcmp(v, "true") == 0 || strcmp(v, "yes") == 0)
        return json_true();
    if (strcmp(v, "false") == 0 || strcmp(v, "no") == 0)
        return json_false();
    char *end;
    errno = 0;
    long long i = strtoll(v, &end, 10);
    if (*end == '\0' && errno == 0)
        return json_integer(i);
    errno = 0;
    double d = strtod(v, &end);
    if (*end == '\0' && errno == 0)
        return json_real(d);
    return json_stringn(v, n);
}

/* Builds the value starting at the parser's next event (depth-limited). */
static json_t *yaml_value(yaml_parser_t *p, yaml_event_t *first, int depth, char *err,
                          size_t errlen)
{
    if (depth > 64) {
        snprintf(err, errlen, "line %zu: nesting too deep", first->start_mark.line + 1);
        return NULL;
    }
    if (first->type == YAML_SCALAR_EVENT)
        return scalar_value(first);
    if (first->type == YAML_ALIAS_EVENT) {
        snprintf(err, errlen, "line %zu: YAML aliases are not supported",
                 first->start_mark.line + 1);
        return NULL;
    }
    bool map = first->type == YAML_MAPPING_START_EVENT;
    if (!map && first->type != YAML_SEQUENCE_START_EVENT) {
        snprintf(err, errlen, "line %zu: unexpected YAML event", first->start_mark.line + 1);
        return NULL;
    }
    json_t *out = map ? json_object() : json_array();
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(p, &ev)) {
            snprintf(err, errlen, "line %zu: %s", p->problem_mark.line + 1,
                     p->problem ? p->problem : "YAML syntax error");
            json_decref(out);
            return NULL;
        }
        if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            return out;
        }
        if (map) {
            if (ev.type != YAML_SCALAR_EVENT) {
                snprintf(err, errlen, "line %zu: a mapping key must be a plain string",
                         ev.start_mark.line + 1);
                yaml_event_delete(&ev);
                json_decref(out);
                return NULL;
            }
            char key[256];
            size_t kl = ev.data.scalar.length < 255 ? ev.data.scalar.length : 255;
            memcpy(key, ev.data.scalar.value, kl);
            key[kl] = '\0';
            size_t line = ev.start_mark.line + 1;
            yaml_event_delete(&ev);
            yaml_event_t vev;
            if (!yaml_parser_parse(p, &vev)) {
                snprintf(err, errlen, "line %zu: %s", p->problem_mark.line + 1,
                         p->problem ? p->problem : "YAML syntax error");
                json_decref(out);
                return NULL;
            }
            json_t *val = yaml_value(p, &vev, depth + 1, err, errlen);
            yaml_event_delete(&vev);
            if (val == NULL) {
                json_decref(out);
                return NULL;
            }
            if (json_object_get(out, key) != NULL) {
                snprintf(err, errlen, "line %zu: key '%.60s' appears twice", line, key);
                json_decref(val);
                json_decref(out);
                return NULL;
            }
            json_object_set_new(out, key, val);
        } else {
            json_t *val = yaml_value(p, &ev, depth + 1, err, errlen);
            yaml_event_delete(&ev);
            if (val == NULL) {
                json_decref(out);
                return NULL;
            }
            json_array_append_new(out, val);
        }
    }
}

json_t *osub_yaml_load_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        fclose(f);
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    yaml_parser_set_input_file(&p, f);
    json_t *root = NULL;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            snprintf(err, errlen, "%s: line %zu: %s", path, p.problem_mark.line + 1,
                     p.problem ? p.problem : "YAML syntax error");
            break;
        }
        yaml_event_type_t t = ev.type;
        if (t == YAML_SCALAR_EVENT || t == YAML_MAPPING_START_EVENT ||
            t == YAML_SEQUENCE_START_EVENT || t == YAML_ALIAS_EVENT) {
            char e2[160] = "";
            root = yaml_value(&p, &ev, 0, e2, sizeof(e2));
            if (root == NULL)
                snprintf(err, errlen, "%.200s: %s", path, e2);
            yaml_event_delete(&ev);
            break;
        }
        yaml_event_delete(&ev);
        if (t == YAML_STREAM_END_EVENT) {
            root = json_object(); /* an empty file is an empty mapping */
            break;
        }
    }
    yaml_parser_delete(&p);
    fclose(f);
    return root;
}
