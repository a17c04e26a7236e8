/* act_pods.c - pods (the device plugin's services): their records, grant segments and the shim they
 * mount */
#define _GNU_SOURCE
#include "act.h"

/* ---- pods (device plugin) ---- */

#include <sys/random.h>

#include "deviceplugin.h"
#include "spec_json.h"

/* A pod's segment is named <id>.<16 hex>.seg in the state's shim/pods/ folder: 0700 and
 * root's, so that no local user reaches it by its path; the pod's containers, of any uid, get
 * the file by the bind mount the device plugin asks for (which needs no passage through the
 * folder), so the file itself is 0666. Managed services' are shim/<id>.seg, 0600 and their
 * user's. */
static bool pod_seg_name(const char *name, const char *id)
{
    size_t il = id != NULL ? strlen(id) : 0, nl = strlen(name);
    if (id != NULL && (nl != il + 1 + 16 + 4 || strncmp(name, id, il) != 0))
        return false;
    if (nl < 1 + 16 + 4 || strcmp(name + nl - 4, ".seg") != 0 || name[nl - 21] != '.')
        return false;
    for (size_t i = nl - 20; i < nl - 4; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return false;
    return true;
}

/* The pods' segment folder, made (shim/ 0711, shim/pods/ 0700, both root's, never a link);
 * pod segments an older oversubd left in shim/ itself are moved in (a rename: the bind mounts
 * of running containers follow the file). 0, or -1 with a sentence in why. */
static int pod_seg_dir(struct osubd_act *d, char *dir, size_t dirlen, char *why, size_t whylen)
{
    char sd[512], shim[560];
    struct stat st;
    osubd__act_state_dir(d, sd, sizeof(sd));
    snprintf(shim, sizeof(shim), "%s/shim", sd);
    snprintf(dir, dirlen, "%s/pods", shim);
    if (osubd__act_mkdirs(shim, 0711) != 0 || lstat(shim, &st) != 0 || !S_ISDIR(st.st_mode) ||
        chmod(shim, 0711) != 0 || (mkdir(dir, 0700) != 0 && errno != EEXIST) ||
        lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || chmod(dir, 0700) != 0) {
        snprintf(why, whylen, "cannot make %s for the CUDA shim: %s", dir, strerror(errno));
        return -1;
    }
    if (st.st_uid != geteuid() && lchown(dir, geteuid(), getegid()) != 0) {
        snprintf(why, whylen, "%s is not oversubd's user's and cannot be made so: %s", dir,
                 strerror(errno));
        return -1;
    }
    DIR *dd = opendir(shim);
    for (struct dirent *e; dd != NULL && (e = readdir(dd)) != NULL;) {
        if (!pod_seg_name(e->d_name, NULL))
            continue;
        char from[900], to[900];
        snprintf(from, sizeof(from), "%s/%s", shim, e->d_name);
        snprintf(to, sizeof(to), "%s/%s", dir, e->d_name);
        if (rename(from, to) != 0)
            osubd_log(OSUBD_LOG_WARN, "cannot move the pod segment %s into %s: %s", from, dir,
                      strerror(errno));
    }
    if (dd != NULL)
        closedir(dd);
    return 0;
}

/* An existing segment of the pod (made before oversubd restarted), opened into p. */
static bool pod_seg_adopt(struct osubd_act *d, struct osub_proc *p, const char *dir)
{
    DIR *dd = opendir(dir);
    bool got = false;
    for (struct dirent *e; dd != NULL && !got && (e = readdir(dd)) != NULL;) {
        if (!pod_seg_name(e->d_name, p->id))
            continue;
        char err[512];
        int n = snprintf(p->seg_path, sizeof(p->seg_path), "%s/%s", dir, e->d_name);
        if (n < 0 || (size_t)n >= sizeof(p->seg_path))
            continue;
        if (osubd__act_seg_open_guarded(&p->seg, p->seg_path, err, sizeof(err)) == 0)
            got = true;
        else {
            osubd_log(OSUBD_LOG_INFO, "%s: its pod segment: %s", p->id, err);
            osubd_warn(d->core, p->id, "shim", "damaged",
                       "%s: its pod segment cannot be used (oversubd's log says why)", p->id);
        }
    }
    if (dd != NULL)
        closedir(dd);
    return got;
}

/* Writes the engine's grants into a pod's mapped segment now (the watch round does it later
 * on; a container told to start must not find 0 there). */
static void pod_seg_grants(struct osubd_act *d, struct osub_proc *p, const osub_service_info_t *si)
{
    struct osub_seg_view v;
    osubd__act_seg_look(d, p, si, &v); /* under the guard: the pod can write (and cut) the file */
}

int osubd_act_pod_segment(struct osubd_act *d, const char *id, char *path, size_t pathlen,
                          char *why, size_t whylen)
{
    osub_service_info_t si;
    if (osub_engine_service_info(d->e, id, &si) != 0 ||
        !(osubd__act_live_state(si.state) || si.state == OSUB_STATE_PENDING)) {
        snprintf(why, whylen,
                 "service %s is neither running nor waiting for its victims in oversubd", id);
        return -1;
    }
    bool waits = si.state == OSUB_STATE_PENDING;
    if (si.n_slots < 1 || si.n_slots > OSUB_SEG_DEVICES) {
        snprintf(why, whylen, "the CUDA shim grants 1 to %d GPUs (service %s has %d)",
                 OSUB_SEG_DEVICES, id, (int)si.n_slots);
        return -1;
    }
    struct osub_proc *p = osubd__act_proc_find(d, id);
    if (p != NULL && p->seg.s != NULL) {
        snprintf(path, pathlen, "%s", p->seg_path);
        return 0;
    }
    struct stat st;
    if (waits && p != NULL && p->seg_path[0] != '\0' && lstat(p->seg_path, &st) == 0 &&
        S_ISREG(st.st_mode)) {
        snprintf(path, pathlen, "%s", p->seg_path); /* made, and left unmapped while it waits */
        return 0;
    }
    if (p == NULL && (p = osubd__act_proc_get(d, id)) == NULL) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    char dir[620];
    if (pod_seg_dir(d, dir, sizeof(dir), why, whylen) != 0)
        return -1;
    memset(p->seg_reported, 0, sizeof(p->seg_reported));
    if (!pod_seg_adopt(d, p, dir)) {
        uint8_t r[8];
        if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
            snprintf(why, whylen, "getrandom: %s", strerror(errno));
            return -1;
        }
        snprintf(p->seg_path, sizeof(p->seg_path), "%s/%s.%02x%02x%02x%02x%02x%02x%02x%02x.seg",
                 dir, id, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
        uint64_t grants[OSUB_SEG_DEVICES] = {0}; /* waiting: nothing may be allocated yet */
        for (int32_t i = 0; i < si.n_slots && !waits; i++)
            grants[i] = (uint64_t)si.slots[i].grant_mib << 20;
        char err[512];
        if (osub_seg_create(&p->seg, p->seg_path, (uid_t)-1, (gid_t)-1, id, (uint32_t)si.n_slots,
                            grants, err, sizeof(err)) != 0) {
            snprintf(why, whylen, "CUDA shim: %s", err);
            p->seg_path[0] = '\0';
            return -1;
        }
        if (fchmod(p->seg.fd, 0666) != 0) {
            snprintf(why, whylen, "chmod %s: %s", p->seg_path, strerror(errno));
            osub_seg_cleanup(&p->seg);
            unlink(p->seg_path);
            p->seg_path[0] = '\0';
            return -1;
        }
    }
    if (waits) {
        /* a pending service's slots already carry the grant it will have; its memory is still
         * the victims'. Unmapped, the watch round leaves the segment at 0 (it writes only mapped
         * segments); the sweep maps it again once the service starts. */
        osubd__act_seg_zero_guarded(&p->seg);
        osub_seg_cleanup(&p->seg);
    } else {
        pod_seg_grants(d, p, &si);
    }
    snprintf(path, pathlen, "%s", p->seg_path);
    return 0;
}

/* A whole regular file (not through a link) into a new buffer of at most max bytes. */
static int pod_file_read(const char *path, size_t max, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
        rc = -EINVAL;
        goto err_close_fd;
    }
    *buf = malloc((size_t)st.st_size + 1);
    if (*buf == NULL) {
        rc = -ENOMEM;
        goto err_close_fd;
    }
    while (*len < (size_t)st.st_size) {
        ssize_t n = read(fd, *buf + *len, (size_t)st.st_size - *len);
        if (n <= 0) {
            rc = n < 0 ? -errno : -EIO;
            free(*buf);
            *buf = NULL;
            *len = 0;
            goto err_close_fd;
        }
        *len += (size_t)n;
    }
err_close_fd:
    close(fd);
    return rc;
}

