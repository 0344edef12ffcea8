"""Every file the package reads or writes goes through here.

Reads (read_file, read_json): regular files only. The path is stat()ed (a device is never
opened), then opened with O_RDONLY | O_NONBLOCK (a FIFO cannot block the open) and fstat()ed on
the descriptor (what was opened is what is checked); anything but a regular file -- a FIFO, a
directory, a character or block device, a socket -- is one PlanError naming the path and what it
is. The size is bounded before and while reading. Symlinks are followed (Hugging Face caches keep
config.json as a symlink into blobs/).

Writes (write_file): a temporary file created exclusively in the target's own directory
(O_CREAT | O_EXCL | O_NOFOLLOW, mode 0o644 less the umask), every write (short writes completed),
fsync and close checked, then os.replace() over the target: a symlink at the target's name is
replaced, never written through; nothing is written outside the directory the path names; a
failure leaves the old file as it was and no temporary behind. stdout (write_stdout): every write
and the final close checked. Failures are OutputError (a PlanError) naming the path and the reason.
"""

import errno
import json
import os
import secrets
import select
import stat

from .errors import OutputError, PlanError

__all__ = ["show_path", "fspath", "file_kind", "read_file", "read_json", "write_file", "write_stdout",
           "CONFIG_JSON_MAX", "PLAN_JSON_MAX", "OPTIONS_JSON_MAX", "UNITS_JSON_MAX"]

CONFIG_JSON_MAX = 16 << 20    # a Hugging Face config.json is kilobytes
OPTIONS_JSON_MAX = 1 << 20    # the CLI's --options file
UNITS_JSON_MAX = 64 << 20     # the CLI's named-parameter lists (32,768 parameters at most)
PLAN_JSON_MAX = 256 << 20     # a generated plan.json (llama405b's is 1.3 MB)

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | \
    getattr(os, "O_NOCTTY", 0)
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def show_path(p):
    """A path as one printable line: as given when it is plain text, else Python's repr of it."""
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if isinstance(p, str) and p and all(" " <= c <= "~" or (c > "\x9f" and c.isprintable()) for c in p):
        return p
    return repr(p)


def fspath(path, what):
    """path as a str, or a PlanError naming what it was meant to be."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise PlanError("%s: expected a path (str or os.PathLike), got %s %r"
                        % (what, type(path).__name__, path)) from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p:
        raise PlanError("%s: the path is empty; give a file path" % what)
    if "\0" in p:
        raise PlanError("%s: the path %s holds a NUL byte, which no file name can hold; fix the path"
                        % (what, show_path(p)))
    return p


def file_kind(mode):
    """What a stat() mode is, in words ('a FIFO', 'a directory', ...)."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return words
    return "not a regular file (mode %o)" % mode


def _reason(e):
    return e.strerror or str(e)


def _not_regular(p, st, what):
    return PlanError("%s is %s, not a regular file; give the path of %s" % (show_path(p), file_kind(st.st_mode), what))


def read_file(path, what, limit):
    """The bytes of the regular file at path (at most limit of them), or one PlanError line naming
    the path and what it is instead. what: what the file should be ("config.json")."""
    p = fspath(path, what)
    try:
        st = os.stat(p)  # stat first: a device is refused without being opened at all
    except OSError as e:
        raise PlanError("%s: cannot read %s: %s; give the path of %s" % (show_path(p), what, _reason(e), what)) \
            from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(p, st, what)
    try:
        fd = os.open(p, _READ_FLAGS)
    except OSError as e:
        raise PlanError("%s: cannot open %s: %s" % (show_path(p), what, _reason(e))) from None
    try:
        st = os.fstat(fd)  # what was opened, not what the name pointed to a moment ago
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(p, st, what)
        if st.st_size > limit:
            raise PlanError("%s has %d bytes, above the limit of %d bytes for %s; is it the right file?"
                            % (show_path(p), st.st_size, limit, what))
        chunks, got = [], 0
        while True:
            try:
                b = os.read(fd, min(1 << 20, limit + 1 - got))
            except OSError as e:
                raise PlanError("%s: cannot read %s: %s" % (show_path(p), what, _reason(e))) from None
            if not b:
                break
            chunks.append(b)
            got += len(b)
            if got > limit:
                raise PlanError("%s grew past the limit of %d bytes for %s while being read; is something "
                                "writing it?" % (show_path(p), limit, what))
        return b"".join(chunks)
    finally:
        os.close(fd)


class _JsonRefusal(Exception):
    pass


def _no_constant(name):
    raise _JsonRefusal("%s is not JSON (JSON has no NaN or Infinity); write a number" % name)


