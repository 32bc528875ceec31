/* test_guard.c - the request guards (src/api/guard.c) on header values: which Host headers
 * name this server (DNS rebinding), which Origins get CORS, the Content-Type of JSON routes,
 * and which listen addresses are loopback only (the start-up notice of `strata serve`).
 * test_abuse.c checks the same through the real server. */
#include "harness.h"
#include "api/guard.h"

int main(void) {
    const char *names[] = {"myhost.test", "Box.Local:8080"};
    static const struct {
        const char *host;
        int ok;
    } hosts[] = {
        {"127.0.0.1", 1}, {"127.0.0.1:8080", 1}, {"localhost", 1}, {"LOCALHOST:1", 1},
        {"localhost.", 1}, {"app.localhost:3000", 1}, {"[::1]:8080", 1}, {"[::1]", 1},
        {"192.168.1.20:8080", 1}, /* an IP literal cannot be rebound */
        {"[fe80::1]", 1}, {"myhost.test", 1}, {"MYHOST.TEST:99", 1}, {"box.local", 1},
        {"evil.example", 0}, {"evil.example:8080", 0}, {"127.0.0.1.evil.example", 0},
        {"localhost.evil.example", 0}, {"evillocalhost", 0}, {"", 0}, {"[::1", 0}, {"a/b", 0},
        {"user@127.0.0.1", 0}, {"myhost.test.evil", 0}, {"::1", 0},
    };
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++)
        EXPECT(guard_host_ok(hosts[i].host, names, 2) == hosts[i].ok, "Host '%s': want %d", hosts[i].host, hosts[i].ok);
    EXPECT(guard_host_ok(NULL, NULL, 0), "no Host header (HTTP/1.0) is allowed");

    const char *origins[] = {"https://app.example"};
    static const struct {
        const char *origin, *host;
        int ok;
    } os[] = {
        {"http://localhost:3000", "127.0.0.1:8080", 1},
        {"https://localhost", "127.0.0.1:8080", 1},
        {"http://127.0.0.1:5173", "127.0.0.1:8080", 1},
        {"http://127.1.2.3", NULL, 1},
        {"http://[::1]:8000", "127.0.0.1:8080", 1},
        {"http://dev.localhost:5173", NULL, 1},
        {"https://app.example", "127.0.0.1:8080", 1},          /* --cors-origin */
        {"HTTPS://APP.EXAMPLE", "127.0.0.1:8080", 1},
        {"http://192.168.1.20:8080", "192.168.1.20:8080", 1}, /* the server's own page */
        {"http://192.168.1.20:8081", "192.168.1.20:8080", 0},
        {"https://evil.example", "127.0.0.1:8080", 0},
        {"http://app.example", "127.0.0.1:8080", 0},           /* scheme matters */
        {"null", "127.0.0.1:8080", 0},
        {"file://", "127.0.0.1:8080", 0},
        {"http://localhost.evil.example", "127.0.0.1", 0},
        {"http://127.0.0.1.evil.example", "127.0.0.1", 0},
        {"chrome-extension://abc", "127.0.0.1", 0},
        {"http://localhost:3000/path", "127.0.0.1", 0},
        {"", "127.0.0.1", 0},
    };
    for (size_t i = 0; i < sizeof os / sizeof os[0]; i++)
        EXPECT(guard_origin_ok(os[i].origin, os[i].host, origins, 1) == os[i].ok, "Origin '%s' (Host %s): want %d",
               os[i].origin, os[i].host ? os[i].host : "none", os[i].ok);
    const char *any[] = {"*"};
    EXPECT(guard_origin_ok("https://evil.example", NULL, any, 1), "--cors-origin '*' allows any origin");

    static const struct {
        const char *ct;
        int ok;
    } cts[] = {
        {"application/json", 1}, {"Application/JSON", 1}, {"application/json; charset=utf-8", 1},
        {" application/json ;charset=UTF-8", 1}, {"text/plain", 0}, {"application/x-www-form-urlencoded", 0},
        {"multipart/form-data; boundary=x", 0}, {"application/jsonp", 0}, {"application/json-seq", 0}, {"", 0},
    };
    for (size_t i = 0; i < sizeof cts / sizeof cts[0]; i++)
        EXPECT(guard_json_type(cts[i].ct) == cts[i].ok, "Content-Type '%s': want %d", cts[i].ct, cts[i].ok);
    EXPECT(!guard_json_type(NULL), "no Content-Type");

    static const struct {
        const char *host;
        int loopback;
    } ls[] = {
        {"127.0.0.1", 1}, {"127.0.0.2", 1}, {"::1", 1}, {"[::1]", 1}, {"localhost", 1},
        {"0.0.0.0", 0}, {"::", 0}, {"192.168.1.20", 0}, {"10.0.0.1", 0}, {"fe80::1", 0},
    };
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        EXPECT(guard_listen_is_loopback(ls[i].host) == ls[i].loopback, "listen on '%s': loopback %d",
               ls[i].host, ls[i].loopback);
    EXPECT(guard_listen_is_loopback(NULL), "the default (127.0.0.1) is loopback");
    return TEST_DONE();
}
