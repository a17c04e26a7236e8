/* test_selfaddr.c - oversubd's own listeners recognised however a backend or a Host names them
 * (issue 23: the gateway forwarded to the control API; DNS rebinding reached it by name). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "selfaddr.h"

/* a listening socket on addr (port 0: any); its port in *port */
static int listen_on(int fam, const char *addr, unsigned *port)
{
    int fd = socket(fam, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (fam == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        inet_pton(AF_INET, addr, &s4->sin_addr);
        len = sizeof(*s4);
    } else {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        inet_pton(AF_INET6, addr, &s6->sin6_addr);
        len = sizeof(*s6);
    }
    assert_int_equal(bind(fd, (struct sockaddr *)&ss, len), 0);
    assert_int_equal(listen(fd, 1), 0);
    len = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *port = fam == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                           : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return fd;
}

__attribute__((format(printf, 2, 0))) static const char *url_v(const struct osubd_self *t,
                                                               const char *fmt, va_list ap)
{
    char u[300];
    vsnprintf(u, sizeof(u), fmt, ap);
    return osubd_self_url(t, u);
}

__attribute__((format(printf, 2, 3))) static const char *url(const struct osubd_self *t,
                                                             const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const char *w = url_v(t, fmt, ap);
    va_end(ap);
    return w;
}

static void test_backends_that_are_oversubd(void **state)
{
    (void)state;
    struct osubd_self t = {0};
    unsigned api, gw;
    int fa = listen_on(AF_INET, "127.0.0.1", &api);
    int fg = listen_on(AF_INET, "0.0.0.0", &gw);
    assert_int_equal(osubd_self_add_fd(&t, fa, "the control API"), 0);
    assert_int_equal(osubd_self_add_fd(&t, fg, "the gateway"), 0);
    assert_string_equal(url(&t, "http://127.0.0.1:%u", api), "the control API");
    assert_string_equal(url(&t, "http://localhost:%u/v1", api), "the control API");
    assert_string_equal(url(&t, "http://LOCALHOST:%u", api), "the control API");
    assert_string_equal(url(&t, "http://0.0.0.0:%u", api), "the control API");
    assert_string_equal(url(&t, "http://[::ffff:127.0.0.1]:%u", api), "the control API");
    assert_string_equal(url(&t, "http://user@127.0.0.1:%u", api), "the control API");
    assert_string_equal(url(&t, "http://127.0.0.1:000%u", api), "the control API");
    assert_null(url(&t, "http://127.0.0.2:%u", api)); /* bound to 127.0.0.1 only */
    assert_null(url(&t, "http://127.0.0.1:%u", api == 65535 ? 1 : api + 1));
    /* a wildcard listener is reached by every local address */
    assert_string_equal(url(&t, "http://127.0.0.1:%u", gw), "the gateway");
    assert_string_equal(url(&t, "http://127.9.9.9:%u", gw), "the gateway");
    assert_null(url(&t, "http://example.com:%u", gw)); /* a name: checked at connect time */
    assert_null(url(&t, "http://192.0.2.1:%u", gw));   /* not this host's */
    close(fa);
    close(fg);
}

static void test_host_headers(void **state)
{
    (void)state;
    struct osubd_self t = {0};
    unsigned api;
    char h[300];
    int fa = listen_on(AF_INET, "127.0.0.1", &api);
    assert_int_equal(osubd_self_add_fd(&t, fa, "the control API"), 0);
    snprintf(h, sizeof(h), "127.0.0.1:%u", api);
    assert_true(osubd_self_host_ok(&t, h, NULL));
    snprintf(h, sizeof(h), "localhost:%u", api);
    assert_true(osubd_self_host_ok(&t, h, NULL));
    snprintf(h, sizeof(h), "oversub.internal:%u", api);
    assert_false(osubd_self_host_ok(&t, h, NULL)); /* a rebound name */
    assert_true(osubd_self_host_ok(&t, h, "gpu-1, oversub.internal"));
    assert_false(osubd_self_host_ok(&t, h, "oversub"));
    snprintf(h, sizeof(h), "attacker.example:%u", api);
    assert_false(osubd_self_host_ok(&t, h, "oversub.internal"));
    assert_false(osubd_self_host_ok(&t, "127.0.0.1:1", NULL));
    assert_false(osubd_self_host_ok(&t, "127.0.0.1", NULL)); /* port 80 is not ours */
    assert_false(osubd_self_host_ok(&t, "", NULL));
    assert_false(osubd_self_host_ok(&t, NULL, NULL));
    assert_false(osubd_self_host_ok(&t, "127.0.0.1:99999", NULL));
    assert_false(osubd_self_host_ok(&t, "127.0.0.1:x", NULL));
    assert_false(osubd_self_host_ok(&t, "[::1", NULL));
    close(fa);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backends_that_are_oversubd),
        cmocka_unit_test(test_host_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
