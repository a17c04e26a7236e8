/* fuzz_trace.c - mutation fuzzing of the trace importers and a replay of whatever they accept:
 * every input must give a clear error or a trace that replays; under the sanitizer build any
 * memory error or undefined behaviour fails the run. Deterministic: a fixed seed. */
#define _XOPEN_SOURCE 700
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim.h"
#include "trace.h"

static uint64_t rng = 20261130;

static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static const char alphabet[] = ",:{}[]\n\r\"-.0123456789ax #";

/* Writes base, mutated a few times, to path. */
static void write_mutated(const char *path, const char *base, bool mutate)
{
    size_t n = strlen(base);
    char *b = malloc(n + 64);
    memcpy(b, base, n);
    int muts = mutate ? 1 + (int)(rnd() % 8) : 0;
    for (int m = 0; m < muts && n > 0; m++) {
        size_t i = rnd() % n;
        switch (rnd() % 4) {
        case 0:
            b[i] = (char)(rnd() % 256);
            break;
        case 1:
            if (n < strlen(base) + 60) {
                memmove(b + i + 1, b + i, n - i);
                b[i] = alphabet[rnd() % (sizeof(alphabet) - 1)];
                n++;
            }
            break;
        case 2: {
            size_t k = 1 + rnd() % 10;
            if (i + k > n)
                k = n - i;
            memmove(b + i, b + i + k, n - i - k);
            n -= k;
            break;
        }
        default:
            n = i; /* truncated */
        }
    }
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
    free(b);
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 1500;
    char dir[] = "/tmp/osub-fuzz-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char sj[300], sy[300], us[300], gd[300], gv[400], gl[400];
    snprintf(sj, sizeof(sj), "%s/s.json", dir);
    snprintf(sy, sizeof(sy), "%s/s.yaml", dir);
    snprintf(us, sizeof(us), "%s/u.csv", dir);
    snprintf(gd, sizeof(gd), "%s/genai", dir);
    mkdir(gd, 0700);
    snprintf(gv, sizeof(gv), "%s/genai_pod_vram.csv", gd);
    snprintf(gl, sizeof(gl), "%s/genai_model_load_ms.csv", gd);
    const char *json =
        "{\"services\": [{\"id\": \"web\", \"class\": \"online\", \"vram_mib\": 20000},"
        " {\"id\": \"job\", \"class\": \"batch\", \"vram\": \"30GiB\", \"min_vram\": "
        "\"10GiB\", \"resumable\": true}]}";
    const char *yaml = "services:\n  - {id: web, class: online, vram_mib: 20000}\n  - id: job\n"
                       "    class: batch\n    vram: 30GiB\n    min_vram_mib: 9000\n";
    char usage[4096] = "timestamp_s,service,vram_mib,compute_pct\n";
    char vram[4096] = "timestamp_s,pod,vram_bytes\n";
    for (int t = 0; t < 600; t += 60) {
        char line[128];
        snprintf(line, sizeof(line), "%d,web,15000,40\n%d,job,%d,30\n", t, t, 10000 + t);
        strcat(usage, line);
        snprintf(line, sizeof(line), "%d,a1b2,%d.5\n%d,c3d4,%d\n", 1662858720 + t,
                 20000000 + t * 1000, 1662858720 + t, 30000000);
        strcat(vram, line);
    }
    const char *loadms = "timestamp_s,pod,load_ms\n1,a1b2,2639\n2,c3d4,39010.5\n";
    int accepted = 0, refused = 0;
    struct sim_budget b = {.evict_budget_per_week = 5, .unmet_budget_milli = 10, .max_wait_s = 300};
    int64_t pool[2] = {81920, 81920};
    for (int it = 0; it < iters; it++) {
        struct trace tr;
        char err[512];
        int rc;
        if (it % 3 == 2) {
            write_mutated(gv, vram, it % 2 == 0);
            write_mutated(gl, loadms, it % 5 == 0);
            struct genai_opts g;
            genai_opts_default(&g);
            rc = trace_import_genai(gd, &g, &tr, err, sizeof(err));
        } else {
            const char *sp = it % 2 ? sy : sj;
            write_mutated(sp, it % 2 ? yaml : json, it % 4 != 1);
            write_mutated(us, usage, it % 4 != 3);
            rc = trace_import_files(sp, us, &tr, err, sizeof(err));
        }
        if (rc != 0) {
            if (err[0] == '\0') {
                fprintf(stderr, "fuzz: iteration %d refused without a message\n", it);
                return 1;
            }
            refused++;
            continue;
        }
        accepted++;
        for (int p = 0; p < POL__COUNT; p++) {
            struct sim_opts o = {
                .policy = (enum sim_policy)p, .ratio_milli = 1500, .pool = pool, .n_pool = 2};
            struct sim_result r;
            if (sim_run(&tr, &o, &b, &r, err, sizeof(err)) == 0)
                sim_result_free(&r);
        }
        trace_free(&tr);
    }
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    printf("fuzz: %d inputs, %d accepted and replayed, %d refused with a message\n", iters,
           accepted, refused);
    printf("%d passed, 0 failed\n", iters);
    return 0;
}
