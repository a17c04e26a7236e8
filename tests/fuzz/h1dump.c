/* h1dump.c - prints how the codec reads a request head from a file, as one JSON line (for the
 * differential test against python3-h11). Usage: h1dump FILE... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h1.h"

static void str(const char *p, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

int main(int argc, char **argv)
{
    static char buf[1 << 20];
    for (int a = 1; a < argc; a++) {
        FILE *f = fopen(argv[a], "rb");
        if (f == NULL) {
            perror(argv[a]);
            return 2;
        }
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        struct h1_head h;
        int rc = h1_parse_request(buf, n, &h);
        printf("{\"file\": ");
        str(argv[a], strlen(argv[a]));
        printf(", \"rc\": %d", rc);
        if (rc == H1_BAD) {
            printf(", \"status\": %d, \"why\": ", h.err_status);
            str(h.err_why, strlen(h.err_why));
        }
        if (rc == H1_DONE) {
            printf(", \"len\": %zu, \"method\": ", h.len);
            str(h.method, h.mlen);
            printf(", \"target\": ");
            str(h.target, h.tlen);
            printf(", \"minor\": %d, \"chunked\": %s, \"content_length\": %lld, \"headers\": [",
                   h.minor, h.chunked ? "true" : "false", (long long)h.content_length);
            for (int i = 0; i < h.nh; i++) {
                printf(i ? ", [" : "[");
                str(h.h[i].name, h.h[i].nlen);
                printf(", ");
                str(h.h[i].value, h.h[i].vlen);
                printf("]");
            }
            printf("]");
        }
        printf("}\n");
    }
    return 0;
}
