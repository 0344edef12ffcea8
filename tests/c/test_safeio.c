/* cmocka tests for runtime/safeio.c, the one rule for every file the
 * runtime reads or writes: reads refuse a FIFO (without blocking), a
 * device, a directory, a socket and an oversized file; writes go through an
 * exclusive temporary file renamed over the target, so a symlink planted
 * under the target's name or the temporary's is never written through, a
 * name cannot leave its directory, and every failed write, flush and close
 * is reported (a full device, a file-size limit) with no temporary left. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "safeio.h"

enum { MAX = 64 };

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/commplan-safeio-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *in_dir(const char *name)
{
    static char path[4][256];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", dir, name);
    return p;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

static const char *get(const char *path)
{
    static char text[4096];
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    assert_int_equal(fclose(f), 0);
    text[n] = '\0';
    return text;
}

/* Entries in dir, . and .. aside. */
static int entries(void)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    assert_int_equal(closedir(d), 0);
    return n;
}

static double now_s(void)
{
    struct timespec t;
    assert_int_equal(clock_gettime(CLOCK_MONOTONIC, &t), 0);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void one_line_with(const char *err, const char *want)
{
    assert_null(strchr(err, '\n'));
    if (!strstr(err, want)) fail_msg("expected '%s' in: %s", want, err);
}

/* ---- reads ---- */

static void test_read_regular_and_missing(void **state)
{
    (void)state;
    char buf[MAX + 1], err[512];
    size_t n = 99;
    put(in_dir("a"), "hello\n");
    assert_int_equal(cp_read_file(in_dir("a"), buf, MAX, &n, err, sizeof err), CP_READ_OK);
    assert_int_equal(n, 6);
    assert_string_equal(buf, "hello\n");
    assert_int_equal(cp_read_file(in_dir("nothing"), buf, MAX, &n, err, sizeof err), CP_READ_MISSING);
    one_line_with(err, "nothing does not exist");
    assert_int_equal(n, 0);
}

static void test_read_fifo_does_not_block(void **state)
{
    (void)state;
    char buf[MAX + 1], err[512];
    size_t n;
    assert_int_equal(mkfifo(in_dir("fifo"), 0600), 0);
    double t0 = now_s();
    /* A plain open(O_RDONLY) of a FIFO waits for a writer forever. */
    assert_int_equal(cp_read_file(in_dir("fifo"), buf, MAX, &n, err, sizeof err), CP_READ_ERROR);
    assert_true(now_s() - t0 < 1.0);
    one_line_with(err, "/fifo is a FIFO, not a regular file");
    /* Through a symlink too: what is read is what the link points at. */
    assert_int_equal(symlink("fifo", in_dir("to-fifo")), 0);
    assert_int_equal(cp_read_file(in_dir("to-fifo"), buf, MAX, &n, err, sizeof err), CP_READ_ERROR);
    one_line_with(err, "to-fifo is a FIFO, not a regular file");
}

static void test_read_devices_directories_sockets(void **state)
{
    (void)state;
    char buf[MAX + 1], err[512];
    size_t n;
    /* /dev/zero never ends: refused before a byte is read. */
    assert_int_equal(cp_read_file("/dev/zero", buf, MAX, &n, err, sizeof err), CP_READ_ERROR);
    one_line_with(err, "/dev/zero is a character device, not a regular file");
    assert_int_equal(cp_read_file(dir, buf, MAX, &n, err, sizeof err), CP_READ_ERROR);
    one_line_with(err, " is a directory, not a regular file");
    /* A socket cannot even be opened (ENXIO); it is still named as one. */
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(s >= 0);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", in_dir("sock"));
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(cp_read_file(in_dir("sock"), buf, MAX, &n, err, sizeof err), CP_READ_ERROR);
    one_line_with(err, "/sock is a socket, not a regular file");
    assert_int_equal(close(s), 0);
}

static void test_read_size_bounded(void **state)
{
    (void)state;
    char buf[MAX + 1], err[512], text[MAX + 2];
    size_t n;
    memset(text, 'x', MAX);
    text[MAX] = '\0';
    put(in_dir("max"), text);
    assert_int_equal(cp_read_file(in_dir("max"), buf, MAX, &n, err, sizeof err), CP_READ_OK);
    assert_int_equal(n, MAX);
    text[MAX] = 'x';
    text[MAX + 1] = '\0';
    put(in_dir("big"), text);
    assert_int_equal(cp_read_file(in_dir("big"), buf, MAX, &n, err, sizeof err), CP_READ_TOO_BIG);
    one_line_with(err, "big is 65 bytes, over the limit of 64");
    assert_int_equal(n, 0);
    /* /proc files say 0 bytes: the read itself is bounded. */
    char big[16];
    int rc = cp_read_file("/proc/self/status", big, sizeof big - 1, &n, err, sizeof err);
    if (rc != CP_READ_MISSING) {
        assert_int_equal(rc, CP_READ_TOO_BIG);
        one_line_with(err, "over the limit of 15 bytes");
    }
}

/* ---- writes ---- */

static void test_write_replaces_a_planted_symlink(void **state)
{
    (void)state;
    char err[512];
    put(in_dir("victim"), "precious\n");
    assert_int_equal(symlink("victim", in_dir("out.json")), 0);
    assert_int_equal(cp_write_file(in_dir("out.json"), "{}\n", 3, 0666, err, sizeof err), 0);
    struct stat st;
    assert_int_equal(lstat(in_dir("out.json"), &st), 0);
    assert_true(S_ISREG(st.st_mode)); /* the link itself was replaced */
    assert_string_equal(get(in_dir("out.json")), "{}\n");
    assert_string_equal(get(in_dir("victim")), "precious\n");
    assert_int_equal(entries(), 2); /* no temporary left */
    /* A dangling symlink to a file outside the directory: never created. */
    assert_int_equal(symlink("/tmp/commplan-safeio-never-created", in_dir("dangling")), 0);
    assert_int_equal(cp_write_file(in_dir("dangling"), "x", 1, 0666, err, sizeof err), 0);
    assert_int_equal(access("/tmp/commplan-safeio-never-created", F_OK), -1);
    assert_string_equal(get(in_dir("dangling")), "x");
}

static void test_write_temporary_names_exclusive(void **state)
{
    (void)state;
    char err[512], name[128];
    put(in_dir("victim"), "precious\n");
    /* The first temporary name is a symlink to the victim, the second a
     * file someone else owns: both are skipped, neither is touched. */
    snprintf(name, sizeof name, ".out.%ld.0.tmp", (long)getpid());
    assert_int_equal(symlink("victim", in_dir(name)), 0);
    snprintf(name, sizeof name, ".out.%ld.1.tmp", (long)getpid());
    put(in_dir(name), "theirs\n");
    cp_out o = { 0 };
    assert_int_equal(cp_out_open_path(&o, in_dir("out"), 0666, err, sizeof err), 0);
    assert_non_null(strstr(o.tmp, ".out."));
    assert_non_null(strstr(o.tmp, ".2.tmp"));
    assert_true(fprintf(o.f, "mine\n") > 0);
    assert_int_equal(cp_out_commit(&o, err, sizeof err), 0);
    assert_null(o.f);
    assert_string_equal(get(in_dir("out")), "mine\n");
    assert_string_equal(get(in_dir("victim")), "precious\n");
    assert_string_equal(get(in_dir(name)), "theirs\n");
    assert_int_equal(entries(), 4);

    /* Every name taken: one line, the target untouched. */
    for (int k = 2; k < 100; k++) {
        snprintf(name, sizeof name, ".out.%ld.%d.tmp", (long)getpid(), k);
        put(in_dir(name), "x");
    }
    assert_int_equal(cp_write_file(in_dir("out"), "new\n", 4, 0666, err, sizeof err), -1);
    one_line_with(err, "100 names (.out.");
    assert_string_equal(get(in_dir("out")), "mine\n");
}

static void test_write_names_stay_in_their_directory(void **state)
{
    (void)state;
    char err[512];
    cp_out o = { 0 };
    assert_int_equal(cp_out_open(&o, dir, "../escape", 0666, err, sizeof err), -1);
    one_line_with(err, "file name '../escape' holds '/'");
    assert_int_equal(cp_out_open(&o, dir, "..", 0666, err, sizeof err), -1);
    one_line_with(err, "names a directory, not a file");
    assert_int_equal(cp_out_open(&o, dir, ".", 0666, err, sizeof err), -1);
    assert_int_equal(cp_out_open(&o, dir, "", 0666, err, sizeof err), -1);
    one_line_with(err, "an empty file name");
    assert_int_equal(cp_out_open_path(&o, in_dir(""), 0666, err, sizeof err), -1);
    one_line_with(err, "names a directory, not a file");
    assert_int_equal(cp_out_open_path(&o, in_dir(".."), 0666, err, sizeof err), -1);
    assert_int_equal(cp_out_open_path(&o, "", 0666, err, sizeof err), -1);
    assert_null(o.f);
    assert_int_equal(entries(), 0);
    /* A name with a newline prints as one line. */
    assert_int_equal(cp_out_open(&o, dir, "a\nb/c", 0666, err, sizeof err), -1);
    one_line_with(err, "file name 'a?b/c' holds '/'");
}

static void test_write_failures_reported(void **state)
{
    (void)state;
    char err[512];
    /* A directory that does not exist. */
    assert_int_equal(cp_write_file(in_dir("no/such/file"), "x", 1, 0666, err, sizeof err), -1);
    one_line_with(err, "open of ");
    one_line_with(err, "No such file or directory");
    /* A directory under the target's name: the rename fails, no temporary stays. */
    assert_int_equal(mkdir(in_dir("sub"), 0700), 0);
    assert_int_equal(cp_write_file(in_dir("sub"), "x", 1, 0666, err, sizeof err), -1);
    one_line_with(err, "rename of ");
    assert_int_equal(entries(), 1);
    /* Aborted: nothing written, nothing left. */
    cp_out o = { 0 };
    assert_int_equal(cp_out_open_path(&o, in_dir("aborted"), 0666, err, sizeof err), 0);
    assert_true(fputs("half", o.f) >= 0);
    cp_out_abort(&o);
    assert_int_equal(access(in_dir("aborted"), F_OK), -1);
    assert_int_equal(entries(), 1);
    /* A commit with nothing open is an error, not a crash. */
    assert_int_equal(cp_out_commit(&o, err, sizeof err), -1);
}

/* A write that fails on the temporary file itself: a file-size limit in a
 * child (EFBIG, SIGXFSZ ignored), with more than one stdio buffer to write. */
static void test_write_error_on_the_temporary(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char err[512];
        struct rlimit r = { 1000, 1000 };
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &r) != 0) _exit(10);
        cp_out o = { 0 };
        if (cp_out_open_path(&o, in_dir("limited"), 0666, err, sizeof err) != 0) _exit(11);
        for (int i = 0; i < 20000; i++) fputc('x', o.f); /* errors here are seen at commit */
        if (cp_out_commit(&o, err, sizeof err) != -1) _exit(12);
        if (!strstr(err, "write of ") || !strstr(err, ".limited.") || strchr(err, '\n')) _exit(13);
        if (access(in_dir("limited"), F_OK) == 0) _exit(14);
        /* The same for one whole buffer through cp_write_file. */
        static char big[20000];
        if (cp_write_file(in_dir("limited2"), big, sizeof big, 0666, err, sizeof err) != -1) _exit(15);
        if (!strstr(err, "File too large")) _exit(16);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(entries(), 0); /* no temporary left behind */
}

