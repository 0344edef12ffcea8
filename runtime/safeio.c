/* Reads of regular files only, writes through an exclusive temporary file
 * and a rename, one-line messages; see safeio.h. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safeio.h"

enum { OUT_TRIES = 100 };

/* strerror is not thread-safe and ranks may be threads. */
static const char *errstr(int e, char *buf, size_t n)
{
    if (strerror_r(e, buf, n) != 0) snprintf(buf, n, "errno %d", e);
    return buf;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
        cp_one_line(err);
    }
    return -1;
}

void cp_one_line(char *s)
{
    for (unsigned char *c = (unsigned char *)s; *c; c++)
        if (*c < 0x20 || *c == 0x7f) *c = '?';
}

void cp_error(const char *fmt, ...)
{
    char line[8192];
    int n = snprintf(line, sizeof line, "commplan: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    cp_one_line(line);
    size_t len = strlen(line);
    line[len++] = '\n';
    fwrite(line, 1, len, stderr); /* stderr is unbuffered: one write, one line */
}

const char *cp_file_kind(mode_t m)
{
    if (S_ISREG(m)) return "a regular file";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

/* ---- reads ---- */

int cp_read_file(const char *path, char *buf, size_t max, size_t *len, char *err, size_t errlen)
{
    char eb[128];
    struct stat st;
    *len = 0;
    buf[0] = '\0';
    /* O_NONBLOCK: opening a FIFO with no writer (or a device that would
     * wait) returns at once, and fstat below refuses it. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) {
            fail(err, errlen, "%s does not exist", path);
            return CP_READ_MISSING;
        }
        /* A socket cannot be opened (ENXIO): say what it is. */
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
            return fail(err, errlen, "%s is %s, not a regular file", path, cp_file_kind(st.st_mode));
        return fail(err, errlen, "%s: open failed: %s", path, errstr(e, eb, sizeof eb));
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd); /* the fstat error is the one to report */
        return fail(err, errlen, "%s: fstat failed: %s", path, errstr(e, eb, sizeof eb));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd); /* nothing was read */
        return fail(err, errlen, "%s is %s, not a regular file", path, cp_file_kind(st.st_mode));
    }
    int rc = CP_READ_OK;
    if (st.st_size > 0 && (unsigned long long)st.st_size > (unsigned long long)max) {
        fail(err, errlen, "%s is %lld bytes, over the limit of %zu", path, (long long)st.st_size, max);
        rc = CP_READ_TOO_BIG;
    }
    /* The size can change under us (and /proc files say 0): read at most
     * max + 1 bytes whatever fstat said. */
    size_t n = 0;
    while (rc == CP_READ_OK) {
        ssize_t r = read(fd, buf + n, max + 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = fail(err, errlen, "%s: read failed: %s", path, errstr(errno, eb, sizeof eb));
            break;
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n > max) {
            fail(err, errlen, "%s is over the limit of %zu bytes", path, max);
            rc = CP_READ_TOO_BIG;
        }
    }
    if (close(fd) != 0 && rc == CP_READ_OK)
        rc = fail(err, errlen, "%s: close failed: %s", path, errstr(errno, eb, sizeof eb));
    if (rc != CP_READ_OK) n = 0;
    buf[n] = '\0';
    *len = n;
    return rc;
}

/* ---- writes ---- */

int cp_out_check_name(const char *name, char *err, size_t errlen)
{
    if (!name[0]) return fail(err, errlen, "an empty file name");
    if (strchr(name, '/')) return fail(err, errlen, "file name '%s' holds '/'", name);
    if (!strcmp(name, ".") || !strcmp(name, ".."))
        return fail(err, errlen, "file name '%s' names a directory, not a file", name);
    return 0;
}

/* path's directory (malloc'd; NULL when path has no '/') and last component. */
static int split_path(const char *path, char **dir, const char **name)
{
    const char *slash = strrchr(path, '/');
    *dir = NULL;
    *name = slash ? slash + 1 : path;
    if (!slash) return 0;
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    *dir = malloc(n + 1);
    if (!*dir) return -1;
    memcpy(*dir, path, n);
    (*dir)[n] = '\0';
    return 0;
}

int cp_out_check_path(const char *path, char *err, size_t errlen)
{
    char *dir, eb[128];
    const char *name;
    struct stat st;
    if (!path[0]) return fail(err, errlen, "an empty path");
    if (split_path(path, &dir, &name)) return fail(err, errlen, "out of host memory");
    int rc = 0;
    if (!name[0] || !strcmp(name, ".") || !strcmp(name, ".."))
        rc = fail(err, errlen, "%s names a directory, not a file", path);
    else if (stat(dir ? dir : ".", &st) != 0)
        rc = fail(err, errlen, "%s: directory %s: %s", path, dir ? dir : ".", errstr(errno, eb, sizeof eb));
    else if (!S_ISDIR(st.st_mode))
        rc = fail(err, errlen, "%s: %s is %s, not a directory", path, dir ? dir : ".", cp_file_kind(st.st_mode));
    else if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        rc = fail(err, errlen, "%s is a directory, not a file", path);
    free(dir);
    return rc;
}

