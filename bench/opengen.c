/* An open-loop HTTP/1.1 load generator that costs its machine little (issue 37): requests at
 * Poisson arrival times, each on an idle keep-alive connection (a new one while under the
 * connection cap; at the cap the arrival is dropped and counted), one epoll loop, no
 * threads. Built and driven by bench/opengen.py, which renders the requests; on the 2-core box
 * the Python generator (`seqserve loadtest`) took 0.36-0.57 of its cores at 3x overload,
 * which the server under test then lacked (docs/performance.md sections 20 and 23).
 *
 *   opengen HOST PORT RATE DURATION_S SEED MAX_CONNECTIONS REQUESTS_FILE OUT_FILE
 *
 * RATE 0: a closed loop instead, of MAX_CONNECTIONS connections, each sending its next
 * request as soon as its last is answered (a capacity measured with the same generator).
 *
 * REQUESTS_FILE: raw requests, each a 4-byte little-endian length and that many bytes;
 * arrival i sends request i modulo their count. OUT_FILE: a line per arrival,
 * "scheduled_s sent_s done_s status queue_ms compute_ms retry_after total_ms" (sent/done -1
 * when not; status 0 for a transport error, -1 for a drop; queue_ms, compute_ms and total_ms
 * -1 without Server-Timing, total_ms the server's own time from reading the request to its
 * answer; retry_after 1 when the answer had Retry-After), then a last line "cpu_s SECONDS" (this process's user +
 * system CPU over the load). After DURATION_S no arrival is scheduled; answers are awaited
 * up to 60 s more. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <math.h>

typedef struct {
    double scheduled, sent, done;
    int status;
    double queue_ms, compute_ms;
    int retry_after;
    double total_ms;
} Record;

enum { IDLE, CONNECTING, BUSY };

typedef struct {
    int fd, state, listed; /* listed: in the idle list */
    long rec;          /* the arrival it serves, -1 none */
    size_t req, wrote; /* request index, bytes written */
    char *buf;
    size_t len, cap;
} Conn;

static char **reqs;
static size_t *req_len;
static size_t nreq;
static Record *recs;
static long nrec, caprec;
static Conn *conns;
static int nconn, maxconn;
static int *idle;
static int nidle;
static long inflight;
static int closed_loop;  /* RATE 0 */
static double duration;
static void arrive(double scheduled);

static void make_idle(Conn *c) {
    c->state = IDLE;
    if (!c->listed) {
        c->listed = 1;
        idle[nidle++] = (int)(c - conns);
    }
}

static void finished(Conn *c) {
    c->rec = -1;
    inflight--;
}
static int epfd;
static struct sockaddr_in addr;
static double t0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9 - t0;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void load_requests(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    size_t cap = 0;
    uint32_t n;
    while (fread(&n, 4, 1, f) == 1) {
        if (nreq == cap) {
            cap = cap ? cap * 2 : 64;
            reqs = realloc(reqs, cap * sizeof *reqs);
            req_len = realloc(req_len, cap * sizeof *req_len);
        }
        reqs[nreq] = malloc(n);
        if (fread(reqs[nreq], 1, n, f) != n) die("short requests file");
        req_len[nreq++] = n;
    }
    fclose(f);
    if (!nreq) {
        fprintf(stderr, "no requests in %s\n", path);
        exit(2);
    }
}

static long new_record(double scheduled) {
    if (nrec == caprec) {
        caprec = caprec ? caprec * 2 : 4096;
        recs = realloc(recs, caprec * sizeof *recs);
    }
    recs[nrec] = (Record){scheduled, -1, -1, -1, -1, -1, 0, -1};
    return nrec++;
}

static void watch(Conn *c, uint32_t events, int op) {
    struct epoll_event ev = {.events = events, .data.u32 = (uint32_t)(c - conns)};
    if (epoll_ctl(epfd, op, c->fd, &ev) < 0) die("epoll_ctl");
}

static void close_conn(Conn *c) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    c->state = IDLE;
    c->rec = -1;
    c->len = 0;
}

