/* NCCL's unique id from rank 0 to every rank, through a shared file or
 * torchrun's own TCPStore (see rendezvous.h). Plain C11 + POSIX sockets: no
 * CUDA, so the host tests exercise every line. Every wait is bounded by a
 * deadline; every failure is one line naming the channel, the rank and a fix. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "rendezvous.h"
#include "safeio.h"

enum { MAX_SHARED_BYTES = 4096, MAX_KEY_SUFFIX = 200 };

static double now_s(void)
{
    struct timespec t;
    /* The wall clock as a fallback keeps every deadline finite. */
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0) return (double)time(NULL);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    if (s <= 0) return;
    struct timespec t = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

/* strerror is not thread-safe and ranks may be threads (tests). */
static const char *errstr(int e, char *buf, size_t n)
{
    if (strerror_r(e, buf, n) != 0) snprintf(buf, n, "errno %d", e);
    return buf;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return CP_RDZV_ERROR;
}

static int printable_word(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < 0x21 || *s > 0x7e) return 0;
    return 1;
}

/* ---- COMMPLAN_ID_FILE ------------------------------------------------------------------------------------------ */

/* The file is text, so `cat` shows whose it is:
 *   commplan-nccl-id 1
 *   job <job tag>        (SLURM_JOB_ID.step, TORCHELASTIC_RUN_ID, ...: launch.c)
 *   key <key suffix>     (the plan fingerprint)
 *   bytes <n>
 *   <2n hex digits>
 * A file whose job or key differ is another launch's or another plan's and is
 * never read; rank 0 of this launch replaces it. */
#define ID_FILE_HEADER "commplan-nccl-id 1"

