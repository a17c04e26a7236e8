/* fuzz_seg.c - libFuzzer target: a grant segment as a hostile service may leave it, read as
 * oversubd reads it (src/shim/segment.c): the bytes become the file's first bytes (the rest as
 * created), then the header check, a reclaim, the grants written, the view. Nothing may read
 * or write outside the mapping, and every figure the view gives is bounded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "segment.h"

#define MIB (1ull << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct osub_segment g;
    static int made;
    char err[256];
    if (!made) {
        if (osub_seg_create_anon(&g, 4, 1000 * MIB, err, sizeof(err)) != 0)
            abort();
        made = 1;
    }
    /* the input's first byte picks the geometry the daemon believes (1..16 devices) */
    uint32_t n = size > 0 ? 1u + data[0] % OSUB_SEG_DEVICES : 4;
    memset(g.s, 0, sizeof(*g.s));
    g.n_devices = n;
    g.n_slots = OSUB_SEG_SLOTS;
    memcpy(g.s, data, size < sizeof(*g.s) ? size : sizeof(*g.s));
    char why[300];
    int bad = osub_seg_check(&g, true, why, sizeof(why));
    if (bad != 0 && why[0] == '\0')
        abort(); /* a refusal says why */
    if (osub_seg_check(&g, false, why, sizeof(why)) != 0)
        abort(); /* and the repair holds */
    uint64_t got = 0;
    int n_rec = osub_seg_reclaim(&g, &got);
    if (n_rec < 0 || n_rec > OSUB_SEG_SLOTS)
        abort();
    for (uint32_t i = 0; i < n + 2; i++)
        osub_seg_set_grant(&g, i, 500 * MIB);
    struct osub_seg_view v = {0};
    int rc = osub_seg_view(&g, 80000 * MIB, &v, why, sizeof(why));
    if (v.n != n || v.live < 0 || v.live > OSUB_SEG_SLOTS)
        abort();
    for (uint32_t i = 0; i < v.n; i++)
        if (v.held[i] > 80000 * MIB || v.peak[i] > 80000 * MIB || v.grant[i] != 500 * MIB)
            abort();
    if (rc != 0 && why[0] == '\0')
        abort();
    if (osub_seg_grant(&g, n) != 0 || osub_seg_reserved(&g, n) != 0)
        abort(); /* beyond the geometry: nothing, whatever the header says */
    return 0;
}