static void fail(Conn *c) {
    int had = c->rec >= 0;
    if (had) {
        recs[c->rec].status = 0;
        recs[c->rec].done = now();
        finished(c);
    }
    close_conn(c);
    if (had && closed_loop && now() < duration) arrive(now());
}

static int open_conn(Conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c->fd < 0) return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    c->state = CONNECTING;
    watch(c, EPOLLOUT | EPOLLIN, EPOLL_CTL_ADD);
    return 0;
}

static void write_some(Conn *c) {
    while (c->wrote < req_len[c->req]) {
        ssize_t n = write(c->fd, reqs[c->req] + c->wrote, req_len[c->req] - c->wrote);
        if (n < 0) {
            if (errno == EAGAIN) {
                watch(c, EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
                return;
            }
            fail(c);
            return;
        }
        c->wrote += n;
    }
    watch(c, EPOLLIN, EPOLL_CTL_MOD);
}

static void start(Conn *c, long rec) {
    inflight++;
    c->rec = rec;
    c->req = rec % nreq;
    c->wrote = 0;
    c->len = 0;
    recs[rec].sent = now();
    if (c->state == CONNECTING) return; /* written once connected */
    c->state = BUSY;
    write_some(c);
}

/* The value of header `name` (lowercase, with ':') in the head [h, end), or NULL. */
static const char *header(const char *h, const char *end, const char *name) {
    size_t n = strlen(name);
    for (const char *p = h; p && p < end; p = memchr(p, '\n', end - p), p = p ? p + 1 : p) {
        if ((size_t)(end - p) > n && strncasecmp(p, name, n) == 0) {
            p += n;
            while (*p == ' ') p++;
            return p;
        }
    }
    return NULL;
}

/* A whole response in c->buf: its length, or 0 when more is needed. */
static size_t complete(Conn *c, int *status, int *close_after, double *queue_ms,
                       double *compute_ms, double *total_ms, int *retry) {
    char *b = c->buf;
    char *end = memmem(b, c->len, "\r\n\r\n", 4);
    if (!end) return 0;
    size_t head = end + 4 - b;
    *status = atoi(b + 9);
    const char *v = header(b, end, "content-length:");
    size_t total;
    if (v) {
        total = head + strtoul(v, NULL, 10);
    } else if ((v = header(b, end, "transfer-encoding:")) && strncasecmp(v, "chunked", 7) == 0) {
        char *last = memmem(b + head, c->len - head, "0\r\n\r\n", 5);
        if (!last) return 0;
        total = last + 5 - b;
    } else {
        return 0; /* until the connection closes */
    }
    if (c->len < total) return 0;
    *close_after = (v = header(b, end, "connection:")) && strncasecmp(v, "close", 5) == 0;
    *retry = header(b, end, "retry-after:") != NULL;
    *queue_ms = *compute_ms = *total_ms = -1;
    if ((v = header(b, end, "server-timing:"))) {
        const char *q = strstr(v, "queue;dur=");
        if (q && q < end) *queue_ms = atof(q + 10);
        q = strstr(v, "compute;dur=");
        if (q && q < end) *compute_ms = atof(q + 12);
        q = strstr(v, "total;dur=");
        if (q && q < end) *total_ms = atof(q + 10);
    }
    return total;
}

static void read_some(Conn *c) {
    for (;;) {
        if (c->cap - c->len < 65536) {
            c->cap = c->cap * 2 + 65536;
            c->buf = realloc(c->buf, c->cap + 1);
        }
        ssize_t n = read(c->fd, c->buf + c->len, c->cap - c->len);
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) {
            fail(c);
            return;
        }
        c->len += n;
        c->buf[c->len] = 0;
        int status, close_after, retry;
        double queue_ms, compute_ms, total_ms;
        if (c->rec >= 0 && complete(c, &status, &close_after, &queue_ms, &compute_ms, &total_ms,
                                    &retry)) {
            Record *r = &recs[c->rec];
            r->done = now();
            r->status = status;
            r->queue_ms = queue_ms;
            r->compute_ms = compute_ms;
            r->total_ms = total_ms;
            r->retry_after = retry;
            finished(c);
            c->len = 0;
            if (close_after) {
                close_conn(c);
            } else {
                make_idle(c);
            }
            if (closed_loop && now() < duration) arrive(now());
            return;
        }
    }
}