static int file_publish(const cp_launch_env *env, const char *key, const unsigned char *bytes, size_t len, char *err,
                        size_t errlen)
{
    char why[600];
    struct stat st;
    /* Whatever is at the path is replaced, never written through (a symlink
     * included); but a FIFO, a device or a directory there is not an
     * earlier id file: refuse rather than rename over it. */
    if (lstat(env->id_file, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
        return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE: %s is %s, not a regular file; point COMMPLAN_ID_FILE at a "
                    "file's path on a filesystem every rank shares (rank 0 writes it)", env->id_file,
                    cp_file_kind(st.st_mode));
    size_t cap = 512 + strlen(env->job_tag) + strlen(key) + 2 * len;
    char *text = malloc(cap);
    if (!text) return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE: out of host memory");
    int n = snprintf(text, cap, ID_FILE_HEADER "\njob %s\nkey %s\nbytes %zu\n", env->job_tag, key, len);
    for (size_t i = 0; i < len; i++) n += snprintf(text + n, cap - (size_t)n, "%02x", bytes[i]);
    text[n++] = '\n';
    /* An exclusive temporary in the same directory, then rename (safeio.c):
     * readers see the old file or the whole new one, never half of it. 0600:
     * the id lets a process join the communicator. */
    int rc = cp_write_file(env->id_file, text, (size_t)n, 0600, why, sizeof why);
    free(text);
    if (rc != 0)
        return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE=%s: %s; point COMMPLAN_ID_FILE into a directory every rank "
                    "can write and read (a shared filesystem across nodes)", env->id_file, why);
    return CP_RDZV_SHARED;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Parses one id file. Returns 1 when it is this launch's and this plan's
 * (bytes filled), 0 when it is someone else's or malformed (why says which). */
static int file_parse(const char *text, size_t n, const char *job, const char *key, unsigned char *bytes, size_t len,
                      char *why, size_t whylen)
{
    char fjob[256], fkey[MAX_KEY_SUFFIX + 1];
    size_t flen = 0;
    int used = 0;
    if (memchr(text, '\0', n) ||
        sscanf(text, ID_FILE_HEADER "\njob %255s\nkey %200s\nbytes %zu\n%n", fjob, fkey, &flen, &used) != 3 ||
        used == 0) {
        snprintf(why, whylen, "the file there is not a commplan id file");
        return 0;
    }
    if (strcmp(fjob, job) != 0 || strcmp(fkey, key) != 0) {
        snprintf(why, whylen, "the file there is job %s, plan %s: stale or another plan's", fjob, fkey);
        return 0;
    }
    if (flen != len || n - (size_t)used < 2 * len + 1 || text[used + 2 * len] != '\n') {
        snprintf(why, whylen, "the file there holds %zu bytes, expected %zu", flen, len);
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        int hi = hex_digit(text[used + 2 * i]), lo = hex_digit(text[used + 2 * i + 1]);
        if (hi < 0 || lo < 0) {
            snprintf(why, whylen, "the file there has a bad hex digit");
            return 0;
        }
        bytes[i] = (unsigned char)(hi * 16 + lo);
    }
    return 1;
}

static int file_receive(const cp_launch_env *env, const char *key, unsigned char *bytes, size_t len, double timeout_s,
                        char *err, size_t errlen)
{
    enum { MAX_FILE = 64 * 1024 };
    char *text = malloc(MAX_FILE + 1), why[600] = "no file there yet";
    if (!text) return fail(err, errlen, "rank %d: COMMPLAN_ID_FILE: out of host memory", env->rank);
    double start = now_s(), deadline = start + timeout_s, pause = 0.005;
    int rc = CP_RDZV_ERROR;
    for (;;) {
        /* Opened without blocking and refused unless a regular file
         * (safeio.c): a FIFO at the path would otherwise hang open(). */
        size_t n = 0;
        char rerr[600];
        int r = cp_read_file(env->id_file, text, MAX_FILE, &n, rerr, sizeof rerr);
        if (r == CP_READ_ERROR) {
            fail(err, errlen, "rank %d: COMMPLAN_ID_FILE: %s; COMMPLAN_ID_FILE must be a regular file every rank can "
                 "read, on a filesystem every node shares", env->rank, rerr);
            break;
        }
        if (r == CP_READ_TOO_BIG) snprintf(why, sizeof why, "the file there is over %d bytes", MAX_FILE);
        else if (r == CP_READ_OK && file_parse(text, n, env->job_tag, key, bytes, len, why, sizeof why)) {
            rc = CP_RDZV_SHARED;
            break;
        }
        double left = deadline - now_s();
        if (left <= 0) {
            fail(err, errlen, "rank %d: COMMPLAN_ID_FILE=%s: no NCCL id from rank 0 of job %s, plan %s within %.1f s "
                 "(%s); start rank 0 of this launch, use a filesystem every node shares, or raise "
                 "COMMPLAN_INIT_TIMEOUT", env->rank, env->id_file, env->job_tag, key, timeout_s, why);
            break;
        }
        /* Poll quickly at first (rank 0 is usually just behind), then back
         * off so a thousand ranks do not hammer a network filesystem. */
        sleep_s(pause < left ? pause : left);
        pause = pause * 2 < 0.25 ? pause * 2 : 0.25;
    }
    free(text);
    return rc;
}

/* ---- the end of an id file's life ------------------------------------------------------------------------------
 * A run reads the id file, the next run of the binary in the same job (same
 * job tag, same path) must not: once every rank holds the id, rank 0 removes
 * the file, so a later run's ranks wait for that run's rank 0 instead of
 * taking the dead id. After NCCL's init that is cp_rendezvous_release alone
 * (NCCL's root answers no rank before every rank has connected, and no rank
 * gets past init before rank 0 does); without NCCL, cp_rendezvous_confirm
 * is the barrier (acknowledgement files <file>.ack<rank>). */

/* FNV-1a of an id: names a run's id in an acknowledgement without copying it. */
static uint64_t id_hash(const unsigned char *b, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* Whether the id file still holds exactly these bytes for this job and plan:
 * 1 yes, 0 no (missing, another run's, malformed), -1 unreadable (why). */
static int file_holds(const cp_launch_env *env, const char *key, const unsigned char *bytes, size_t len, char *why,
                      size_t whylen)
{
    enum { MAX_FILE = 64 * 1024 };
    char *text = malloc(MAX_FILE + 1), pwhy[600];
    unsigned char *got = malloc(len + 1);
    size_t n = 0;
    int rc = -1;
    if (!text || !got) snprintf(why, whylen, "out of host memory");
    else {
        int r = cp_read_file(env->id_file, text, MAX_FILE, &n, why, whylen);
        if (r == CP_READ_MISSING || r == CP_READ_TOO_BIG) rc = 0;
        else if (r == CP_READ_OK)
            rc = file_parse(text, n, env->job_tag, key, got, len, pwhy, sizeof pwhy) && !memcmp(got, bytes, len);
    }
    free(text);
    free(got);
    return rc;
}

int cp_rendezvous_release(const cp_launch_env *env, const char *key_suffix, const void *bytes, size_t len, char *err,
                          size_t errlen)
{
    if (env->id_channel != CP_ID_FILE || env->world_size <= 1 || env->rank != 0 || !key_suffix) return 0;
    char why[800], eb[128];
    /* Only this run's file: whatever else is there now is left alone. */
    int holds = file_holds(env, key_suffix, bytes, len, why, sizeof why);
    if (holds < 0)
        return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE: %s; a later run of the binary in this job could read this "
                    "run's NCCL id: remove %s before the next run", why, env->id_file);
    if (holds && unlink(env->id_file) != 0 && errno != ENOENT)
        return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE: removing %s after every rank read it failed: %s; a later "
                    "run of the binary in this job could read this run's NCCL id: remove it before the next run, and "
                    "let rank 0 write in that directory", env->id_file, errstr(errno, eb, sizeof eb));
    return 0;
}

static int ack_path(const cp_launch_env *env, int rank, char *out, size_t n)
{
    int w = snprintf(out, n, "%s.ack%d", env->id_file, rank);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

int cp_rendezvous_confirm(const cp_launch_env *env, const char *key_suffix, const void *bytes, size_t len,
                          double timeout_s, char *err, size_t errlen)
{
    if (env->id_channel != CP_ID_FILE || env->world_size <= 1 || !key_suffix) return 0;
    if (timeout_s <= 0) timeout_s = env->init_timeout_s > 0 ? env->init_timeout_s : 300.0;
    char path[sizeof env->id_file + 32], why[800] = "", text[64];
    const unsigned char *id = bytes;
    int world = env->world_size, r = env->rank;
    snprintf(text, sizeof text, "commplan-nccl-ack %016llx\n", (unsigned long long)id_hash(id, len));
    double start = now_s(), deadline = start + timeout_s, pause = 0.005;
    if (r != 0) {
        /* This rank holds the id; then it waits for rank 0 to remove the file,
         * so that its next run cannot start before the file is gone. */
        if (ack_path(env, r, path, sizeof path) != 0 ||
            cp_write_file(path, text, strlen(text), 0600, why, sizeof why) != 0)
            return fail(err, errlen, "rank %d: COMMPLAN_ID_FILE: acknowledging the NCCL id failed: %s; every rank must "
                        "be able to write beside COMMPLAN_ID_FILE=%s", r, why[0] ? why : "path too long", env->id_file);
        for (;;) {
            int holds = file_holds(env, key_suffix, id, len, why, sizeof why);
            if (holds < 0)
                return fail(err, errlen, "rank %d: COMMPLAN_ID_FILE: %s", r, why);
            if (!holds) return 0;
            double left = deadline - now_s();
            if (left <= 0)
                return fail(err, errlen, "rank %d: COMMPLAN_ID_FILE=%s: rank 0 did not retire the NCCL id within %.1f "
                            "s of this rank reading it; start every rank of this launch, or raise "
                            "COMMPLAN_INIT_TIMEOUT", r, env->id_file, timeout_s);
            sleep_s(pause < left ? pause : left);
            pause = pause * 2 < 0.25 ? pause * 2 : 0.25;
        }
    }
    /* Rank 0: every other rank's acknowledgement of this id (an earlier
     * run's names another id and does not count), then the files go. */
    unsigned char *seen = calloc((size_t)world, 1);
    if (!seen) return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE: out of host memory");
    int missing = 1, rc = 0;
    for (int q = 1; q < world; q++)
        if (ack_path(env, q, path, sizeof path) != 0) {
            free(seen);
            return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE=%s is too long for its acknowledgement files",
                        env->id_file);
        }
    while (missing) {
        missing = 0;
        for (int q = 1; q < world; q++) {
            if (seen[q]) continue;
            char got[64];
            size_t n = 0;
            ack_path(env, q, path, sizeof path);
            int rr = cp_read_file(path, got, sizeof got - 1, &n, why, sizeof why);
            if (rr == CP_READ_ERROR) {
                free(seen);
                return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE: %s", why);
            }
            if (rr == CP_READ_OK && n == strlen(text) && !memcmp(got, text, n)) seen[q] = 1;
            else if (!missing) missing = q;
        }
        if (!missing) break;
        double left = deadline - now_s();
        if (left <= 0) {
            free(seen);
            return fail(err, errlen, "rank 0: COMMPLAN_ID_FILE=%s: rank %d did not acknowledge the NCCL id within %.1f "
                        "s; start every rank of this launch, or raise COMMPLAN_INIT_TIMEOUT", env->id_file, missing,
                        timeout_s);
        }
        sleep_s(pause < left ? pause : left);
        pause = pause * 2 < 0.25 ? pause * 2 : 0.25;
    }
    free(seen);
    for (int q = 1; q < world && rc == 0; q++) {
        char eb[128];
        ack_path(env, q, path, sizeof path);
        if (unlink(path) != 0 && errno != ENOENT)
            rc = fail(err, errlen, "rank 0: COMMPLAN_ID_FILE: removing %s failed: %s", path, errstr(errno, eb, sizeof eb));
    }
    return rc ? rc : cp_rendezvous_release(env, key_suffix, bytes, len, err, errlen);
}

/* ---- torchrun's TCPStore ---------------------------------------------------------------------------------------
 * The wire protocol of PyTorch's TCPStore, client side. Read from PyTorch's
 * main branch after 2.10 (a mirror at commit a9a89d9c; no 2.11 tag could be
 * fetched), where the libuv server is the only one and torchrun's agent store
 * is that server; the earlier libuv server at c10d/TCPStoreLibUvBackend.cpp
 * (read at commit 01afc5c9: QUEUE_* but no LIST_KEYS/BARRIER yet) handles
 * these queries identically:
 *   torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp (was ../TCPStoreBackend.hpp), lines 13-40:
 *     validationMagicNumber = 0x3C85F7CE; enum class QueryType : uint8_t { VALIDATE=0, SET=1, COMPARE_SET=2,
 *     GET=3, ADD=4, CHECK=5, WAIT=6, GETNUMKEYS=7, DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11,
 *     CANCEL_WAIT=12, PING=13, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS, BARRIER } (only appended to);
 *     WaitResponseType : uint8_t { STOP_WAITING=0, WAIT_CANCELED=1 }.
 *   TCPStore.cpp, class SendBuffer: a query is one QueryType byte, then its arguments; appendString and
 *     appendBytes send a uint64_t length (host byte order) and the bytes; appendValue<T> sends T's bytes.
 *   TCPStore.cpp, TCPStore::TCPStore: after connect the client sends validate() (VALIDATE + uint32 magic, no
 *     reply) and ping() (PING + uint32 nonce = getpid(); the server echoes the uint32), retrying connect +
 *     validate + ping with backoff until the timeout.
 *   TCPStore.cpp, TCPStore::set / get / doWait: keys carry keyPrefix_ = "/" (TCPStore.hpp); SET = key, value,
 *     no reply; WAIT = uint64 key count, keys, reply one byte STOP_WAITING once all are set; GET = key, reply
 *     uint64 length + bytes (recvVector, Utils.hpp: SizeType = uint64_t).
 *   store/TCPStoreLibUvBackend.cpp, UvClient::processBuf: a new client's first query must be VALIDATE with the
 *     magic (isMiscellaneousClient) or it is ignored; queries on one connection are handled in order, so a
 *     PING answered after SET means the SET is stored. parse_get_command answers an unset key with zero bytes,
 *     hence WAIT before GET. onClose -> unregisterClient -> clearClientWaitState: closing the socket is how a
 *     timed-out WAIT is given up. MAX_STRING_LEN 8 KiB per key, MAX_PAYLOAD_LEN 8 MiB per value. */
enum { Q_VALIDATE = 0, Q_SET = 1, Q_GET = 3, Q_ADD = 4, Q_WAIT = 6, Q_PING = 13 };
enum { W_STOP_WAITING = 0 };
static const uint32_t TCPSTORE_MAGIC = 0x3C85F7CEu;

typedef struct {
    unsigned char *p;
    size_t n, cap;
} buf;

static int buf_put(buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return 0;
}
static int buf_u8(buf *b, uint8_t v) { return buf_put(b, &v, 1); }
static int buf_u32(buf *b, uint32_t v) { return buf_put(b, &v, 4); }
static int buf_bytes(buf *b, const void *p, size_t n)
{
    uint64_t size = n;
    return buf_put(b, &size, 8) || buf_put(b, p, n);
}

/* Waits until fd is ready for events or the deadline: 1 ready, 0 timed out, -1 error (errno). */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return 0;
        struct pollfd p = { fd, events, 0 };
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r > 0) return 1;
    }
}