static void out_release(cp_out *o)
{
    free(o->tmp);
    free(o->target);
    memset(o, 0, sizeof *o);
}

int cp_out_open(cp_out *o, const char *dir, const char *name, mode_t mode, char *err, size_t errlen)
{
    char eb[128];
    memset(o, 0, sizeof *o);
    if (cp_out_check_name(name, err, errlen)) return -1;
    size_t dl = dir ? strlen(dir) : 0;
    const char *d = dl ? dir : "", *sep = dl && dir[dl - 1] != '/' ? "/" : "";
    size_t cap = dl + strlen(name) + 64;
    o->target = malloc(cap);
    o->tmp = malloc(cap);
    if (!o->target || !o->tmp) {
        out_release(o);
        return fail(err, errlen, "out of host memory");
    }
    snprintf(o->target, cap, "%s%s%s", d, sep, name);
    /* Hidden, beside the target (a rename never crosses filesystems), and
     * never an existing file or symlink: O_EXCL fails on any, and the next
     * name is tried. The name part is cut so the whole stays under NAME_MAX. */
    for (int k = 0; k < OUT_TRIES; k++) {
        snprintf(o->tmp, cap, "%s%s.%.200s.%ld.%d.tmp", d, sep, name, (long)getpid(), k);
        int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, mode);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) {
            fail(err, errlen, "open of %s failed: %s", o->tmp, errstr(errno, eb, sizeof eb));
            out_release(o);
            return -1;
        }
        o->f = fdopen(fd, "w");
        if (!o->f) {
            fail(err, errlen, "fdopen of %s failed: %s", o->tmp, errstr(errno, eb, sizeof eb));
            close(fd);      /* nothing written */
            unlink(o->tmp); /* best effort: the error above is what matters */
            out_release(o);
            return -1;
        }
        return 0;
    }
    fail(err, errlen, "open of a temporary file for %s failed: %d names (.%.200s.%ld.*.tmp) are taken; remove them",
         o->target, OUT_TRIES, name, (long)getpid());
    out_release(o);
    return -1;
}

int cp_out_open_path(cp_out *o, const char *path, mode_t mode, char *err, size_t errlen)
{
    char *dir;
    const char *name;
    memset(o, 0, sizeof *o);
    if (!path[0]) return fail(err, errlen, "an empty path");
    if (split_path(path, &dir, &name)) return fail(err, errlen, "out of host memory");
    if (!name[0] || !strcmp(name, ".") || !strcmp(name, "..")) {
        free(dir);
        return fail(err, errlen, "%s names a directory, not a file", path);
    }
    int rc = cp_out_open(o, dir, name, mode, err, errlen);
    free(dir);
    return rc;
}

int cp_out_commit(cp_out *o, char *err, size_t errlen)
{
    char eb[128];
    if (!o->f) return fail(err, errlen, "no output file is open");
    const char *step = NULL;
    int e = 0, had_error = ferror(o->f) != 0;
    if (fflush(o->f) != 0) step = "write", e = errno;
    else if (had_error) step = "write"; /* e = 0: the failing write's errno is gone */
    else if (fsync(fileno(o->f)) != 0 && errno != EINVAL) step = "fsync", e = errno; /* EINVAL: cannot sync here */
    if (fclose(o->f) != 0 && !step) step = "close", e = errno;
    o->f = NULL;
    if (!step && rename(o->tmp, o->target) != 0) step = "rename", e = errno;
    if (step) {
        unlink(o->tmp); /* best effort: the error below is what matters */
        if (!strcmp(step, "rename"))
            fail(err, errlen, "rename of %s to %s failed: %s", o->tmp, o->target, errstr(e, eb, sizeof eb));
        else
            fail(err, errlen, "%s of %s failed: %s", step, o->tmp,
                 e ? errstr(e, eb, sizeof eb) : "an earlier write failed");
    }
    out_release(o);
    return step ? -1 : 0;
}

void cp_out_abort(cp_out *o)
{
    if (o->f) {
        fclose(o->f); /* discarded: its errors do not matter */
        unlink(o->tmp);
    }
    out_release(o);
}

int cp_write_file(const char *path, const void *data, size_t n, mode_t mode, char *err, size_t errlen)
{
    cp_out o;
    if (cp_out_open_path(&o, path, mode, err, errlen)) return -1;
    if (n && fwrite(data, 1, n, o.f) != n) {
        char eb[128];
        int e = errno;
        fail(err, errlen, "write of %s failed: %s", o.tmp, errstr(e, eb, sizeof eb));
        cp_out_abort(&o);
        return -1;
    }
    return cp_out_commit(&o, err, errlen);
}

int cp_close_stream(FILE *f, char *err, size_t errlen)
{
    char eb[128];
    int had_error = ferror(f) != 0, e = 0;
    int flushed = fflush(f) == 0;
    if (!flushed) e = errno;
    int closed = fclose(f) == 0;
    if (!closed && !e) e = errno;
    /* fd already closed (prog >&-) and nothing was ever written: fine. */
    if (!had_error && flushed && !closed && e == EBADF) return 0;
    if (had_error || !flushed || !closed)
        return fail(err, errlen, "%s", e ? errstr(e, eb, sizeof eb) : "an earlier write failed");
    return 0;
}