/* stdout at exit: /dev/full, and a closed descriptor. */
static void test_close_stream(void **state)
{
    (void)state;
    char err[512];
    FILE *f = fopen("/dev/full", "w");
    assert_non_null(f);
    assert_true(fputs("# plan fsdp4\n", f) >= 0); /* buffered: the error comes at the flush */
    assert_int_equal(cp_close_stream(f, err, sizeof err), -1);
    one_line_with(err, "No space left on device");
    /* A stream whose descriptor is gone, nothing written: not an error (prog >&-). */
    int fd = open("/dev/null", O_WRONLY);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    assert_non_null(f);
    assert_int_equal(close(fd), 0);
    assert_int_equal(cp_close_stream(f, err, sizeof err), 0);
    /* ... with something written, it is. */
    fd = open("/dev/null", O_WRONLY);
    f = fdopen(fd, "w");
    assert_non_null(f);
    assert_int_equal(close(fd), 0);
    assert_true(fputs("x", f) >= 0);
    assert_int_equal(cp_close_stream(f, err, sizeof err), -1);
    one_line_with(err, "Bad file descriptor");
    /* A regular file: fine. */
    f = fopen(in_dir("ok"), "w");
    assert_non_null(f);
    assert_true(fputs("x", f) >= 0);
    assert_int_equal(cp_close_stream(f, err, sizeof err), 0);
}