#define POD_SHIM_MAX (256u << 20)

int osubd_act_pod_shim(struct osubd_act *d, char *path, size_t pathlen, char *why, size_t whylen)
{
    path[0] = '\0';
    const char *src = d->shim_path;
    if (src[0] == '\0')
        return 0;
    char sd[512], dir[600], tmp[700];
    osubd__act_state_dir(d, sd, sizeof(sd));
    snprintf(dir, sizeof(dir), "%s/lib", sd);
    struct stat st;
    if (osubd__act_mkdirs(dir, 0755) != 0 || lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, whylen, "cannot make %s for the CUDA shim pods mount: %s", dir,
                 strerror(errno));
        return -1;
    }
    int n = snprintf(path, pathlen, "%s/liboversub-cuda.so", dir);
    if (n < 0 || (size_t)n >= pathlen) {
        snprintf(why, whylen, "%s: the path is too long", dir);
        path[0] = '\0';
        return -1;
    }
    char *want = NULL, *have = NULL;
    size_t wl, hl;
    int rc = pod_file_read(src, POD_SHIM_MAX, &want, &wl);
    if (rc != 0) {
        snprintf(why, whylen, "cannot read the CUDA shim %s: %s", src, strerror(-rc));
        path[0] = '\0';
        return -1;
    }
    if (pod_file_read(path, POD_SHIM_MAX, &have, &hl) == 0 && hl == wl &&
        memcmp(have, want, wl) == 0 && lstat(path, &st) == 0) {
        free(have);
        free(want);
        if ((st.st_mode & 07777) != 0755 && chmod(path, 0755) != 0) {
            snprintf(why, whylen, "chmod %s: %s", path, strerror(errno));
            path[0] = '\0';
            return -1;
        }
        return 0; /* the same shim: left alone */
    }
    free(have);
    /* a new file renamed over the old: containers running keep the one they mounted */
    snprintf(tmp, sizeof(tmp), "%s/.liboversub-cuda.so.XXXXXX", dir);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot create a file in %s: %s", dir, strerror(errno));
        goto err_free_want;
    }
    size_t off = 0;
    while (off < wl) {
        ssize_t w = write(fd, want + off, wl - off);
        if (w <= 0) {
            snprintf(why, whylen, "cannot write %s: %s", tmp, w < 0 ? strerror(errno) : "no room");
            goto err_unlink_tmp;
        }
        off += (size_t)w;
    }
    if (fchmod(fd, 0755) != 0 || fsync(fd) != 0) {
        snprintf(why, whylen, "cannot finish %s: %s", tmp, strerror(errno));
        goto err_unlink_tmp;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) != 0) {
        snprintf(why, whylen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto err_unlink_tmp;
    }
    free(want);
    osubd_log(OSUBD_LOG_INFO, "device plugin: the CUDA shim %s copied to %s (what pods mount)", src,
              path);
    return 0;
err_unlink_tmp:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
err_free_want:
    free(want);
    path[0] = '\0';
    return -1;
}

