/* One rule for every file the runtime reads or writes, and for its error lines.
 *
 * Reads: the path is opened O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC (a
 * FIFO with no writer does not block the open), fstat'ed, and refused unless
 * it is a regular file; its size is bounded by the caller.
 *
 * Writes: a temporary file created exclusively (O_CREAT | O_EXCL |
 * O_NOFOLLOW) in the target's own directory, every write, the flush, the
 * fsync and the close checked, then renamed over the target. A symlink
 * waiting under the target's name is replaced, never written through; a name
 * holding '/' or being "." or ".." is refused, so nothing is written outside
 * the directory asked for. A failed output leaves no temporary behind.
 *
 * Messages are one line each: every byte a user gave (paths, values) is
 * printed with control characters as '?'. Thread-safe (no strerror). */
#ifndef COMMPLAN_SAFEIO_H
#define COMMPLAN_SAFEIO_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

enum {
    CP_READ_ERROR = -1,   /* err: "<path> is a FIFO, not a regular file", "<path>: open failed: ..." */
    CP_READ_OK = 0,       /* buf[0..*len) holds the file, buf[*len] = '\0' */
    CP_READ_MISSING = 1,  /* nothing at path (ENOENT); err says so */
    CP_READ_TOO_BIG = 2,  /* a regular file of more than max bytes; err says so */
};

/* "a FIFO", "a character device", "a directory", ... for a file that is not regular. */
const char *cp_file_kind(mode_t mode);

/* Reads the regular file at path into buf, which holds max + 1 bytes.
 * Returns one of the CP_READ_* values; err (every value but CP_READ_OK)
 * gets one line that starts with the path. */
int cp_read_file(const char *path, char *buf, size_t max, size_t *len, char *err, size_t errlen);

/* An output file being written: fprintf to f, then cp_out_commit (or
 * cp_out_abort). Zero-initialise before use; both calls leave it zeroed. */
typedef struct {
    FILE *f;      /* the temporary file, open for writing */
    char *tmp;    /* its path: <dir>/.<name>.<pid>.<k>.tmp */
    char *target; /* <dir>/<name> */
} cp_out;

/* Refuses a name that holds '/', is empty, "." or ".." (err says why). 0 or -1. */
int cp_out_check_name(const char *name, char *err, size_t errlen);
/* Checks, before a long run, that path names a file that cp_out_open_path
 * could create: a good name in an existing directory, not itself a
 * directory. 0 or -1 with err. */
int cp_out_check_path(const char *path, char *err, size_t errlen);
/* Creates the temporary file for dir/name (mode before the umask, e.g.
 * 0666; 0600 for secrets). 0, or -1 with err ("open of <tmp> failed: ..."). */
int cp_out_open(cp_out *o, const char *dir, const char *name, mode_t mode, char *err, size_t errlen);
/* The same for a path: its directory and its last component. */
int cp_out_open_path(cp_out *o, const char *path, mode_t mode, char *err, size_t errlen);
/* Flush, fsync and close the temporary file, every step checked, then
 * rename it over the target. 0, or -1 with err naming the step ("write of
 * <tmp> failed: No space left on device"); the temporary is removed. */
int cp_out_commit(cp_out *o, char *err, size_t errlen);
/* Closes and removes the temporary file; the target is untouched. */
void cp_out_abort(cp_out *o);
/* The whole of data[0..n) as path, through cp_out_open_path and cp_out_commit. */
int cp_write_file(const char *path, const void *data, size_t n, mode_t mode, char *err, size_t errlen);

/* Closes a stream the program wrote to (stdout at exit), as coreutils'
 * close_stdout: an earlier write error, a failed flush or a failed close is
 * reported (err: "<reason>"); 0 or -1. A stream that was already closed
 * with nothing written to it is not an error. */
int cp_close_stream(FILE *f, char *err, size_t errlen);

/* Control characters (newline included) in s become '?', so s prints as one line. */
void cp_one_line(char *s);
/* Prints "commplan: <message>\n" on stderr with one write, as one line. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
void cp_error(const char *fmt, ...);

#endif
