/* act_spawn.c - starting a managed process: its environment, user, folders, log, shim, cgroup */
#define _GNU_SOURCE
#include "act.h"

/* ---- starting a managed process ---------------------------------------------------------- */

/* The program's path: as given when it holds a '/', else the first executable in PATH. */
static int resolve(const char *prog, char *out, size_t len)
{
    if (strchr(prog, '/') != NULL) {
        snprintf(out, len, "%s", prog);
        return 0;
    }
    const char *path = getenv("PATH");
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(out, len, "%.*s/%s", (int)n, path, prog);
        if (access(out, X_OK) == 0)
            return 0;
        path += n + (colon ? 1 : 0);
    }
    return -1;
}

struct envb {
    char *v[256];
    size_t n;
};

static void env_set(struct envb *e, const char *k, const char *val)
{
    size_t kl = strlen(k);
    for (size_t i = 0; i < e->n; i++)
        if (strncmp(e->v[i], k, kl) == 0 && e->v[i][kl] == '=') {
            free(e->v[i]);
            e->v[i] = NULL;
            if (asprintf(&e->v[i], "%s=%s", k, val) < 0)
                e->v[i] = NULL;
            return;
        }
    if (e->n + 1 < sizeof(e->v) / sizeof(e->v[0]) && asprintf(&e->v[e->n], "%s=%s", k, val) >= 0)
        e->n++;
}

static const char *env_get(const struct envb *e, const char *k)
{
    size_t kl = strlen(k);
    for (size_t i = 0; i < e->n; i++)
        if (strncmp(e->v[i], k, kl) == 0 && e->v[i][kl] == '=')
            return e->v[i] + kl + 1;
    return NULL;
}

/* The service's grant segment for this start (docs/shim.md): one device per GPU of its
 * placement, as CUDA_VISIBLE_DEVICES numbers them, each granted the service's share there;
 * created afresh in the state's shim/ folder (0711: passable, not listable), 0600 and owned by
 * the user the service runs as. 0, or -1 with why. */
static int shim_prepare(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si,
                        const char *user, uid_t uid, gid_t gid, char *why, size_t len)
{
    if (p->seg.s != NULL) {
        osub_seg_cleanup(&p->seg);
        unlink(p->seg_path);
    }
    memset(p->seg_reported, 0, sizeof(p->seg_reported));
    if (si->n_slots < 1 || si->n_slots > OSUB_SEG_DEVICES) {
        snprintf(why, len, "the CUDA shim grants at most %d GPUs (the service has %d)",
                 OSUB_SEG_DEVICES, (int)si->n_slots);
        return -1;
    }
    char sd[512], dir[600];
    osubd__act_state_dir(d, sd, sizeof(sd));
    snprintf(dir, sizeof(dir), "%s/shim", sd);
    struct stat st;
    if (osubd__act_mkdirs(dir, 0711) != 0 || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
        chmod(dir, 0711) != 0) {
        snprintf(why, len, "cannot make %s for the CUDA shim: %s", dir, strerror(errno));
        return -1;
    }
    if (user != NULL && stat(sd, &st) == 0 && (st.st_mode & 0111) != 0111)
        chmod(sd, (st.st_mode & 07777) | 0111); /* passable by the service's user */
    snprintf(p->seg_path, sizeof(p->seg_path), "%s/%s.seg", dir, p->id);
    if (lstat(p->seg_path, &st) == 0)
        unlink(p->seg_path); /* a segment left by an earlier start or run: ours, in our folder */
    uint64_t grants[OSUB_SEG_DEVICES];
    for (int32_t i = 0; i < si->n_slots; i++)
        grants[i] = (uint64_t)si->slots[i].grant_mib << 20;
    char err[512];
    if (osub_seg_create(&p->seg, p->seg_path, user ? uid : (uid_t)-1, user ? gid : (gid_t)-1, p->id,
                        (uint32_t)si->n_slots, grants, err, sizeof(err)) != 0) {
        snprintf(why, len, "CUDA shim: %s", err);
        return -1;
    }
    return 0;
}

/* What a start needs, made before fork: after it, the child makes only async-signal-safe
 * calls. */
