/* scenario.c - runs DESIGN.md's worked scenario through the engine and prints each decision */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oversub/engine.h"
#include "oversub/units.h"

static void print_events(osub_engine_t *e)
{
    size_t n;
    const osub_event_t *ev = osub_engine_events(e, &n);
    for (size_t i = 0; i < n; i++)
        printf("  [%7.1f s] %-9s %-17s %s\n", (double)ev[i].time_ms / 1000.0,
               osub_event_name(ev[i].kind), osub_reason_name(ev[i].reason), ev[i].msg);
}

static void print_pool(osub_engine_t *e)
{
    osub_pool_info_t p;
    osub_engine_pool_info(e, &p);
    printf("  pool: granted %lld of logical %lld MiB (logical %.1f%%), held %lld of %lld MiB "
           "(held %.1f%%), used %lld MiB (used %.1f%%)\n",
           (long long)p.granted_mib, (long long)p.logical_mib,
           100.0 * (double)p.granted_mib / (double)p.logical_mib, (long long)p.held_mib,
           (long long)p.vram_mib, 100.0 * (double)p.held_mib / (double)p.vram_mib,
           (long long)p.used_mib, 100.0 * (double)p.used_mib / (double)p.vram_mib);
    for (size_t i = 0; i < osub_engine_service_count(e); i++) {
        osub_service_info_t si;
        osub_engine_service_info(e, osub_engine_service_id(e, i), &si);
        printf("    %-15s %-10s %-9s grant %6lld held %6lld used %6lld  GPUs", si.spec->id,
               si.spec->class_name, osub_state_name(si.state), (long long)si.grant_mib,
               (long long)si.held_mib, (long long)si.used_mib);
        for (int32_t j = 0; j < si.n_slots; j++)
            printf(" %d", si.slots[j].gpu);
        printf("\n");
    }
}

static void submit(osub_engine_t *e, const char *id, const char *cls, int64_t vram, int32_t gpus,
                   int64_t min_vram, int32_t compute, int64_t now)
{
    osub_spec_t s;
    osub_spec_init(&s, id, cls);
    s.vram_mib = vram;
    s.gpus = gpus;
    s.min_vram_mib = min_vram;
    s.compute_pct = compute;
    osub_submit_result_t r;
    int rc = osub_engine_submit(e, &s, now, 0, &r);
    if (rc != 0)
        printf("  submit %s: %s\n", id, osub_strerror(rc));
    print_events(e);
}

int main(int argc, char **argv)
{
    (void)argv;
    if (argc > 1) {
        printf("usage: oversub-scenario\n"
               "Runs DESIGN.md's worked scenario (8 x 81920 MiB, ratio 1.5, margin 0) through "
               "the engine and prints every decision with its reason.\n");
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    osub_pool_config_t cfg;
    osub_pool_config_default(&cfg);
    cfg.ratio_milli = 1500;
    int64_t vram[8];
    for (int i = 0; i < 8; i++)
        vram[i] = 81920;
    osub_engine_t *e;
    int rc = osub_engine_new(&cfg, vram, NULL, 8, NULL, 0, &e);
    if (rc != 0) {
        fprintf(stderr, "oversub-scenario: %s\n", osub_strerror(rc));
        return 1;
    }
    printf("DESIGN.md's worked scenario: pool 8 x 81920 MiB, ratio 1.5, margin 0\n\n");
    printf("Step 1: four services arrive\n");
    submit(e, "agent-online", "online", 163840, 2, 0, 100, 0);
    submit(e, "batch-analysis", "batch", 122880, 2, 61440, 0, 0);
    submit(e, "model-eval", "experiment", 102400, 2, 40960, 0, 0);
    submit(e, "new-service", "batch", 81920, 1, 0, 0, 0);
    print_pool(e);

    int64_t t = 15 * 60000;
    printf("\nStep 2: at 15 min all are ready and report usage\n");
    const char *ids[] = {"agent-online", "batch-analysis", "model-eval", "new-service"};
    int64_t used[] = {163840, 2 * 57344, 2 * 45056, 61440};
    for (int i = 0; i < 4; i++) {
        osub_engine_ready(e, ids[i], t);
        print_events(e);
        osub_engine_usage(e, ids[i], used[i], -1, t);
        print_events(e);
    }
    print_pool(e);

    printf("\nStep 3: chat-1 and chat-2 (online, 40960 MiB each)\n");
    submit(e, "chat-1", "online", 40960, 1, 0, 0, t);
    submit(e, "chat-2", "online", 40960, 1, 0, 0, t);

    t = 20 * 60000;
    printf("\nStep 4: at 20 min chat-3 (online, 40960 MiB) finds no room\n");
    submit(e, "chat-3", "online", 40960, 1, 0, 0, t);
    printf("\n  model-eval acknowledges its degrade\n");
    osub_engine_ack(e, "model-eval", NULL, t + 2000);
    print_events(e);
    print_pool(e);

    printf("\nStep 5 (the other branch, replayed on a fresh engine): model-eval ignores the "
           "directive\n");
    osub_engine_free(e);
    osub_engine_new(&cfg, vram, NULL, 8, NULL, 0, &e);
    submit(e, "agent-online", "online", 163840, 2, 0, 100, 0);
    submit(e, "batch-analysis", "batch", 122880, 2, 61440, 0, 0);
    submit(e, "model-eval", "experiment", 102400, 2, 40960, 0, 0);
    submit(e, "new-service", "batch", 81920, 1, 0, 0, 0);
    t = 15 * 60000;
    for (int i = 0; i < 4; i++) {
        osub_engine_ready(e, ids[i], t);
        osub_engine_usage(e, ids[i], used[i], -1, t);
    }
    submit(e, "chat-1", "online", 40960, 1, 0, 0, t);
    submit(e, "chat-2", "online", 40960, 1, 0, 0, t);
    t = 20 * 60000;
    submit(e, "chat-3", "online", 40960, 1, 0, 0, t);
    for (int64_t s = 1; s <= 45; s++) {
        if (s <= 30)
            osub_engine_usage(e, "model-eval", 2 * 45056, -1, t + s * 1000);
        else
            osub_engine_tick(e, t + s * 1000);
        print_events(e);
        if (s == 35) {
            printf("  model-eval's processes exit\n");
            osub_engine_exited(e, "model-eval", NULL, t + s * 1000);
            print_events(e);
        }
    }
    print_pool(e);
    osub_engine_free(e);
    return 0;
}
