/* fuzz_mhd.c — libFuzzer: bytes as a client sends them, straight into libmicrohttpd 0.9.75 as
 * tlmd configures it (external select, suspend/resume allowed, the connection memory limit,
 * no listen socket: MHD_add_connection on one end of a socketpair, as daemon/http.c's front
 * door hands connections over). The other end gets the input and then its write side shut;
 * MHD runs until it closes the connection. The access handler reads bodies and answers 200
 * with JSON; whatever MHD makes of the bytes must end without a crash, a hang or a leak in
 * the harness. (MHD itself is not instrumented: this finds crashes and hangs, not coverage;
 * the door in front of it is fuzzed by fuzz_http_head.) */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/tlmd.h"

static struct MHD_Daemon *d;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    if (!*con_cls) {
        *con_cls = (void *)1; /* headers: wait for the body */
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    static const char body[] = "{\"ok\":true}\n";
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static void quiet(void *cls, const char *fmt, va_list ap) {}

static unsigned connections(void)
{
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return i ? i->num_connections : 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    d = MHD_start_daemon(MHD_USE_NO_LISTEN_SOCKET | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0,
                         NULL, NULL, on_request, NULL, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
                         MHD_OPTION_CONNECTION_TIMEOUT, 1u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                         (size_t)(4 * HEAD_MAX + 65536), MHD_OPTION_END);
    if (!d) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536) return 0; /* what fits a socketpair's buffer in one write */
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp)) return 0;
    int big = 1 << 20;
    setsockopt(sp[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(40000)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (MHD_add_connection(d, sp[1], (struct sockaddr *)&a, sizeof a) != MHD_YES) {
        close(sp[0]);
        return 0;
    }
    size_t off = 0;
    char sink[65536];
    /* bounded: MHD answers and closes, or (a head or body left incomplete) sees the end */
    for (int i = 0; i < 2000 && connections(); i++) {
        if (off < size) {
            ssize_t w = send(sp[0], data + off, size - off, MSG_NOSIGNAL);
            if (w > 0) off += (size_t)w;
            if (off == size) shutdown(sp[0], SHUT_WR);
        } else if (size == 0 && i == 0) {
            shutdown(sp[0], SHUT_WR);
        }
        MHD_run(d);
        while (recv(sp[0], sink, sizeof sink, MSG_DONTWAIT) > 0) {
        }
    }
    close(sp[0]); /* what MHD still holds sees the peer gone */
    for (int i = 0; i < 100 && connections(); i++)
        MHD_run(d);
    if (connections()) __builtin_trap(); /* a connection MHD never lets go of */
    return 0;
}