int osubd_act_pod_fits(const struct osubd_act *d, const json_t *spec, int64_t can, char *err,
                       size_t errlen)
{
    if (can < 0)
        return 0;
    osub_spec_t sp;
    char e2[300];
    if (osub_spec_from_json(spec, &sp, e2, sizeof(e2)) != 0)
        return 0; /* the submit says what is wrong with it */
    int64_t held = 0;
    size_t n = osub_engine_service_count(d->e);
    for (size_t i = 0; i < n; i++) {
        const char *id = osub_engine_service_id(d->e, i);
        osub_service_info_t si;
        if (strcmp(id, sp.id) == 0 || osubd_act_kube(d, id) == NULL ||
            osub_engine_service_info(d->e, id, &si) != 0)
            continue; /* a retry of the same pod counts once */
        held += si.spec->vram_mib;
    }
    if (held + sp.vram_mib <= can)
        return 0;
    snprintf(err, errlen,
             "this node's kubelet can account only %lld MiB of %s (the device plugin's list is "
             "cut at 4 MiB); %lld MiB are held by pods already, and this pod asks %lld MiB",
             (long long)can, OSUBD_DP_RESOURCE, (long long)held, (long long)sp.vram_mib);
    return -1;
}

const char *osubd_act_shim_path(const struct osubd_act *d)
{
    return d->shim_path;
}

