/* command.h - engine commands as JSON: what the daemon logs, replays and applies */
#ifndef OSUB_DAEMON_COMMAND_H
#define OSUB_DAEMON_COMMAND_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "oversub/engine.h"

/*
 * One command is a JSON object {"op": ..., args}: submit {spec, dry_run?, running?}, release
 * {id}, resize {id, vram_mib?, min_vram_mib?, batch_size?}, usage {id, vram_mib,
 * compute_pct?} or {id, gpus: [MiB...]}, system {gpu, vram_mib}, ready {id}, ack {id,
 * checkpoint?}, exited {id, checkpoint?}, fail {id, why?}, ratio {ratio_milli}, cordon {gpu,
 * on}, drain {gpu}, lost {gpu}, tick {}, note {id, kind} (the daemon's own event: no-op). The same
 * object is applied live and replayed from the log at start-up: the engine being deterministic, a
 * replay ends in exactly the same state.
 */

/* Applies cmd (borrowed) at now_ms. Returns the engine's code (0 or OSUB_E*), or
 * OSUB_EINVAL with a sentence in err for a malformed command. For a submit, *res is filled
 * when res is not NULL. */
int osubd__cmd_apply(osub_engine_t *e, const json_t *cmd, int64_t now_ms, osub_submit_result_t *res,
                     char *err, size_t errlen);

#endif
