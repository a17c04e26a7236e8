/* test_monitor.c - the machine's pool as the monitor gives it to the core (monitor.h):
 * simulated specs, "auto" without a driver, specs refused with a sentence, NVML's GPUs through
 * the fake libnvidia-ml (tests/fakes/fake_nvml.c, its GPUs in the file FAKE_NVML_FILE names);
 * then the monitor's start on the fake core (fake_core.h): the UUIDs a new state keeps, a GPU
 * gone across a restart marked lost, a state of NVML GPUs refused without NVML */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_core.h"
#include "log.h"
#include "monitor.h"

#ifndef FAKE_NVML_LIB
#error "FAKE_NVML_LIB: the path of the fake libnvidia-ml.so.1 (tests/daemon_units.cmake)"
#endif

struct fixture {
    char dir[64];
    char gpus_file[128];
    struct osubd_config cfg;
    struct osubd_gpus gpus;
    struct osubd_pool *pool; /* ~400 KiB: on the heap */
    struct osubd_monitor *m;
    struct osubd_core *c;
    FILE *log;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/osubd-monitor-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->gpus_file, sizeof(f->gpus_file), "%s/gpus", f->dir);
    setenv("FAKE_NVML_FILE", f->gpus_file, 1);
    osubd_config_default(&f->cfg);
    snprintf(f->cfg.state_path, sizeof(f->cfg.state_path), "%s/state.db", f->dir);
    f->pool = calloc(1, sizeof(*f->pool));
    assert_non_null(f->pool);
    f->log = tmpfile(); /* the warnings the monitor gives */
    assert_non_null(f->log);
    osubd_log_set_stream(f->log);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    osubd_monitor_free(f->m); /* before the core: its poll is on the core's loop */
    osubd_core_free(f->c);
    osubd_log_set_stream(NULL);
    fclose(f->log);
    unlink(f->gpus_file);
    rmdir(f->dir);
    free(f->pool);
    free(f);
    unsetenv("FAKE_NVML_FILE");
    return 0;
}

static void use_lib(struct fixture *f, const char *lib)
{
    snprintf(f->cfg.nvml_lib, sizeof(f->cfg.nvml_lib), "%s", lib);
    f->m = osubd_monitor_new(&f->cfg, &f->gpus);
    assert_non_null(f->m);
}

static void write_gpus(const struct fixture *f, const char *text)
{
    FILE *g = fopen(f->gpus_file, "w");
    assert_non_null(g);
    fputs(text, g);
    fclose(g);
}

static const char two_gpus[] = "gpu GPU-aaaa-1111 NVIDIA-A100-SXM4-80GB 81920 500 10\n"
                               "gpu GPU-bbbb-2222 NVIDIA-A100-PCIE-40GB 40960 700 0\n"
                               "proc GPU-aaaa-1111 4242 300\n";

/* ---- the pool ------------------------------------------------------------------------------ */

static void test_sim_pool(void **state)
{
    struct fixture *f = *state;
    use_lib(f, "/nonexistent/libnvidia-ml.so.1");
    char err[600] = "";
    assert_int_equal(osubd_monitor_pool(f->m, "sim:2x81920", f->pool, err, sizeof(err)), 0);
    assert_int_equal(f->pool->n, 2);
    assert_int_equal(f->pool->vram[0], 81920);
    assert_int_equal(f->pool->vram[1], 81920);
    assert_false(f->pool->nvml);
    assert_string_equal(f->pool->names[0], "");
    assert_non_null(strstr(f->pool->desc, "simulated pool 2x81920"));
    assert_int_equal(f->gpus.n, 0); /* no UUIDs for a simulated pool */
    assert_int_equal(osubd_monitor_pool(f->m, "sim:1x80GiB,2x40960", f->pool, err, sizeof(err)), 0);
    assert_int_equal(f->pool->n, 3);
    assert_int_equal(f->pool->vram[0], 81920);
    assert_int_equal(f->pool->vram[2], 40960);
}

static void test_auto_without_driver(void **state)
{
    struct fixture *f = *state;
    use_lib(f, "/nonexistent/libnvidia-ml.so.1");
    char err[600] = "";
    assert_int_equal(osubd_monitor_pool(f->m, "auto", f->pool, err, sizeof(err)), 0);
    assert_int_equal(f->pool->n, 8);
    for (size_t i = 0; i < 8; i++)
        assert_int_equal(f->pool->vram[i], 81920);
    assert_false(f->pool->nvml);
    assert_non_null(strstr(f->pool->desc, "no NVIDIA driver"));
    assert_non_null(strstr(f->pool->desc, "/nonexistent/libnvidia-ml.so.1"));
    assert_non_null(strstr(f->pool->desc, "8 x 81920 MiB"));
}