void osubd_act_pods_sweep(struct osubd_act *d)
{
    osub_service_info_t si;
    for (struct osub_proc *p = d->proc_list, *next; p; p = next) {
        next = p->next;
        if (p->pid > 0 || p->child || osubd_act_managed(d, p->id) ||
            osub_engine_service_info(d->e, p->id, &si) == 0)
            continue;
        osubd__act_proc_drop(d, p); /* a pod that is gone: its segment with it */
    }
    /* segments of pods that went while oversubd was stopped */
    char dir[620], why[300];
    if (pod_seg_dir(d, dir, sizeof(dir), why, sizeof(why)) != 0) {
        osubd_log(OSUBD_LOG_INFO, "%s", why);
        return;
    }
    DIR *dd = opendir(dir);
    for (struct dirent *e; dd != NULL && (e = readdir(dd)) != NULL;) {
        size_t nl = strlen(e->d_name);
        if (!pod_seg_name(e->d_name, NULL) || nl - 21 > OSUB_ID_MAX)
            continue;
        char id[OSUB_ID_MAX + 1];
        snprintf(id, sizeof(id), "%.*s", (int)(nl - 21), e->d_name);
        struct osub_proc *p = osubd__act_proc_find(d, id);
        if (osub_engine_service_info(d->e, id, &si) != 0) {
            if (p == NULL)
                unlinkat(dirfd(dd), e->d_name, 0);
        } else if ((p == NULL || p->seg.s == NULL) && osubd__act_live_state(si.state) &&
                   osubd_act_kube(d, id) != NULL) {
            /* a pod running since before oversubd restarted: its grant kept up again */
            char path[700];
            if (osubd_act_pod_segment(d, id, path, sizeof(path), why, sizeof(why)) != 0)
                osubd_log(OSUBD_LOG_INFO, "%s: its pod segment: %s", id, why);
        }
    }
    if (dd != NULL)
        closedir(dd);
}

void osubd_act_pods_close(struct osubd_act *d)
{
    if (d == NULL)
        return;
    for (struct osub_proc *p = d->proc_list; p; p = p->next)
        if (p->pid <= 0 && !p->child && !osubd_act_managed(d, p->id) && p->seg.s != NULL &&
            pod_seg_name(strrchr(p->seg_path, '/') + 1, p->id))
            osub_seg_cleanup(&p->seg); /* unmapped, not removed: mounted in running pods */
}

int osubd_act_take(const struct osubd_act *d, json_t *spec, bool trusted, int64_t pod_cut_mib,
                   json_t **exec, char *err, size_t errlen)
{
    char why[400], rwhy[400];
    const json_t *su = json_object_get(spec, "suspend");
    const char *m = json_string_value(json_object_get(su, "method"));
    bool cuda = m != NULL && strcmp(m, "cuda") == 0;
    struct osubd_take_rules r = {
        .kube_node = d->cfg->kube_node,
        .allow_root_services = d->cfg->allow_root_services,
        .dest = d->dest,
        .cuda_unusable = cuda ? osubd__act_cuda_unusable(d, why, sizeof(why)) : NULL,
        .relocate_unusable = cuda && json_is_true(json_object_get(su, "relocate"))
                                 ? osubd__act_relocate_unusable(d, rwhy, sizeof(rwhy))
                                 : NULL};
    int rc = osubd_exec_take(&r, spec, trusted, exec, err, errlen);
    if (rc != 0 || *exec == NULL || json_object_get(*exec, "kubernetes") == NULL)
        return rc;
    if (osubd_act_pod_fits(d, spec, pod_cut_mib, err, errlen) != 0) {
        json_decref(*exec);
        *exec = NULL;
        return -1;
    }
    return 0;
}
