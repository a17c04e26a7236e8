/* test_pod.c - a Kubernetes Pod read as an oversub spec (src/k8s/pod.c) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "pod.h"

static void test_quantities(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int64_t v;
    } good[] = {{"16384", 16384}, {"16Ki", 16384},  {"2k", 2000}, {"1e3", 1000},
                {"1.5Ki", 1536},  {"+7", 7},        {"0", 0},     {"1T", 1000000000000LL},
                {"3000m", 3},     {"1Mi", 1 << 20}, {"2.000", 2}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        int64_t v = -1;
        assert_int_equal(osub_k8s_quantity(good[i].s, &v), 0);
        assert_int_equal(v, good[i].v);
    }
    static const char *const bad[] = {"",     "1.5",  "-1", "1x", "Ki",   "1e",
                                      "1e99", "1..2", "1 ", " 1", "500m", "99999999999999999999",
                                      "1Ei",  "1E",   NULL};
    for (size_t i = 0; bad[i]; i++) {
        int64_t v;
        assert_int_equal(osub_k8s_quantity(bad[i], &v), -1);
    }
}

static json_t *pod_of(const char *text)
{
    json_error_t e;
    json_t *p = json_loads(text, 0, &e);
    assert_non_null(p);
    return p;
}

static void test_vram_sum_and_init(void **state)
{
    (void)state;
    char why[200];
    int64_t mib;
    json_t *p = pod_of(
        "{\"metadata\":{\"name\":\"a\",\"uid\":\"u-1\"},\"spec\":{\"containers\":["
        "{\"name\":\"c1\",\"resources\":{\"limits\":{\"oversub.io/vram-mib\":\"1000\"}}},"
        "{\"name\":\"c2\",\"resources\":{\"requests\":{\"oversub.io/vram-mib\":\"2Ki\"}}},"
        "{\"name\":\"c3\",\"resources\":null}],"
        "\"initContainers\":[{\"name\":\"i\",\"resources\":{\"limits\":{\"oversub.io/vram-mib\":"
        "\"5000\"}}}]}}");
    assert_int_equal(osub_pod_vram(p, &mib, why, sizeof(why)), 0);
    assert_int_equal(mib, 5000); /* the init container's is larger than the sum 3048 */
    json_object_set_new(
        json_array_get(json_object_get(json_object_get(p, "spec"), "initContainers"), 0),
        "resources", json_null());
    assert_int_equal(osub_pod_vram(p, &mib, why, sizeof(why)), 0);
    assert_int_equal(mib, 3048);
    json_decref(p);
    p = pod_of("{\"spec\":{\"containers\":[{\"name\":\"x\",\"resources\":{\"limits\":{"
               "\"oversub.io/vram-mib\":\"1.5\"}}}]}}");
    assert_int_equal(osub_pod_vram(p, &mib, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "container 'x'"));
    json_decref(p);
}

static const char *cls_of(const char *pod_text, const struct osub_pod_policy *pol)
{
    static char out[256];
    char why[200];
    json_t *p = pod_of(pod_text);
    json_t *s = osub_pod_spec(p, pol, "n1", why, sizeof(why));
    snprintf(out, sizeof(out), "%s", s ? json_string_value(json_object_get(s, "class")) : why);
    json_decref(s);
    json_decref(p);
    return out;
}

#define POD(ann, prio)                                                                             \
    "{\"metadata\":{\"name\":\"p\",\"namespace\":\"ns\",\"uid\":\"0a-1\",\"annotations\":{" ann    \
    "}},\"spec\":{" prio "\"containers\":[{\"name\":\"m\",\"resources\":{\"limits\":{"             \
    "\"oversub.io/vram-mib\":\"4096\"}}}]}}"