struct spawn {
    json_t *x; /* the service's exec */
    char path[PATH_MAX + 1];
    char why[PATH_MAX + 200];
    const char *user; /* NULL: oversubd's own */
    uid_t uid;
    gid_t gid;
    char ckdir[1024], logf[1024];
    bool ck_as_user; /* the checkpoint folder is made by the user, in the child */
    int logfd, nullfd, cgfd;
    char *argv[MAX_ARGS + 1];
    struct envb env;
    char gpus[3072]; /* CUDA_VISIBLE_DEVICES: up to 64 UUIDs */
    bool shim_on;
    const char *workdir;
};

/* The program and the user it runs as. */
static int spawn_program(struct osubd_act *d, struct spawn *sp)
{
    json_t *cmd = json_object_get(sp->x, "command");
    const char *prog = json_string_value(json_array_get(cmd, 0));
    if (resolve(prog, sp->path, sizeof(sp->path)) != 0) {
        snprintf(sp->why, sizeof(sp->why), "command '%.200s' was not found in PATH", prog);
        return -1;
    }
    struct stat st;
    if (stat(sp->path, &st) != 0 || !S_ISREG(st.st_mode) || access(sp->path, X_OK) != 0) {
        snprintf(sp->why, sizeof(sp->why), "command '%.200s' %s", sp->path,
                 stat(sp->path, &st) != 0 ? "does not exist"
                 : !S_ISREG(st.st_mode)   ? "is not a file"
                                          : "is not executable");
        return -1;
    }
    sp->user = json_string_value(json_object_get(sp->x, "user"));
    sp->uid = geteuid();
    sp->gid = getegid();
    if (sp->user != NULL) {
        struct passwd *pw = getpwnam(sp->user);
        if (pw == NULL) {
            snprintf(sp->why, sizeof(sp->why), "user '%.64s' no longer exists", sp->user);
            return -1;
        }
        sp->uid = pw->pw_uid;
        sp->gid = pw->pw_gid;
    }
    if (sp->uid == 0 && !d->cfg->allow_root_services) {
        snprintf(sp->why, sizeof(sp->why),
                 "it would run as root and allow_root_services is not set");
        return -1;
    }
    size_t argc = json_array_size(cmd);
    for (size_t i = 0; i < argc && i < MAX_ARGS; i++)
        sp->argv[i] = (char *)json_string_value(json_array_get(cmd, i));
    sp->argv[argc < MAX_ARGS ? argc : MAX_ARGS] = NULL;
    return 0;
}

