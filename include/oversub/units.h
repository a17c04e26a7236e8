/* units.h - parsing of what people type (ratios, sizes, pools) into the engine's exact integers */
#ifndef OVERSUB_UNITS_H
#define OVERSUB_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "oversub/visibility.h"

/*
 * Floats appear only where people type them and are converted exactly once, here.
 * No function here uses floating point: decimal text is converted digit by digit.
 * All functions are pure and thread-safe; `s` is borrowed and must be NUL-terminated.
 */

/* "1.3" -> 1300 (thousandths). At most three decimals (OSUB_ERATIO_PRECISION), value in
 * [1.000, 100.000] (OSUB_ERATIO_RANGE), otherwise OSUB_EBAD_RATIO. */
OSUB_API int osub_parse_ratio(const char *s, int32_t *milli_out);

/* Writes a ratio in thousandths as the shortest decimal ("1.3", "1.25", "2"). */
OSUB_API void osub_format_ratio(int32_t milli, char *buf, size_t len);

/* A size: a bare number is MiB; MiB/GiB (and Mi/Gi, M/G taken as binary) binary; MB/GB
 * decimal; KiB/KB and TiB/TB too. Rounded up to whole MiB ("0.1GiB" -> 103). Must be > 0
 * unless allow_zero. Up to nine decimals. Errors: OSUB_EBAD_SIZE. */
OSUB_API int osub_parse_size_mib(const char *s, int allow_zero, int64_t *mib_out);

/* A GPU size in MiB or a well-known name ("A100-80GB" -> 81920, "A100-40GB" -> 40960,
 * "H100-80GB" -> 81920, "H200" -> 143771, "L40S" -> 46068, "A10" -> 23028...). */
OSUB_API int osub_parse_gpu_size(const char *s, int64_t *mib_out);

/* A pool "8x81920" or "4x81920,4x40960" or "8xA100-80GB". Writes up to `cap` sizes (MiB, one
 * per GPU) to `vram_out` and their number to `n_out`. At most 4096 GPUs. OSUB_EBAD_POOL. */
OSUB_API int osub_parse_pool(const char *s, int64_t *vram_out, size_t cap, size_t *n_out);

#endif
