/* advise.h - recommend an oversell ratio from a usage trace, with the evidence */
#ifndef OSUB_CLI_ADVISE_H
#define OSUB_CLI_ADVISE_H

#include <stdbool.h>

#include "sim.h"
#include "trace.h"

/* Prints the recommendation, the evidence table and the caveats (or JSON). Returns 0 or -1. */
int advise_run(const struct sim_budget *b, const char *gpus, int32_t r_from, int32_t r_to,
               int32_t r_step, const struct trace *tr, bool json, bool quiet);

#endif