static void arrive(double scheduled) {
    long rec = new_record(scheduled);
    while (nidle) {
        Conn *c = &conns[idle[--nidle]];
        c->listed = 0;
        if (c->fd >= 0 && c->state == IDLE) {
            start(c, rec);
            return;
        }
    }
    for (int i = 0; i < maxconn; i++) { /* a closed slot, else a new one */
        Conn *c = &conns[i];
        if (c->fd < 0 && (i < nconn || nconn < maxconn)) {
            if (i >= nconn) nconn = i + 1;
            if (open_conn(c) < 0) {
                recs[rec].status = 0;
                return;
            }
            start(c, rec);
            return;
        }
    }
    recs[rec].status = -1; /* dropped: every connection busy */
}

static double cpu_s(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
           u.ru_stime.tv_usec * 1e-6;
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: %s HOST PORT RATE DURATION_S SEED MAX_CONNECTIONS REQUESTS OUT\n",
                argv[0]);
        return 2;
    }
    addr.sin_family = AF_INET;
    addr.sin_port = htons(atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) die("host");
    double rate = atof(argv[3]);
    duration = atof(argv[4]);
    closed_loop = rate <= 0;
    srand48(atol(argv[5]));
    maxconn = atoi(argv[6]);
    struct rlimit lim = {maxconn + 64, maxconn + 64};
    setrlimit(RLIMIT_NOFILE, &lim);
    load_requests(argv[7]);
    conns = calloc(maxconn, sizeof *conns);
    idle = calloc(maxconn, sizeof *idle);
    for (int i = 0; i < maxconn; i++) conns[i].fd = -1, conns[i].rec = -1;
    epfd = epoll_create1(0);
    struct epoll_event events[256];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = ts.tv_sec + ts.tv_nsec * 1e-9;
    double cpu0 = cpu_s();
    double next = closed_loop ? INFINITY : -log(1 - drand48()) / rate;
    for (int i = 0; closed_loop && i < maxconn; i++) arrive(0.0);
    for (;;) {
        double t = now();
        while (next <= duration && next <= t) {
            arrive(next);
            next += -log(1 - drand48()) / rate;
        }
        if (next > duration && (closed_loop ? t >= duration && !inflight : !inflight)) break;
        if (next > duration && t > duration + 60) break;
        double wait_s = next <= duration ? next - now() : 0.05;
        int ms = wait_s > 0 ? (int)ceil(wait_s * 1000) : 0;
        int n = epoll_wait(epfd, events, 256, ms);
        for (int i = 0; i < n; i++) {
            Conn *c = &conns[events[i].data.u32];
            if (c->fd < 0) continue;
            if (c->state == CONNECTING) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) {
                    fail(c);
                    continue;
                }
                c->state = BUSY;
                if (c->rec >= 0) {
                    write_some(c);
                } else {
                    make_idle(c);
                    watch(c, EPOLLIN, EPOLL_CTL_MOD);
                }
                continue;
            }
            if (events[i].events & EPOLLOUT && c->rec >= 0) write_some(c);
            if (c->fd >= 0 && events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                if (c->rec >= 0) {
                    read_some(c);
                } else { /* an idle connection closed by the server */
                    close_conn(c);
                }
            }
        }
    }
    double cpu = cpu_s() - cpu0;
    FILE *out = fopen(argv[8], "w");
    if (!out) die(argv[8]);
    for (long i = 0; i < nrec; i++) {
        Record *r = &recs[i];
        if (r->status == -1 && r->sent >= 0) r->status = 0; /* never answered */
        fprintf(out, "%.6f %.6f %.6f %d %.3f %.3f %d %.3f\n", r->scheduled, r->sent, r->done,
                r->status, r->queue_ms, r->compute_ms, r->retry_after, r->total_ms);
    }
    fprintf(out, "cpu_s %.6f\n", cpu);
    fclose(out);
    return 0;
}