static void test_class_mapping(void **state)
{
    (void)state;
    struct osub_pod_policy pol;
    osub_pod_policy_default(&pol);
    assert_string_equal(cls_of(POD("", "\"priority\":1000,"), &pol), "online");
    assert_string_equal(cls_of(POD("", "\"priority\":999,"), &pol), "batch");
    assert_string_equal(cls_of(POD("", ""), &pol), "batch"); /* no priority: 0 */
    assert_string_equal(cls_of(POD("", "\"priority\":-5,"), &pol), "experiment");
    assert_string_equal(
        cls_of(POD("\"oversub.io/class\":\"experiment\"", "\"priority\":5000,"), &pol),
        "experiment");
    pol.online_min = 10;
    pol.batch_min = 5;
    assert_string_equal(cls_of(POD("", "\"priority\":7,"), &pol), "batch");
    assert_string_equal(cls_of(POD("", "\"priority\":4,"), &pol), "experiment");
    assert_non_null(strstr(cls_of(POD("\"oversub.io/class\":\"Gold!\"", ""), &pol), "class"));
}

static void test_spec_fields(void **state)
{
    (void)state;
    struct osub_pod_policy pol;
    osub_pod_policy_default(&pol);
    char why[200];
    json_t *p = pod_of(POD("\"oversub.io/min-vram-mib\":\"1024\",\"oversub.io/batch-size\":\"32\","
                           "\"oversub.io/grace-seconds\":\"12\",\"oversub.io/gpus\":\"2\"",
                           "\"terminationGracePeriodSeconds\":99,"));
    json_t *s = osub_pod_spec(p, &pol, "node-1", why, sizeof(why));
    assert_non_null(s);
    assert_string_equal(json_string_value(json_object_get(s, "id")), "pod-0a-1");
    assert_int_equal(json_integer_value(json_object_get(s, "vram_mib")), 4096);
    assert_int_equal(json_integer_value(json_object_get(s, "min_vram_mib")), 1024);
    assert_int_equal(json_integer_value(json_object_get(s, "batch_size")), 32);
    assert_int_equal(json_integer_value(json_object_get(s, "gpus")), 2);
    assert_int_equal(json_integer_value(json_object_get(s, "grace_ms")), 12000);
    assert_true(json_is_false(json_object_get(s, "queue")));
    assert_string_equal(json_string_value(json_object_get(s, "on_evict")), "release");
    json_t *k = json_object_get(s, "kubernetes");
    assert_string_equal(json_string_value(json_object_get(k, "node")), "node-1");
    assert_string_equal(json_string_value(json_object_get(k, "namespace")), "ns");
    assert_int_equal(json_integer_value(json_object_get(k, "grace_seconds")), 12);
    assert_int_equal(json_array_size(json_object_get(k, "containers")), 1);
    json_decref(s);
    json_decref(p);
    /* the kubelet's grace period when no annotation says otherwise */
    p = pod_of(POD("", "\"terminationGracePeriodSeconds\":45,"));
    s = osub_pod_spec(p, &pol, NULL, why, sizeof(why));
    assert_int_equal(json_integer_value(json_object_get(s, "grace_ms")), 45000);
    assert_null(json_object_get(json_object_get(s, "kubernetes"), "node"));
    json_decref(s);
    json_decref(p);
    /* a floor above the request, a UID that is no UID */
    p = pod_of(POD("\"oversub.io/min-vram-mib\":\"9999\"", ""));
    assert_null(osub_pod_spec(p, &pol, NULL, why, sizeof(why)));
    assert_non_null(strstr(why, "oversub.io/min-vram-mib"));
    json_decref(p);
    p = pod_of("{\"metadata\":{\"name\":\"p\",\"uid\":\"NOT A UID\"},\"spec\":{}}");
    assert_null(osub_pod_spec(p, &pol, NULL, why, sizeof(why)));
    assert_non_null(strstr(why, "uid"));
    json_decref(p);
}

static void test_case_insensitive(void **state)
{
    (void)state;
    json_t *o = pod_of("{\"nodenames\":[1],\"Pod\":{}}");
    assert_non_null(osub_json_get_ci(o, "NodeNames"));
    assert_non_null(osub_json_get_ci(o, "pod"));
    assert_null(osub_json_get_ci(o, "Nodes"));
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantities),       cmocka_unit_test(test_vram_sum_and_init),
        cmocka_unit_test(test_class_mapping),    cmocka_unit_test(test_spec_fields),
        cmocka_unit_test(test_case_insensitive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
