/* daemon_cmds.h - the oversub CLI's commands that talk to oversubd */
#ifndef OSUB_CLI_DAEMON_CMDS_H
#define OSUB_CLI_DAEMON_CMDS_H

#include <stdbool.h>
#include <stdio.h>

/* argv[0] is the command (status, list, deploy, ready, resize, release, usage, events,
 * explain, queue, logs, gpu, ratio); the global options --url URL and --json may come
 * anywhere before "--". Returns the exit code: 0 ok, 1 refused by the daemon (ready: the
 * service failed or is gone), 2 usage error, 3 cannot reach the daemon (ready: timed out). */
int cli_daemon_cmd(int argc, char **argv);

/* Whether name is one of those commands. */
bool cli_daemon_has(const char *name);

/* Prints name's usage (synopsis, what it does, its flags, an example) to f; -1 if unknown. */
int cli_daemon_usage(const char *name, FILE *f);

/* Prints one line per command ("  name   summary") to f. */
void cli_daemon_list(FILE *f);

#endif
