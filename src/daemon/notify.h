/* notify.h - systemd's readiness protocol (sd_notify(3)), spoken directly: one datagram to the
 * AF_UNIX socket named by $NOTIFY_SOCKET ("@name" for the abstract namespace). Without the
 * variable (not under systemd's Type=notify) it does nothing. No libsystemd needed. */
#ifndef OSUBD_NOTIFY_H
#define OSUBD_NOTIFY_H

/* Sends state ("READY=1\nSTATUS=...", "RELOADING=1", "STOPPING=1"). 0, or -1 (errno). */
int osubd_notify(const char *state);

#endif
