/* daemon_cmds.h - the oversub CLI's commands that talk to oversubd */
#ifndef OSUB_CLI_DAEMON_CMDS_H
#define OSUB_CLI_DAEMON_CMDS_H

/* argv[0] is the command (status, deploy, resize, release, usage, events, explain, gpu,
 * ratio, queue). Returns the exit code: 0 ok, 1 refused by the daemon, 2 usage error, 3
 * cannot reach the daemon. */
int cli_daemon_cmd(int argc, char **argv);

#endif
