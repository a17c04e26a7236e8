/* segtool.c - makes and reads grant segments for the shim's tests, as oversubd does:
 *   segtool create PATH DEVICES GRANT_MIB   segtool grant PATH DEVICE MIB
 *   segtool show PATH                       segtool reclaim PATH
 *   segtool offsets (the header fields' byte offsets) */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "segment.h"

static int usage(void)
{
    fprintf(stderr, "usage: segtool create PATH DEVICES GRANT_MIB | grant PATH DEVICE MIB | "
                    "show PATH | reclaim PATH\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "offsets") == 0) {
        /* where a hostile service would write (test_shim.sh) */
        printf("n_devices=%zu n_slots=%zu reserved0=%zu\n", offsetof(struct osub_seg, n_devices),
               offsetof(struct osub_seg, n_slots),
               offsetof(struct osub_seg, dev) + offsetof(struct osub_seg_dev, reserved_bytes));
        return 0;
    }
    if (argc < 3)
        return usage();
    struct osub_segment g;
    char err[256];
    if (strcmp(argv[1], "create") == 0 && argc == 5) {
        uint32_t n = (uint32_t)atoi(argv[3]);
        uint64_t grant[OSUB_SEG_DEVICES];
        for (int i = 0; i < OSUB_SEG_DEVICES; i++)
            grant[i] = strtoull(argv[4], NULL, 10) << 20;
        if (osub_seg_create(&g, argv[2], (uid_t)-1, (gid_t)-1, "test", n, grant, err,
                            sizeof(err)) != 0) {
            fprintf(stderr, "segtool: %s\n", err);
            return 1;
        }
        osub_seg_cleanup(&g);
        return 0;
    }
    if (osub_seg_open(&g, argv[2], err, sizeof(err)) != 0) {
        fprintf(stderr, "segtool: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (strcmp(argv[1], "grant") == 0 && argc == 5) {
        osub_seg_set_grant(&g, (uint32_t)atoi(argv[3]), strtoull(argv[4], NULL, 10) << 20);
    } else if (strcmp(argv[1], "show") == 0 && argc == 3) {
        printf("live=%d reclaimed_slots=%" PRIu64 " reclaimed_mib=%" PRIu64 "\n", osub_seg_live(&g),
               atomic_load(&g.s->reclaimed_slots), atomic_load(&g.s->reclaimed_bytes) >> 20);
        for (uint32_t d = 0; d < g.n_devices; d++)
            printf("dev=%u grant_mib=%" PRIu64 " reserved_mib=%" PRIu64 " reserved=%" PRIu64
                   " peak_mib=%" PRIu64 " refused=%" PRIu64 "\n",
                   d, osub_seg_grant(&g, d) >> 20, osub_seg_reserved(&g, d) >> 20,
                   osub_seg_reserved(&g, d), atomic_load(&g.s->dev[d].peak_bytes) >> 20,
                   atomic_load(&g.s->dev[d].refused));
    } else if (strcmp(argv[1], "reclaim") == 0 && argc == 3) {
        uint64_t b = 0;
        int n = osub_seg_reclaim(&g, &b);
        printf("reclaimed slots=%d mib=%" PRIu64 "\n", n, b >> 20);
    } else {
        rc = usage();
    }
    osub_seg_cleanup(&g);
    return rc;
}
