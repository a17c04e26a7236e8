/* report.h - simulate/advise output: the table, JSON and the SVG plot */
#ifndef OSUB_CLI_REPORT_H
#define OSUB_CLI_REPORT_H

#include <stdio.h>

#include <jansson.h>

#include "sim.h"

void report_table(FILE *f, const struct sim_result *r, size_t n);
/* One result as the JSON the issue names (new reference). */
json_t *report_json(const struct sim_result *r);
/* Writes the plot: used utilisation over time per policy, events over time, and the ratio
 * sweep (mean used utilisation and GPUs against the ratio) when there is one. Returns 0 or -1
 * (errno set). */
int report_svg(const char *path, const struct trace *tr, const struct sim_result *r, size_t n);

#endif