static void test_nvml_without_driver_refused(void **state)
{
    struct fixture *f = *state;
    use_lib(f, "/nonexistent/libnvidia-ml.so.1");
    char err[600] = "";
    assert_int_equal(osubd_monitor_pool(f->m, "nvml", f->pool, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "--gpus nvml: cannot load /nonexistent/libnvidia-ml.so.1"));
}

static void test_bad_specs_refused(void **state)
{
    struct fixture *f = *state;
    use_lib(f, "/nonexistent/libnvidia-ml.so.1");
    static const struct {
        const char *spec;
        const char *why;
    } cases[] = {
        {"sim:", "is not a pool"},
        {"sim:0x81920", "is not a pool"},
        {"sim:2x", "is not a pool"},
        {"sim:x81920", "is not a pool"},
        {"sim:2x81920,", "is not a pool"},
        {"garbage", "is not auto, nvml or sim:POOL"},
        {"", "is not auto, nvml or sim:POOL"},
        {"2x81920", "is not auto, nvml or sim:POOL"},
        {"AUTO", "is not auto, nvml or sim:POOL"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[600] = "";
        int rc = osubd_monitor_pool(f->m, cases[i].spec, f->pool, err, sizeof(err));
        if (rc != -1 || strstr(err, cases[i].why) == NULL)
            fail_msg("'%s': rc %d, '%s' (wanted '%s')", cases[i].spec, rc, err, cases[i].why);
        char quoted[80];
        snprintf(quoted, sizeof(quoted), "'%s'", cases[i].spec);
        assert_non_null(strstr(err, quoted)); /* the sentence names what was given */
    }
}

static void test_nvml_gives_its_gpus(void **state)
{
    struct fixture *f = *state;
    write_gpus(f, two_gpus);
    use_lib(f, FAKE_NVML_LIB);
    char err[600] = "";
    assert_int_equal(osubd_monitor_pool(f->m, "nvml", f->pool, err, sizeof(err)), 0);
    assert_true(f->pool->nvml);
    assert_int_equal(f->pool->n, 2);
    assert_int_equal(f->pool->vram[0], 81920);
    assert_int_equal(f->pool->vram[1], 40960);
    assert_string_equal(f->pool->names[0], "NVIDIA-A100-SXM4-80GB");
    assert_string_equal(f->pool->names[1], "NVIDIA-A100-PCIE-40GB");
    assert_non_null(strstr(f->pool->desc, "2 GPU(s) from NVML"));
    assert_int_equal(f->gpus.n, 2);
    assert_string_equal(osubd_gpu_uuid(&f->gpus, 0), "GPU-aaaa-1111");
    assert_string_equal(osubd_gpu_uuid(&f->gpus, 1), "GPU-bbbb-2222");
    assert_string_equal(osubd_gpu_uuid(&f->gpus, 2), "");
}

static void test_auto_with_driver_is_nvml(void **state)
{
    struct fixture *f = *state;
    write_gpus(f, two_gpus);
    use_lib(f, FAKE_NVML_LIB);
    char err[600] = "";
    assert_int_equal(osubd_monitor_pool(f->m, "auto", f->pool, err, sizeof(err)), 0);
    assert_true(f->pool->nvml);
    assert_int_equal(f->pool->n, 2);
    assert_int_equal(f->gpus.n, 2);
}

static void test_nvml_without_gpus_refused(void **state)
{
    struct fixture *f = *state;
    write_gpus(f, "# a driver that sees no device\n");
    use_lib(f, FAKE_NVML_LIB);
    char err[600] = "";
    assert_int_equal(osubd_monitor_pool(f->m, "nvml", f->pool, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "NVML reports no GPU"));
}

static void test_auto_driver_not_loaded(void **state)
{
    struct fixture *f = *state; /* no FAKE_NVML_FILE: the fake's nvmlInit fails */
    use_lib(f, FAKE_NVML_LIB);
    char err[600] = "";
    assert_int_equal(osubd_monitor_pool(f->m, "auto", f->pool, err, sizeof(err)), 0);
    assert_false(f->pool->nvml);
    assert_int_equal(f->pool->n, 8);
    assert_non_null(strstr(f->pool->desc, "nvmlInit failed"));
}

/* ---- the start, on the fake core ----------------------------------------------------------- */

/* The fake core opened on the monitor's pool (NVML's GPUs), its modules (none) loaded. */
static void open_nvml_core(struct fixture *f)
{
    write_gpus(f, two_gpus);
    use_lib(f, FAKE_NVML_LIB);
    snprintf(f->cfg.gpus, sizeof(f->cfg.gpus), "nvml");
    f->c = osubd_core_new(&f->cfg);
    assert_non_null(f->c);
    char err[600] = "";
    assert_int_equal(osubd_core_open(f->c, osubd_monitor_pool, f->m, err, sizeof(err)), 0);
    assert_string_equal(osubd_core_pool(f->c), "nvml");
    assert_int_equal(osub_engine_gpu_count(osubd_core_engine(f->c)), 2);
    assert_int_equal(osubd_core_load(f->c, err, sizeof(err)), 0);
}

static void test_start_new_state_keeps_uuids(void **state)
{
    struct fixture *f = *state;
    open_nvml_core(f);
    char err[600] = "";
    assert_int_equal(osubd_monitor_start(f->m, f->c, NULL, err, sizeof(err)), 0);
    const char *kept = fake_core_meta_text(f->c, "gpu_uuids");
    assert_non_null(kept);
    assert_string_equal(kept, "GPU-aaaa-1111,GPU-bbbb-2222");
    assert_int_equal(fake_core_n_cmds(f->c), 0);
}

static void test_start_gpu_gone_marked_lost(void **state)
{
    struct fixture *f = *state;
    open_nvml_core(f);
    char err[600] = "";
    /* the last run knew another GPU 1 */
    assert_int_equal(
        osubd_core_meta_set(f->c, "gpu_uuids", "GPU-aaaa-1111,GPU-gone-9999", err, sizeof(err)), 0);
    fake_core_set_existing(f->c, true);
    assert_int_equal(osubd_monitor_start(f->m, f->c, NULL, err, sizeof(err)), 0);
    assert_int_equal(fake_core_n_cmds(f->c), 1);
    const struct fake_core_cmd *cmd = fake_core_last_cmd(f->c);
    assert_string_equal(cmd->text, "{\"gpu\":1,\"op\":\"lost\"}");
    assert_int_equal(cmd->rc, 0);
    osub_gpu_info_t gi;
    assert_int_equal(osub_engine_gpu_info(osubd_core_engine(f->c), 1, &gi), 0);
    assert_true(gi.lost);
    assert_int_equal(osub_engine_gpu_info(osubd_core_engine(f->c), 0, &gi), 0);
    assert_false(gi.lost);
    /* the table is the state's: the UUIDs it was made with */
    assert_int_equal(f->gpus.n, 2);
    assert_string_equal(osubd_gpu_uuid(&f->gpus, 1), "GPU-gone-9999");
}

static void test_start_nvml_state_without_nvml_refused(void **state)
{
    struct fixture *f = *state;
    open_nvml_core(f);
    fake_core_set_existing(f->c, true);
    /* a second run where the driver is gone: its monitor cannot open NVML */
    struct osubd_config cfg2 = f->cfg;
    snprintf(cfg2.nvml_lib, sizeof(cfg2.nvml_lib), "/nonexistent/libnvidia-ml.so.1");
    struct osubd_gpus gpus2 = {0};
    struct osubd_monitor *m2 = osubd_monitor_new(&cfg2, &gpus2);
    assert_non_null(m2);
    char err[600] = "";
    assert_int_equal(osubd_monitor_start(m2, f->c, NULL, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "holds the state of NVML GPUs, but NVML does not answer"));
    assert_int_equal(fake_core_n_cmds(f->c), 0); /* no GPU marked lost */
    osubd_monitor_free(m2);
}

static void test_start_simulated_state(void **state)
{
    struct fixture *f = *state;
    use_lib(f, "/nonexistent/libnvidia-ml.so.1");
    f->c = fake_core_new(&f->cfg, "2x81920");
    assert_non_null(f->c);
    fake_core_set_existing(f->c, true);
    char err[600] = "";
    assert_int_equal(osubd_core_load(f->c, err, sizeof(err)), 0);
    assert_int_equal(osubd_monitor_start(f->m, f->c, NULL, err, sizeof(err)), 0);
    assert_int_equal(fake_core_n_cmds(f->c), 0);
    assert_null(fake_core_meta_text(f->c, "gpu_uuids"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sim_pool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auto_without_driver, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nvml_without_driver_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_specs_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nvml_gives_its_gpus, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auto_with_driver_is_nvml, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nvml_without_gpus_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auto_driver_not_loaded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_new_state_keeps_uuids, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_gpu_gone_marked_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_nvml_state_without_nvml_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_start_simulated_state, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
