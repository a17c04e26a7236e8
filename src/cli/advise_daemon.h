/* advise_daemon.h - oversub advise --from-daemon: the brief's rule on a daemon's decisions */
#ifndef OSUB_CLI_ADVISE_DAEMON_H
#define OSUB_CLI_ADVISE_DAEMON_H

/* argv[0] is "advise". Returns the exit code (0, 1 refused, 2 usage, 3 unreachable). */
int cli_advise_daemon(int argc, char **argv);

#endif
