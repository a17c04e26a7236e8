/* kubeapi.c - the API server client of kubeapi.h: libcurl on worker threads */
#include "kubeapi.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

struct kreq {
    struct kreq *next;
    char method[8];
    char *path, *body;
    osub_kube_cb cb;
    void *arg;
    long timeout_ms; /* this request's, 0: the client's */
    long status;
    char *answer;
    size_t len, cap;
    char error[CURL_ERROR_SIZE + 64];
};

struct osub_kube {
    struct osub_kube_opts o;
    pthread_t threads[16];
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct kreq *todo_head, *todo_tail, *done;
    bool stop;
    int pipefd[2];
    struct event *wake;
    unsigned long counts[6];
};

void osub_kube_opts_default(struct osub_kube_opts *o)
{
    memset(o, 0, sizeof(*o));
    const char *h = getenv("KUBERNETES_SERVICE_HOST"), *p = getenv("KUBERNETES_SERVICE_PORT");
    if (h != NULL && p != NULL)
        snprintf(o->api, sizeof(o->api), strchr(h, ':') ? "https://[%s]:%s" : "https://%s:%s", h,
                 p);
    snprintf(o->token_file, sizeof(o->token_file),
             "/var/run/secrets/kubernetes.io/serviceaccount/token");
    snprintf(o->ca_file, sizeof(o->ca_file),
             "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
    o->timeout_ms = 10000;
    o->workers = 4;
}

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    struct kreq *r = arg;
    size_t add = size * n;
    if (r->len + add + 1 > r->cap) {
        size_t cap = (r->len + add + 1) * 2;
        if (cap > (64u << 20))
            return 0; /* an answer past 64 MiB: refused */
        char *a = realloc(r->answer, cap);
        if (a == NULL)
            return 0;
        r->answer = a;
        r->cap = cap;
    }
    memcpy(r->answer + r->len, p, add);
    r->len += add;
    r->answer[r->len] = '\0';
    return add;
}

/* The bearer token, read now (trailing whitespace dropped): "" when there is none. */
static void read_token(const char *path, char *out, size_t outlen)
{
    out[0] = '\0';
    if (path[0] == '\0')
        return;
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return;
    size_t n = fread(out, 1, outlen - 1, f);
    fclose(f);
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
        out[--n] = '\0';
}

