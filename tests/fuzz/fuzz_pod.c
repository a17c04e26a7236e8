/* fuzz_pod.c - libFuzzer target: kube-scheduler's requests as oversub-scheduler reads them
 * (src/k8s/pod.c): any bytes as a quantity, any JSON as an extender call's Pod */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "pod.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s == NULL)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    int64_t q;
    if (osub_k8s_quantity(s, &q) == 0 && (q < 0 || q > ((int64_t)1 << 53)))
        abort(); /* a quantity is a whole number in [0, 2^53] */
    free(s);
    json_t *args = json_loadb((const char *)data, size, 0, NULL);
    if (args == NULL)
        return 0;
    const json_t *pod = osub_json_get_ci(args, "Pod");
    if (pod == NULL)
        pod = args;
    struct osub_pod_policy pol;
    osub_pod_policy_default(&pol);
    char why[400];
    int64_t mib;
    if (osub_pod_vram(pod, &mib, why, sizeof(why)) == 0 && mib < 0)
        abort();
    json_t *spec = osub_pod_spec(pod, &pol, "node-1", why, sizeof(why));
    if (spec != NULL) {
        /* what goes to a node: an id oversubd accepts, a positive request */
        const char *id = json_string_value(json_object_get(spec, "id"));
        if (id == NULL || strncmp(id, "pod-", 4) != 0 || strlen(id) > 63 ||
            json_integer_value(json_object_get(spec, "vram_mib")) <= 0)
            abort();
        char *text = json_dumps(spec, JSON_COMPACT);
        free(text);
        json_decref(spec);
    } else if (why[0] == '\0') {
        abort(); /* a refusal always says why */
    }
    json_decref(args);
    return 0;
}