/* I/O with a deadline on a non-blocking socket. Return 0, or -1 (IO_TIMEOUT
 * when the deadline passed) with why. */
enum { IO_TIMEOUT = -2 };
static int send_all(int fd, const void *p, size_t n, double deadline, char *why, size_t whylen)
{
    char eb[128];
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w >= 0) { c += w; n -= (size_t)w; continue; }
        if (errno == EINTR) continue;
        if (errno == EPIPE || errno == ECONNRESET) {
            snprintf(why, whylen, "the store closed the connection");
            return -1;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(why, whylen, "send failed: %s", errstr(errno, eb, sizeof eb));
            return -1;
        }
        int r = wait_fd(fd, POLLOUT, deadline);
        if (r == 0) {
            snprintf(why, whylen, "the store took no data");
            return IO_TIMEOUT;
        }
        if (r < 0) {
            snprintf(why, whylen, "poll failed: %s", errstr(errno, eb, sizeof eb));
            return -1;
        }
    }
    return 0;
}

static int recv_all(int fd, void *p, size_t n, double deadline, const char *what, char *why, size_t whylen)
{
    char eb[128];
    char *c = p;
    while (n > 0) {
        ssize_t r = recv(fd, c, n, 0);
        if (r > 0) { c += r; n -= (size_t)r; continue; }
        if (r == 0 || (r < 0 && errno == ECONNRESET)) {
            /* A reset is a close with our query still unread. */
            snprintf(why, whylen, "the store closed the connection instead of answering %s", what);
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(why, whylen, "recv of the answer to %s failed: %s", what, errstr(errno, eb, sizeof eb));
            return -1;
        }
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0) {
            snprintf(why, whylen, "no answer to %s", what);
            return IO_TIMEOUT;
        }
        if (w < 0) {
            snprintf(why, whylen, "poll failed: %s", errstr(errno, eb, sizeof eb));
            return -1;
        }
    }
    return 0;
}