static void perform(struct osub_kube *k, CURL *c, struct kreq *r)
{
    char url[2048], token[8192], auth[8300];
    snprintf(url, sizeof(url), "%s%s", k->o.api, r->path);
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r->method);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    long t = r->timeout_ms > 0 && r->timeout_ms < k->o.timeout_ms ? r->timeout_ms : k->o.timeout_ms;
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, t);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->error);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    if (k->o.ca_file[0] && access(k->o.ca_file, R_OK) == 0)
        curl_easy_setopt(c, CURLOPT_CAINFO, k->o.ca_file);
    struct curl_slist *h = NULL;
    h = curl_slist_append(h, "Accept: application/json");
    read_token(k->o.token_file, token, sizeof(token));
    if (token[0]) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    if (r->body != NULL) {
        h = curl_slist_append(h, strcmp(r->method, "PATCH") == 0
                                     ? "Content-Type: application/strategic-merge-patch+json"
                                     : "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(r->body));
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(h);
    if (rc != CURLE_OK) {
        r->status = 0;
        if (r->error[0] == '\0')
            snprintf(r->error, sizeof(r->error), "%s", curl_easy_strerror(rc));
        return;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
}

static void *worker(void *arg)
{
    struct osub_kube *k = arg;
    CURL *c = curl_easy_init();
    for (;;) {
        pthread_mutex_lock(&k->mu);
        while (k->todo_head == NULL && !k->stop)
            pthread_cond_wait(&k->cv, &k->mu);
        struct kreq *r = k->todo_head;
        if (r == NULL || k->stop) { /* stopping: what is left is answered -1 by the free */
            pthread_mutex_unlock(&k->mu);
            break;
        }
        k->todo_head = r->next;
        if (k->todo_head == NULL)
            k->todo_tail = NULL;
        pthread_mutex_unlock(&k->mu);
        if (c == NULL) {
            r->status = 0;
            snprintf(r->error, sizeof(r->error), "libcurl could not start");
        } else {
            perform(k, c, r);
        }
        pthread_mutex_lock(&k->mu);
        r->next = k->done;
        k->done = r;
        pthread_mutex_unlock(&k->mu);
        ssize_t w;
        do
            w = write(k->pipefd[1], "x", 1);
        while (w < 0 && errno == EINTR);
    }
    if (c != NULL)
        curl_easy_cleanup(c);
    return NULL;
}

static void kreq_free(struct kreq *r)
{
    free(r->path);
    free(r->body);
    free(r->answer);
    free(r);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct osub_kube *k = arg;
    char buf[256];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    pthread_mutex_lock(&k->mu);
    struct kreq *list = k->done;
    k->done = NULL;
    pthread_mutex_unlock(&k->mu);
    /* in the order they were made */
    struct kreq *rev = NULL;
    while (list) {
        struct kreq *n = list->next;
        list->next = rev;
        rev = list;
        list = n;
    }
    while (rev) {
        struct kreq *n = rev->next;
        long cls = rev->status / 100;
        k->counts[cls >= 1 && cls <= 5 ? cls : 0]++;
        rev->cb(rev->arg, rev->status, rev->answer ? rev->answer : "", rev->len,
                rev->status == 0 ? rev->error : NULL);
        kreq_free(rev);
        rev = n;
    }
}

static void curl_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

int osub_kube_new(struct event_base *base, const struct osub_kube_opts *o, struct osub_kube **out,
                  char *err, size_t errlen)
{
    *out = NULL;
    if (o->api[0] == '\0') {
        snprintf(err, errlen,
                 "no API server: give --kube-api URL (in a cluster, "
                 "KUBERNETES_SERVICE_HOST and _PORT say where it is)");
        return -1;
    }
    if (strncmp(o->api, "http://", 7) != 0 && strncmp(o->api, "https://", 8) != 0) {
        snprintf(err, errlen, "the API server '%.200s' must be an http:// or https:// URL", o->api);
        return -1;
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_once);
    struct osub_kube *k = calloc(1, sizeof(*k));
    if (k == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    k->o = *o;
    size_t n = strlen(k->o.api);
    while (n > 0 && k->o.api[n - 1] == '/')
        k->o.api[--n] = '\0';
    if (k->o.timeout_ms <= 0)
        k->o.timeout_ms = 10000;
    if (k->o.workers < 1)
        k->o.workers = 1;
    if (k->o.workers > 16)
        k->o.workers = 16;
    k->pipefd[0] = k->pipefd[1] = -1;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    if (pipe2(k->pipefd, O_CLOEXEC | O_NONBLOCK) != 0 ||
        (k->wake = event_new(base, k->pipefd[0], EV_READ | EV_PERSIST, on_wake, k)) == NULL ||
        event_add(k->wake, NULL) != 0) {
        snprintf(err, errlen, "cannot start the API client: %s", strerror(errno));
        osub_kube_free(k);
        return -1;
    }
    for (int i = 0; i < k->o.workers; i++) {
        if (pthread_create(&k->threads[i], NULL, worker, k) != 0) {
            snprintf(err, errlen, "cannot start the API client's threads");
            osub_kube_free(k);
            return -1;
        }
        k->n_threads++;
    }
    *out = k;
    return 0;
}

void osub_kube_free(struct osub_kube *k)
{
    if (k == NULL)
        return;
    if (k->n_threads > 0) {
        pthread_mutex_lock(&k->mu);
        k->stop = true;
        pthread_cond_broadcast(&k->cv);
        pthread_mutex_unlock(&k->mu);
        for (int i = 0; i < k->n_threads; i++)
            pthread_join(k->threads[i], NULL);
    }
    /* what never ran, and what ran but was not handed back: answered as abandoned (-1) */
    struct kreq *lists[2] = {k->todo_head, k->done};
    for (int i = 0; i < 2; i++)
        while (lists[i]) {
            struct kreq *n = lists[i]->next;
            lists[i]->cb(lists[i]->arg, -1, "", 0, "stopping");
            kreq_free(lists[i]);
            lists[i] = n;
        }
    if (k->wake)
        event_free(k->wake);
    for (int i = 0; i < 2; i++)
        if (k->pipefd[i] >= 0)
            close(k->pipefd[i]);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k);
}

const char *osub_kube_api(const struct osub_kube *k)
{
    return k->o.api;
}

int osub_kube_request(struct osub_kube *k, const char *method, const char *path, const char *body,
                      osub_kube_cb cb, void *arg)
{
    return osub_kube_request_within(k, method, path, body, 0, cb, arg);
}

int osub_kube_request_within(struct osub_kube *k, const char *method, const char *path,
                             const char *body, long timeout_ms, osub_kube_cb cb, void *arg)
{
    struct kreq *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -1;
    r->timeout_ms = timeout_ms;
    snprintf(r->method, sizeof(r->method), "%s", method);
    r->path = strdup(path);
    r->body = body ? strdup(body) : NULL;
    r->cb = cb;
    r->arg = arg;
    if (r->path == NULL || (body != NULL && r->body == NULL)) {
        kreq_free(r);
        return -1;
    }
    pthread_mutex_lock(&k->mu);
    if (k->todo_tail)
        k->todo_tail->next = r;
    else
        k->todo_head = r;
    k->todo_tail = r;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    return 0;
}

void osub_kube_counts(const struct osub_kube *k, unsigned long counts[6])
{
    memcpy(counts, k->counts, sizeof(k->counts));
}
