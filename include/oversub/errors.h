/* errors.h - the project's error codes, one X-macro list generating the enum and the messages */
#ifndef OVERSUB_ERRORS_H
#define OVERSUB_ERRORS_H

#include "oversub/visibility.h"

/*
 * Every fallible function in liboversub returns 0 or one of these negative codes.
 * XX(name, value, api code, message): the api code is the stable string the REST API
 * and the CLI print ({"error": {"code": ...}}).
 */
#define OSUB_ERRNO_MAP(XX)                                                                         \
    XX(NOMEM, -1001, "out_of_memory", "out of memory")                                             \
    XX(INVAL, -1002, "invalid_argument", "invalid argument")                                       \
    XX(BAD_ID, -1003, "invalid_id",                                                                \
       "a service id is 1-63 characters of [a-z0-9-] starting with a letter")                      \
    XX(BAD_VRAM, -1004, "invalid_vram", "vram_mib must be a positive number of MiB")               \
    XX(TOO_BIG, -1005, "too_big", "the request could not fit even on an empty pool")               \
    XX(BAD_MIN_VRAM, -1006, "invalid_min_vram", "min_vram_mib must be between 1 and vram_mib")     \
    XX(BACKED_PREEMPTIBLE, -1007, "backed_preemptible",                                            \
       "a service of a non-preemptible class cannot be marked preemptible")                        \
    XX(EXCLUSIVE_PREEMPTIBLE, -1008, "exclusive_preemptible",                                      \
       "an exclusive service cannot be preemptible")                                               \
    XX(RATIO_PRECISION, -1009, "ratio_precision", "a ratio has at most three decimals")            \
    XX(RATIO_RANGE, -1010, "ratio_range", "a ratio must be between 1.0 and 100.0")                 \
    XX(UNKNOWN_CLASS, -1011, "unknown_class", "no such priority class")                            \
    XX(SPEC_CONFLICT, -1012, "spec_conflict", "a live service with this id has a different spec")  \
    XX(TOO_MANY_GPUS, -1013, "too_many_gpus",                                                      \
       "the service asks for more GPUs of one size than the pool has")                             \
    XX(UNKNOWN_SERVICE, -1014, "unknown_service", "no such service")                               \
    XX(NEGATIVE_USAGE, -1015, "negative_usage", "usage cannot be negative")                        \
    XX(NO_DIRECTIVE, -1016, "no_directive", "the service has no directive to acknowledge")         \
    XX(BAD_STATE, -1017, "bad_state", "the service is not in a state that allows this")            \
    XX(BAD_GPU, -1018, "unknown_gpu", "no such GPU")                                               \
    XX(BAD_BATCH, -1019, "invalid_batch", "min_batch_size must be between 1 and batch_size")       \
    XX(BAD_COMPUTE, -1020, "invalid_compute", "compute_pct must be between 0 and 100")             \
    XX(NO_ROOM, -1021, "no_room", "no room for the service and it does not wait in the queue")     \
    XX(OVERCOMMITTED, -1022, "overcommitted",                                                      \
       "the pool is over-committed after a ratio change: nothing is admitted until grants fit")    \
    XX(TIME_BACKWARDS, -1023, "time_backwards", "the engine's clock cannot go backwards")          \
    XX(BAD_SIZE, -1024, "invalid_size",                                                            \
       "a size is a number with an optional MiB, GiB, MB or GB suffix")                            \
    XX(BAD_RATIO, -1025, "invalid_ratio", "a ratio is a decimal number such as 1.3")               \
    XX(BAD_POOL, -1026, "invalid_pool", "a pool is written like 8x81920 or 4x81920,4x40960")       \
    XX(BAD_GPU_COUNT, -1027, "invalid_gpus", "gpus must be between 1 and the pool's GPU count")    \
    XX(BAD_CONFIG, -1028, "invalid_config", "invalid pool configuration")                          \
    XX(BAD_CLASS, -1029, "invalid_class", "invalid class definition")                              \
    XX(GPU_LOST, -1030, "gpu_lost", "the GPU is lost")                                             \
    XX(BAD_ON_EVICT, -1031, "invalid_on_evict", "on_evict: requeue needs a resumable service")     \
    XX(BAD_TIME, -1032, "invalid_time", "a time must be between 0 and 2^53 ms")                    \
    XX(NO_SHRINK_BELOW_MIN, -1033, "below_min", "a resize cannot put vram_mib below min_vram_mib") \
    XX(BAD_SNAPSHOT, -1034, "invalid_snapshot",                                                    \
       "the engine snapshot is corrupt or of another version")                                     \
    XX(BACKED_SUSPEND, -1035, "backed_suspend",                                                    \
       "a backed (non-preemptible) service cannot declare suspend: it is never preempted")         \
    XX(BAD_SUSPEND, -1036, "invalid_suspend",                                                      \
       "suspend.method is cuda, vllm, sglang or http; vllm, sglang and http need a url, http "     \
       "its suspend and resume paths; residual_mib is at most the request")                        \
    XX(NOT_SUSPENDABLE, -1037, "not_suspendable", "the service declares no suspend method")        \
    XX(HOST_FULL, -1038, "host_budget",                                                            \
       "suspending it would exceed the pool's host memory budget for suspended services")

typedef enum {
    OSUB_OK = 0,
#define OSUB__ERR_ENUM(name, value, code, msg) OSUB_E##name = (value),
    OSUB_ERRNO_MAP(OSUB__ERR_ENUM)
#undef OSUB__ERR_ENUM
} osub_errno_t;

/* Returns a sentence explaining rc (static storage; never NULL; thread-safe). */
OSUB_API const char *osub_strerror(int rc);
/* Returns the stable API code of rc, e.g. "unknown_class" (static storage; never NULL). */
OSUB_API const char *osub_errcode(int rc);

#endif