def _object(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise _JsonRefusal("key %s appears twice in one object (JSON readers disagree on which wins); keep one"
                               % json.dumps(k))
        obj[k] = v
    return obj


def parse_json(data, src):
    """The JSON document in data (bytes, UTF-8, an optional BOM), or one PlanError line naming src:
    invalid UTF-8 or JSON, NaN / Infinity, a key twice in one object, integers past Python's
    digit limit and nesting past the recursion limit are all refused."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanError("%s: not UTF-8 text (byte 0x%02x at offset %d); save the file as UTF-8"
                        % (src, data[e.start], e.start)) from None
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_object)
    except _JsonRefusal as e:
        raise PlanError("%s: %s" % (src, e)) from None
    except json.JSONDecodeError as e:
        raise PlanError("%s: not valid JSON: %s at line %d column %d; fix the file"
                        % (src, e.msg, e.lineno, e.colno)) from None
    except RecursionError:
        raise PlanError("%s: not readable JSON: nested too deeply; no commplan input nests more than a few "
                        "levels" % src) from None
    except ValueError as e:  # e.g. an integer past sys.get_int_max_str_digits()
        raise PlanError("%s: not readable JSON: %s" % (src, str(e).split(";")[0])) from None


def read_json(path, what, limit):
    """(document, shown path): read_file then parse_json."""
    p = fspath(path, what)
    return parse_json(read_file(p, what, limit), show_path(p)), show_path(p)


# ---- writes --------------------------------------------------------------------------------

def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:  # a non-blocking stdout (a terminal or pipe set so by a parent)
            select.select([], [fd], [], 10.0)
            continue
        if not n or n < 0:
            raise OSError(errno.EIO, "write returned %r" % (n,))
        view = view[n:]


def write_file(path, data, what="file"):
    """Writes data (bytes) to path through a temporary file in path's directory and a rename;
    returns path (a str). See the module's note; failures are OutputError / PlanError, one line."""
    p = fspath(path, what)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PlanError("%s: the data to write must be bytes, got %s" % (what, type(data).__name__))
    d, base = os.path.split(p)
    if not base or base in (".", ".."):
        raise PlanError("%s: %s names a directory, not a file; give <dir>/<file>" % (what, show_path(p)))
    d = d or "."
    try:
        dst = os.stat(d)
    except OSError as e:
        raise PlanError("%s: cannot write %s: its directory %s: %s; create the directory first"
                        % (what, show_path(p), show_path(d), _reason(e))) from None
    if not stat.S_ISDIR(dst.st_mode):
        raise PlanError("%s: cannot write %s: %s is %s, not a directory" % (what, show_path(p), show_path(d),
                                                                        file_kind(dst.st_mode)))
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise PlanError("%s: cannot write %s: %s" % (what, show_path(p), _reason(e))) from None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        # a symlink is replaced (never followed); a directory, FIFO or device node is left alone
        raise PlanError("%s is %s; the %s would replace it: give the path of a regular file"
                        % (show_path(p), file_kind(st.st_mode), what))
    fd = tmp = None
    for _ in range(64):
        tmp = os.path.join(d, ".%s.%s.tmp" % (base[:100], secrets.token_hex(8)))
        try:
            fd = os.open(tmp, _TMP_FLAGS, 0o644)  # the umask applies
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise OutputError("%s: cannot write %s: creating a temporary file in %s: %s"
                              % (what, show_path(p), show_path(d), _reason(e))) from None
    else:
        raise OutputError("%s: cannot write %s: no free temporary name in %s" % (what, show_path(p), show_path(d)))
    done = False
    try:
        _write_all(fd, data)
        os.fsync(fd)
        f, fd = fd, None
        os.close(f)
        os.replace(tmp, p)
        done = True
        _sync_dir(d)
    except OSError as e:
        if done:
            raise OutputError("%s: %s was written but its directory could not be synced: %s"
                              % (what, show_path(p), _reason(e))) from None
        raise OutputError("%s: cannot write %s: %s; nothing was changed" % (what, show_path(p), _reason(e))) \
            from None
    finally:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        if not done:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


def _sync_dir(d):
    """The rename made durable; file systems that cannot fsync a directory are let be."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        dfd = os.open(d, flags)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF, errno.EROFS, getattr(errno, "ENOTSUP", -1),
                           getattr(errno, "EOPNOTSUPP", -1)):
            raise
    finally:
        os.close(dfd)


def write_stdout(data, close=False):
    """Writes data (bytes or ASCII/UTF-8 str) to file descriptor 1, every write checked (a full
    disk, /dev/full, a closed pipe: OutputError); close=True closes it and checks that too (the
    CLI's last write, as a C program's fclose(stdout))."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        _write_all(1, data)
        if close:
            os.close(1)
    except OSError as e:
        raise OutputError("cannot write to stdout: %s" % _reason(e)) from None