static void test_check_path(void **state)
{
    (void)state;
    char err[512];
    assert_int_equal(cp_out_check_path(in_dir("trace.json"), err, sizeof err), 0);
    assert_int_equal(cp_out_check_path("trace.json", err, sizeof err), 0);
    assert_int_equal(cp_out_check_path(in_dir("missing/trace.json"), err, sizeof err), -1);
    one_line_with(err, "No such file or directory");
    put(in_dir("file"), "x");
    assert_int_equal(cp_out_check_path(in_dir("file/trace.json"), err, sizeof err), -1);
    one_line_with(err, "/file is a regular file, not a directory");
    assert_int_equal(cp_out_check_path(dir, err, sizeof err), -1);
    one_line_with(err, "is a directory, not a file");
    assert_int_equal(cp_out_check_path(in_dir(""), err, sizeof err), -1);
    assert_int_equal(cp_out_check_path("", err, sizeof err), -1);
    assert_int_equal(cp_out_check_path("/dev/null/x", err, sizeof err), -1);
    one_line_with(err, "/dev/null is a character device, not a directory");
}

static void test_one_line(void **state)
{
    (void)state;
    char s[] = "a\nb\rc\x1b[31md\x7f\xff";
    cp_one_line(s);
    assert_string_equal(s, "a?b?c?[31md?\xff");
}

int main(void)
{
    /* A read that blocks (the bug these tests are for) must fail, not hang. */
    alarm(60);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_read_regular_and_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_fifo_does_not_block, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_devices_directories_sockets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_size_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_replaces_a_planted_symlink, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_temporary_names_exclusive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_names_stay_in_their_directory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_failures_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_error_on_the_temporary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_path, setup, teardown),
        cmocka_unit_test(test_one_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