/* Its log and checkpoint folders, and the descriptors its output goes to. */
static int spawn_folders(struct osubd_act *d, struct osub_proc *p, struct spawn *sp)
{
    char dir[1024];
    osubd__act_checkpoint_dir(d, p->id, sp->ckdir, sizeof(sp->ckdir));
    osubd__act_log_path(d, p->id, sp->logf, sizeof(sp->logf));
    snprintf(dir, sizeof(dir), "%s", sp->logf);
    *strrchr(dir, '/') = '\0';
    if (osubd__act_mkdirs(dir, 0700) != 0) {
        snprintf(sp->why, sizeof(sp->why), "cannot make %s: %s", dir, strerror(errno));
        return -1;
    }
    /* a folder the spec names, for a service that runs as another user, is made by that user
     * in the child (a root-made folder given away anywhere would be a way to root); the default
     * one, inside the state's folder, is made here and given to the user */
    const char *ck = sp->ckdir;
    sp->ck_as_user =
        sp->user != NULL && sp->uid != geteuid() && json_object_get(sp->x, "checkpoint_dir");
    if (sp->ck_as_user) {
        if (strstr(ck, "/../") != NULL || strcmp(ck + strlen(ck) - 3, "/..") == 0) {
            snprintf(sp->why, sizeof(sp->why), "%s: '..' is not allowed in a checkpoint folder",
                     ck);
            return -1;
        }
    } else if (osubd__act_service_dir(ck, sp->uid, sp->gid, sp->user != NULL, sp->why,
                                      sizeof(sp->why)) != 0) {
        return -1;
    }
    if (sp->user != NULL && json_object_get(sp->x, "checkpoint_dir") == NULL) {
        /* the default folder is inside the state's: the user must be able to pass through it
         * (traverse only: 0711 lists nothing; the state's files stay 0600) */
        char sd[512], cps[600];
        osubd__act_state_dir(d, sd, sizeof(sd));
        snprintf(cps, sizeof(cps), "%s/checkpoints", sd);
        struct stat st2;
        for (int k = 0; k < 2; k++) {
            const char *dpath = k == 0 ? sd : cps;
            if (stat(dpath, &st2) == 0 && (st2.st_mode & 0111) != 0111)
                chmod(dpath, (st2.st_mode & 07777) | 0111);
        }
    }
    sp->logfd = open(sp->logf, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    sp->nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (sp->logfd < 0 || sp->nullfd < 0) {
        snprintf(sp->why, sizeof(sp->why), "cannot open its log %s: %s", sp->logf, strerror(errno));
        return -1;
    }
    return 0;
}

/* A clean environment (docs/actuation.md): not oversubd's (HOME=/root and the rest), with
 * what oversub tells a service. */
static void spawn_env(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si,
                      struct spawn *sp)
{
    struct envb *env = &sp->env;
    struct passwd *pwu = getpwuid(sp->uid);
    env_set(env, "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    env_set(env, "HOME", pwu && pwu->pw_dir ? pwu->pw_dir : "/");
    if (pwu != NULL) {
        env_set(env, "USER", pwu->pw_name);
        env_set(env, "LOGNAME", pwu->pw_name);
    }
    for (char **e = environ; *e && env->n + 1 < 32; e++) {
        static const char *const pass[] = {"LANG=",         "LANGUAGE=",     "LC_",
                                           "TZ=",           "ASAN_OPTIONS=", "UBSAN_OPTIONS=",
                                           "LSAN_OPTIONS=", "TSAN_OPTIONS="};
        for (size_t i = 0; i < sizeof(pass) / sizeof(pass[0]); i++)
            if (strncmp(*e, pass[i], strlen(pass[i])) == 0) {
                char *dup = strdup(*e);
                if (dup != NULL)
                    env->v[env->n++] = dup;
                break;
            }
    }
    const char *k;
    json_t *ev;
    json_object_foreach(json_object_get(sp->x, "env"), k, ev)
        env_set(env, k, json_string_value(ev));
    char buf[1024], num[32];
    sp->gpus[0] = '\0';
    for (int32_t i = 0; i < si->n_slots; i++) {
        int32_t g = si->slots[i].gpu;
        size_t l = strlen(sp->gpus);
        if (g < d->gpus->n && d->gpus->uuid[g][0])
            snprintf(sp->gpus + l, sizeof(sp->gpus) - l, "%s%s", i ? "," : "", d->gpus->uuid[g]);
        else
            snprintf(sp->gpus + l, sizeof(sp->gpus) - l, "%s%d", i ? "," : "", g);
    }
    /* relocatable: the driver remaps a checkpoint only for a process that sees every GPU
     * (cuda-python#1983), so its own comes first (its device 0) and every other follows; the
     * shim grants it its own only */
    for (int32_t g = 0; si->spec != NULL && si->spec->suspend.relocate && si->n_slots == 1 &&
                        g < d->gpus->n && d->gpus->uuid[g][0];
         g++) {
        size_t l = strlen(sp->gpus);
        if (g != si->slots[0].gpu)
            snprintf(sp->gpus + l, sizeof(sp->gpus) - l, ",%s", d->gpus->uuid[g]);
    }
    env_set(env, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    env_set(env, "CUDA_VISIBLE_DEVICES", sp->gpus);
    env_set(env, "OVERSUB_SERVICE", p->id);
    snprintf(num, sizeof(num), "%lld", (long long)si->grant_mib);
    env_set(env, "OVERSUB_VRAM_MIB", num);
    snprintf(num, sizeof(num), "%d", si->batch_size);
    env_set(env, "OVERSUB_BATCH_SIZE", num);
    const char *host = d->cfg->listen_host;
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0 || host[0] == '\0')
        host = "127.0.0.1";
    snprintf(buf, sizeof(buf), strchr(host, ':') ? "http://[%s]:%d" : "http://%s:%d", host,
             d->cfg->listen_port);
    env_set(env, "OVERSUB_CONTROL_URL", buf);
    char tok[65];
    osubd_service_token(d->core, p->id, tok);
    env_set(env, "OVERSUB_TOKEN", tok);
    env_set(env, "OVERSUB_CHECKPOINT_DIR", sp->ckdir);
    if (si->checkpoint[0])
        env_set(env, "OVERSUB_RESUME_FROM", si->checkpoint);
}

/* The CUDA shim preloaded with the service's segment, unless the spec says cuda_shim: false. */
static int spawn_shim(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si,
                      struct spawn *sp)
{
    sp->shim_on = d->shim_path[0] && !json_is_false(json_object_get(sp->x, "cuda_shim"));
    if (!sp->shim_on)
        return 0;
    if (shim_prepare(d, p, si, sp->user, sp->uid, sp->gid, sp->why, sizeof(sp->why)) != 0)
        return -1;
    /* after what the service preloads itself (a sanitizer runtime must stay first) */
    const char *had = env_get(&sp->env, "LD_PRELOAD");
    char *pre = NULL;
    if (asprintf(&pre, "%s%s%s", had ? had : "", had && *had ? " " : "", d->shim_path) >= 0) {
        env_set(&sp->env, "LD_PRELOAD", pre);
        free(pre);
    }
    env_set(&sp->env, "OVERSUB_SHIM_SEGMENT", p->seg_path);
    return 0;
}

/* Its own cgroup: what it forks, daemonized or not, stays in it (sp->cgfd: its cgroup.procs). */
static int spawn_cgroup(struct osubd_act *d, struct osub_proc *p, struct spawn *sp)
{
    if (!d->cg_base[0])
        return 0;
    char cg[800], procs[850];
    osubd__act_cg_path(d, p->id, cg, sizeof(cg));
    osubd__act_signal_service(d, p->id, 0, SIGKILL); /* a previous start's leftovers */
    mkdir(d->cg_base, 0755); /* another daemon's sweep may have taken it while empty */
    if (mkdir(cg, 0755) != 0 && errno != EEXIST) {
        snprintf(sp->why, sizeof(sp->why), "cannot make its cgroup %s: %s", cg, strerror(errno));
        return -1;
    }
    snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg);
    if ((sp->cgfd = open(procs, O_WRONLY | O_CLOEXEC)) < 0) {
        snprintf(sp->why, sizeof(sp->why), "cannot open %s: %s", procs, strerror(errno));
        return -1;
    }
    return 0;
}

/* The child: its own session and process group, default signals, then exec. A failure writes
 * its stage and errno to the pipe. */
static void spawn_child(struct osubd_act *d, struct osub_proc *p, struct spawn *sp, int pipefd)
{
    int stage = 0;
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    if (setsid() < 0)
        goto child_fail;
    stage = 6;
    if (sp->cgfd >= 0 && write(sp->cgfd, "0", 1) != 1)
        goto child_fail;
    stage = 1;
    if (dup2(sp->nullfd, 0) < 0 || dup2(sp->logfd, 1) < 0 || dup2(sp->logfd, 2) < 0)
        goto child_fail;
    stage = 3;
    if (sp->user != NULL &&
        (setgroups(1, &sp->gid) != 0 || setgid(sp->gid) != 0 || setuid(sp->uid) != 0))
        goto child_fail;
    stage = 7;
    if (sp->ck_as_user && osubd__act_child_dir(sp->ckdir) != 0)
        goto child_fail;
    stage = 4;
    /* as the service's user: can it load the shim and open its segment? (else ld.so
     * would skip the shim with a warning, and the grant would go unenforced) */
    if (sp->shim_on && (access(d->shim_path, R_OK) != 0 || access(p->seg_path, R_OK | W_OK) != 0))
        goto child_fail;
    stage = 2; /* entered as the service's user, not as oversubd's */
    if (chdir(sp->workdir != NULL ? sp->workdir : sp->ckdir) != 0)
        goto child_fail;
    stage = 5;
    /* nothing oversubd inherited or opened reaches the service: every descriptor past
     * stderr closes at exec (the pipe included, which is how a failed exec is told) */
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
        for (int fd = 3; fd < 65536; fd++) /* kernels before 5.11 */
            fcntl(fd, F_SETFD, FD_CLOEXEC);
    execve(sp->path, sp->argv, sp->env.v);
child_fail:;
    int msg[2] = {stage, errno};
    ssize_t w = write(pipefd, msg, sizeof(msg));
    (void)w;
    _exit(127);
}

/* Why the child could not exec (its stage and errno from the pipe). */
static void spawn_failed(struct spawn *sp, const int msg[2])
{
    static const char *const stages[] = {"setsid",
                                         "redirect its output",
                                         "chdir",
                                         "switch user",
                                         "reach the CUDA shim",
                                         "exec",
                                         "join its cgroup",
                                         "make its checkpoint folder (as its user)"};
    snprintf(sp->why, sizeof(sp->why), "cannot start '%.200s': %s failed: %s%s", sp->path,
             stages[msg[0] >= 0 && msg[0] <= 7 ? msg[0] : 5],
             msg[0] == 7 && (msg[1] == ELOOP || msg[1] == ENOTDIR)
                 ? "a part of it is a symbolic link or not a folder"
                 : strerror(msg[1]),
             msg[0] == 4   ? " (its user must be able to read liboversub-cuda.so and the "
                             "folders above it and the state; or set cuda_shim: false)"
             : msg[0] == 2 ? " (it starts in its workdir, else in its checkpoint folder: "
                             "its user must be able to enter it)"
                           : "");
}

/* Forks the child; 0 with the started process recorded, or -1 with sp->why. */
static int spawn_fork(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si,
                      struct spawn *sp)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        snprintf(sp->why, sizeof(sp->why), "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(sp->why, sizeof(sp->why), "fork: %s", strerror(errno));
        close(pipefd[0]);
        close(pipefd[1]);
        return -1;
    }
    if (pid == 0)
        spawn_child(d, p, sp, pipefd[1]); /* never returns */
    close(pipefd[1]);
    int msg[2];
    ssize_t r;
    do
        r = read(pipefd[0], msg, sizeof(msg));
    while (r < 0 && errno == EINTR);
    close(pipefd[0]);
    if (r == (ssize_t)sizeof(msg)) {
        /* exec failed: the child is gone (reaped by SIGCHLD as a stranger) */
        waitpid(pid, NULL, 0);
        spawn_failed(sp, msg);
        return -1;
    }
    p->pid = pid;
    d->proc_starts++;
    p->child = true;
    p->term_sent = false;
    p->spawned_unix_ms = osubd_now(d->core);
    p->starttime = osubd__act_proc_starttime(pid);
    osubd__act_save_proc(d, p);
    osubd_note(d->core, p->id, "process", "spawn",
               "started %s: process %d (%s) on GPU(s) %s with %lld MiB, batch %d%s%s; log %s",
               p->id, (int)pid, sp->path, sp->gpus, (long long)si->grant_mib, si->batch_size,
               si->checkpoint[0] ? ", resuming from " : "", si->checkpoint, sp->logf);
    return 0;
}

void osubd__act_spawn(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si)
{
    struct spawn *sp = calloc(1, sizeof(*sp));
    if (sp == NULL) {
        osubd__act_apply_fail(d, p, "out of memory starting it");
        return;
    }
    sp->x = json_object_get(d->execs, p->id);
    sp->logfd = sp->nullfd = sp->cgfd = -1;
    sp->workdir = json_string_value(json_object_get(sp->x, "workdir"));
    int rc = spawn_program(d, sp);
    if (rc == 0)
        rc = spawn_folders(d, p, sp);
    if (rc == 0) {
        spawn_env(d, p, si, sp);
        rc = spawn_shim(d, p, si, sp);
    }
    sp->env.v[sp->env.n] = NULL;
    if (rc == 0)
        rc = spawn_cgroup(d, p, sp);
    if (rc == 0)
        rc = spawn_fork(d, p, si, sp);
    int fds[] = {sp->cgfd, sp->logfd, sp->nullfd};
    for (size_t i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    for (size_t i = 0; i < sp->env.n; i++)
        free(sp->env.v[i]);
    if (rc != 0)
        osubd__act_apply_fail(d, p, sp->why);
    free(sp);
}