/* One TCP connection to host:port before the deadline; -1 with why, and
 * *timed_out set when the deadline cut the attempt short. */
static int connect_once(const char *host, int port, double deadline, int *fatal, int *timed_out, char *why,
                        size_t whylen)
{
    char service[16], eb[128];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int g = getaddrinfo(host, service, &hints, &res);
    if (g != 0) {
        snprintf(why, whylen, "MASTER_ADDR=%s does not resolve: %s", host,
                 g == EAI_SYSTEM ? errstr(errno, eb, sizeof eb) : gai_strerror(g));
        *fatal = g != EAI_AGAIN && g != EAI_SYSTEM; /* a name that does not exist will not appear */
        return -1;
    }
    int fd = -1;
    snprintf(why, whylen, "no address for %s", host);
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        *timed_out = 0;
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            snprintf(why, whylen, "socket failed: %s", errstr(errno, eb, sizeof eb));
            continue;
        }
        int flags = fcntl(fd, F_GETFL), one = 1, e = 0;
        if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ||
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
            e = errno;
        else if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            e = errno;
            if (e == EINPROGRESS || e == EINTR) {
                int r = wait_fd(fd, POLLOUT, deadline);
                socklen_t sl = sizeof e;
                if (r < 0) e = errno;
                else if (r == 0) e = ETIMEDOUT, *timed_out = 1;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) != 0) e = errno;
            }
        }
        if (e) {
            snprintf(why, whylen, "connect failed: %s", errstr(e, eb, sizeof eb));
            close(fd); /* a failed socket: nothing left to lose */
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

/* Connect, VALIDATE and PING as TCPStore's constructor does, retrying with
 * backoff until the deadline (the agent may not accept yet, or its backlog
 * is full). Returns the socket, or -1 with why. */
static int store_open(const cp_launch_env *env, double deadline, char *why, size_t whylen)
{
    double pause = 0.05;
    /* The last attempt may be cut short by the deadline; an earlier one's
     * reason ("refused", "closed the connection") says more than "timed out". */
    char earlier[800] = "";
    for (;;) {
        int fatal = 0, timed_out = 0;
        int fd = connect_once(env->store_host, env->store_port, deadline, &fatal, &timed_out, why, whylen);
        if (fd >= 0) {
            uint32_t nonce = (uint32_t)getpid() ^ ((uint32_t)env->rank << 16), echo = 0;
            buf q = { 0 };
            int ok = !buf_u8(&q, Q_VALIDATE) && !buf_u32(&q, TCPSTORE_MAGIC) && !buf_u8(&q, Q_PING) &&
                     !buf_u32(&q, nonce);
            if (!ok) snprintf(why, whylen, "out of host memory");
            int io = ok ? send_all(fd, q.p, q.n, deadline, why, whylen) : -1;
            if (io == 0) io = recv_all(fd, &echo, sizeof echo, deadline, "PING", why, whylen);
            timed_out = io == IO_TIMEOUT;
            ok = io == 0;
            free(q.p);
            if (ok && echo == nonce) return fd;
            /* A wrong echo is not a store that is still starting: no retry. */
            if (ok) {
                snprintf(why, whylen, "PING answered %u instead of %u: not a PyTorch TCPStore", echo, nonce);
                fatal = 1;
            }
            close(fd); /* giving up this connection; its error is in why */
        }
        if (!timed_out) snprintf(earlier, sizeof earlier, "%s", why);
        double left = deadline - now_s();
        if (fatal || left <= 0) {
            if (timed_out && earlier[0]) snprintf(why, whylen, "%s", earlier);
            return -1;
        }
        sleep_s(pause < left ? pause : left);
        pause = pause * 2 < 1.0 ? pause * 2 : 1.0;
    }
}

/* ---- the queries commplan sends, each bounded by the deadline ---- */

/* Sends q (built by the caller) and, when want > 0, reads want bytes of answer into ans. */
static int q_roundtrip(int fd, buf *q, void *ans, size_t want, const char *what, double deadline, char *why,
                       size_t whylen)
{
    int io = send_all(fd, q->p, q->n, deadline, why, whylen);
    if (io == 0 && want) io = recv_all(fd, ans, want, deadline, what, why, whylen);
    q->n = 0;
    return io;
}

/* ADD key delta: the key's new value (TCPStore keeps it as decimal text). */
static int q_add(int fd, const char *key, int64_t delta, int64_t *value, double deadline, char *why, size_t whylen)
{
    buf q = { 0 };
    int io = -1;
    if (buf_u8(&q, Q_ADD) || buf_bytes(&q, key, strlen(key)) || buf_put(&q, &delta, 8))
        snprintf(why, whylen, "out of host memory");
    else io = q_roundtrip(fd, &q, value, 8, "ADD", deadline, why, whylen);
    free(q.p);
    return io;
}

/* SET key value, then a PING whose echo means the SET is stored. */
static int q_set(int fd, const char *key, const void *value, size_t len, double deadline, char *why, size_t whylen)
{
    buf q = { 0 };
    uint32_t nonce = (uint32_t)getpid() ^ 0x5e7u, echo = 0;
    int io = -1;
    if (buf_u8(&q, Q_SET) || buf_bytes(&q, key, strlen(key)) || buf_bytes(&q, value, len) || buf_u8(&q, Q_PING) ||
        buf_u32(&q, nonce))
        snprintf(why, whylen, "out of host memory");
    else if ((io = q_roundtrip(fd, &q, &echo, 4, "PING after SET", deadline, why, whylen)) == 0 && echo != nonce) {
        snprintf(why, whylen, "PING after SET answered %u instead of %u", echo, nonce);
        io = -1;
    }
    free(q.p);
    return io;
}

/* WAIT until every key is set. */
static int q_wait(int fd, const char *const *keys, size_t n, double deadline, char *why, size_t whylen)
{
    buf q = { 0 };
    uint64_t count = n;
    uint8_t answer = 0xff;
    int io = buf_u8(&q, Q_WAIT) || buf_put(&q, &count, 8);
    for (size_t i = 0; i < n && !io; i++) io = buf_bytes(&q, keys[i], strlen(keys[i]));
    if (io) {
        snprintf(why, whylen, "out of host memory");
        io = -1;
    } else if ((io = q_roundtrip(fd, &q, &answer, 1, "WAIT", deadline, why, whylen)) == 0 &&
               answer != W_STOP_WAITING) {
        snprintf(why, whylen, "WAIT answered %u instead of STOP_WAITING (0)", answer);
        io = -1;
    }
    free(q.p);
    return io;
}

/* GET key into out: exactly `exact` bytes when exact > 0, else at most cap - 1
 * (NUL-terminated text). *got: the length. A length the server chose is
 * checked before any byte is read, never allocated. */
static int q_get(int fd, const char *key, void *out, size_t cap, size_t exact, size_t *got, double deadline, char *why,
                 size_t whylen)
{
    buf q = { 0 };
    uint64_t n = 0;
    int io = -1;
    if (buf_u8(&q, Q_GET) || buf_bytes(&q, key, strlen(key))) snprintf(why, whylen, "out of host memory");
    else if ((io = q_roundtrip(fd, &q, &n, 8, "GET", deadline, why, whylen)) == 0) {
        if (exact ? n != exact : n >= cap) {
            snprintf(why, whylen, "key %s holds %llu bytes, expected %s%zu (rank 0 runs another build?)", key,
                     (unsigned long long)n, exact ? "" : "fewer than ", exact ? exact : cap);
            io = -1;
        } else if ((io = recv_all(fd, out, (size_t)n, deadline, "GET", why, whylen)) == 0) {
            if (!exact) ((char *)out)[n] = '\0';
            *got = (size_t)n;
        }
    }
    free(q.p);
    return io;
}

/* torchrun's store: one launch of the binary is told from the next by a
 * counter every rank ADDs to (rank r's k-th run gets a value in
 * (k*world, (k+1)*world], since a run ends only after every rank's ADD);
 * inside it, every rank SETs hello/<rank> = "<fingerprint> <plan>", rank 0
 * compares them all, then SETs the NCCL id and the verdict ("ok" or the
 * line every rank prints), which the others WAIT for. Keys:
 *   /commplan/<job>/launches           the counter
 *   /commplan/<job>/launch<k>/hello/<r>, /nccl_id, /verdict */
static int store_share(const cp_launch_env *env, const char *plan_name, const char *fingerprint, unsigned char *bytes,
                       size_t len, double timeout_s, cp_rendezvous_info *info, char *err, size_t errlen)
{
    char base[sizeof env->job_tag + 64], key[sizeof base + 64], why[800] = "", mine[MAX_KEY_SUFFIX + 130];
    static const char where[] = "MASTER_ADDR:MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True";
    double start = now_s(), deadline = start + timeout_s;
    int world = env->world_size, r = env->rank;
    snprintf(mine, sizeof mine, "%s %s", fingerprint, plan_name && plan_name[0] ? plan_name : "?");
    int fd = store_open(env, deadline, why, sizeof why);
    if (fd < 0)
        return fail(err, errlen, "rank %d: torchrun's store %s:%d (%s): %s (gave up after %.1f s); check that "
                    "torchrun's agent is alive and reachable from this node, or set COMMPLAN_ID_FILE=/shared/path",
                    r, env->store_host, env->store_port, where, why, now_s() - start);
    int64_t count = 0, launch = -1;
    int rc = CP_RDZV_ERROR, io = 0, refused = 0;
    char verdict[1024] = "", stage[sizeof key + 64] = "";
    char **keys = NULL;
    snprintf(key, sizeof key, "/commplan/%s/launches", env->job_tag);
    if ((io = q_add(fd, key, 1, &count, deadline, why, sizeof why)) != 0) goto done;
    if (count < 1) {
        snprintf(why, sizeof why, "ADD of %s answered %lld", key, (long long)count);
        io = -1;
        goto done;
    }
    launch = (count - 1) / world;
    if (info) info->launch = launch;
    snprintf(base, sizeof base, "/commplan/%s/launch%lld", env->job_tag, (long long)launch);
    snprintf(key, sizeof key, "%s/hello/%d", base, r);
    snprintf(stage, sizeof stage, "SET %s", key);
    if ((io = q_set(fd, key, mine, strlen(mine), deadline, why, sizeof why)) != 0) goto done;
    char verdict_key[sizeof key], id_key[sizeof key];
    snprintf(verdict_key, sizeof verdict_key, "%s/verdict", base);
    snprintf(id_key, sizeof id_key, "%s/nccl_id", base);
    if (r == 0) {
        /* Every other rank's hello, then each compared with this rank's. */
        keys = calloc((size_t)world, sizeof *keys);
        if (!keys) { snprintf(why, sizeof why, "out of host memory"); io = -1; goto done; }
        for (int q = 1; q < world; q++) {
            if (!(keys[q] = malloc(sizeof key))) { snprintf(why, sizeof why, "out of host memory"); io = -1; goto done; }
            snprintf(keys[q], sizeof key, "%s/hello/%d", base, q);
        }
        snprintf(stage, sizeof stage, "WAIT for the other %d ranks' hello", world - 1);
        if ((io = q_wait(fd, (const char *const *)keys + 1, (size_t)world - 1, deadline, why, sizeof why)) != 0)
            goto done;
        for (int q = 1; q < world && !verdict[0]; q++) {
            char theirs[sizeof mine];
            size_t got = 0;
            snprintf(stage, sizeof stage, "GET %s", keys[q]);
            if ((io = q_get(fd, keys[q], theirs, sizeof theirs, 0, &got, deadline, why, sizeof why)) != 0) goto done;
            if (strcmp(theirs, mine) != 0) {
                char fp[40] = "", name[130] = "";
                if (sscanf(theirs, "%39s %129s", fp, name) != 2) snprintf(name, sizeof name, "?");
                for (char *c = name; *c; c++) if (*c < 0x21 || *c > 0x7e) *c = '?';
                for (char *c = fp; *c; c++) if (*c < 0x21 || *c > 0x7e) *c = '?';
                snprintf(verdict, sizeof verdict, "rank %d runs plan %s (fingerprint %.16s), rank 0 plan %s (fingerprint "
                         "%.16s): every rank must run the same build; deploy one build of one plan to every rank",
                         q, name, fp, plan_name && plan_name[0] ? plan_name : "?", fingerprint);
            }
        }
        if (!verdict[0]) {
            snprintf(stage, sizeof stage, "SET %s", id_key);
            if ((io = q_set(fd, id_key, bytes, len, deadline, why, sizeof why)) != 0) goto done;
        }
        snprintf(stage, sizeof stage, "SET %s", verdict_key);
        if ((io = q_set(fd, verdict_key, verdict[0] ? verdict : "ok", strlen(verdict[0] ? verdict : "ok"), deadline,
                        why, sizeof why)) != 0)
            goto done;
        refused = verdict[0] != '\0';
    } else {
        size_t got = 0;
        const char *vk = verdict_key;
        snprintf(stage, sizeof stage, "WAIT for rank 0's verdict");
        if ((io = q_wait(fd, &vk, 1, deadline, why, sizeof why)) != 0) goto done;
        snprintf(stage, sizeof stage, "GET %s", verdict_key);
        if ((io = q_get(fd, verdict_key, verdict, sizeof verdict, 0, &got, deadline, why, sizeof why)) != 0) goto done;
        if (strcmp(verdict, "ok") != 0) {
            /* rank 0's refusal is one printable line starting "rank "; anything else is not commplan's */
            int printable = strncmp(verdict, "rank ", 5) == 0;
            for (const char *c = verdict; *c && printable; c++) printable = *c >= 0x20 && *c < 0x7f;
            if (!printable) {
                snprintf(why, sizeof why, "key %s holds %zu bytes that no commplan rank 0 writes", verdict_key, got);
                verdict[0] = '\0';
                io = -1;
                goto done;
            }
            refused = 1;
        } else {
            snprintf(stage, sizeof stage, "GET %s", id_key);
            if ((io = q_get(fd, id_key, bytes, len + 1, len, &got, deadline, why, sizeof why)) != 0) goto done;
        }
    }
    rc = refused ? CP_RDZV_ERROR : CP_RDZV_SHARED;
done:
    if (keys)
        for (int q = 0; q < world; q++) free(keys[q]);
    free(keys);
    /* Closing ends a pending WAIT on the server (clearClientWaitState). */
    if (close(fd) != 0 && rc == CP_RDZV_SHARED) {
        char eb[128];
        snprintf(why, sizeof why, "close failed: %s", errstr(errno, eb, sizeof eb));
        rc = CP_RDZV_ERROR, io = -1;
    }
    if (rc == CP_RDZV_SHARED) return rc;
    if (refused) return fail(err, errlen, "rank %d: %s", r, verdict);
    /* The counter cannot heal a run that some ranks never counted (they
     * failed before reaching it): every later run in the launch then pairs
     * ranks of different runs. Each rank names the run it counted, so
     * differing numbers across the ranks' lines show it. */
    char counted[256] = "";
    if (launch >= 0)
        snprintf(counted, sizeof counted, "; this rank counted run %lld of the binary in this torchrun launch: if the "
                 "ranks' lines name different runs, an earlier run failed on some ranks before this point, so restart "
                 "the launch", (long long)launch);
    if (io == IO_TIMEOUT)
        return fail(err, errlen, "rank %d: torchrun's store %s:%d (%s): %s did not finish within %.1f s (%s); start "
                    "every rank of the same build (rank 0 too), or raise COMMPLAN_INIT_TIMEOUT (COMMPLAN_ID_FILE=/shared/path "
                    "bypasses the store)%s", r, env->store_host,
                    env->store_port, where, stage[0] ? stage : "the launch counter", timeout_s, why, counted);
    return fail(err, errlen, "rank %d: torchrun's store %s:%d (%s): %s; MASTER_PORT must be torchrun's own store, "
                "or set COMMPLAN_ID_FILE=/shared/path to bypass it", r, env->store_host, env->store_port, where, why);
}

/* ---- dispatch -------------------------------------------------------------------------------------------------- */

int cp_rendezvous_share(const cp_launch_env *env, const char *key_suffix, void *bytes, size_t len, double timeout_s,
                        char *err, size_t errlen)
{
    return cp_rendezvous_share_plan(env, NULL, key_suffix, bytes, len, timeout_s, NULL, err, errlen);
}

int cp_rendezvous_share_plan(const cp_launch_env *env, const char *plan_name, const char *key_suffix, void *bytes,
                             size_t len, double timeout_s, cp_rendezvous_info *info, char *err, size_t errlen)
{
    if (info) info->launch = 0;
    if (env->id_channel == CP_ID_NCCL_COMM_ID || env->id_channel == CP_ID_MASTER_ADDR) return CP_RDZV_NCCL_OWN;
    if (env->id_channel == CP_ID_ALONE || env->world_size <= 1) return CP_RDZV_SHARED;
    if (!key_suffix || !printable_word(key_suffix) || strlen(key_suffix) > MAX_KEY_SUFFIX)
        return fail(err, errlen, "rank %d: rendezvous key '%s' must be 1..%d printable characters without spaces",
                    env->rank, key_suffix ? key_suffix : "(null)", MAX_KEY_SUFFIX);
    if (plan_name && (strlen(plan_name) > 128 || (plan_name[0] && !printable_word(plan_name))))
        return fail(err, errlen, "rank %d: plan name must be at most 128 printable characters without spaces",
                    env->rank);
    if (len == 0 || len > MAX_SHARED_BYTES)
        return fail(err, errlen, "rank %d: rendezvous of %zu bytes (1..%d allowed)", env->rank, len, MAX_SHARED_BYTES);
    if (timeout_s <= 0) timeout_s = env->init_timeout_s > 0 ? env->init_timeout_s : 300.0;
    if (env->id_channel == CP_ID_FILE)
        return env->rank == 0 ? file_publish(env, key_suffix, bytes, len, err, errlen)
                              : file_receive(env, key_suffix, bytes, len, timeout_s, err, errlen);
    if (env->id_channel == CP_ID_TCPSTORE)
        return store_share(env, plan_name, key_suffix, bytes, len, timeout_s, info, err, errlen);
    return fail(err, errlen, "rank %d: unknown NCCL id channel %d", env->rank, env->id_channel);
}
