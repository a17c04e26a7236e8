/* demo.h - oversub demo: DESIGN.md's worked scenario against a daemon, narrated */
#ifndef OSUB_CLI_DEMO_H
#define OSUB_CLI_DEMO_H

#include <stdio.h>

/* Prints the demo's usage to f. */
void cli_demo_usage(FILE *f);

/* argv[0] is "demo". Returns the exit code (0 ok, 1 the scenario went differently, 2 usage,
 * 3 no daemon). */
int cli_demo(int argc, char **argv);

#endif
