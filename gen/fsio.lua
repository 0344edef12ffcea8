-- The files a user names, read by one rule: a regular file only (a FIFO
-- would block in open() and /dev/zero never end), of bounded size, else one
-- line naming the path and what it is instead. Lua's io.open cannot open
-- without blocking or fstat what it opened, so the kind is taken with
-- stat(1) first; the bounded read still stops a file that grows after it.
-- And stdout: a failed write or flush (a full disk, a closed pipe) is an
-- error, never a silent exit 0.
local fsio = {}

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- stat's %F names, as the messages say them.
local KIND_TEXT = {
  ["regular file"] = false, ["regular empty file"] = false,
  ["fifo"] = "a FIFO (named pipe)", ["directory"] = "a directory",
  ["character special file"] = "a character device", ["block special file"] = "a block device",
  ["socket"] = "a socket",
}

-- The file's kind and size, following symlinks: "regular file", n | nil, why.
function fsio.stat(path)
  if path == "" or path:find("%z") then return nil, "is not a path" end
  local ph = io.popen("LC_ALL=C stat -L -c '%F|%s' -- " .. sh_quote(path) .. " 2>/dev/null")
  local out = ph and ph:read(200) or ""
  if ph then ph:close() end
  local kind, size = out:match("^([^|\n]+)|(%d+)")
  if not kind then return nil, "does not exist (or cannot be read)" end
  return kind, tonumber(size)
end

-- What a path names without following a symlink ("symbolic link",
-- "regular file", ...), and its device:inode following it (nil when
-- absent): `--csv` must not write over a device, a directory, a link or
-- the plan file itself.
function fsio.identity(path)
  if path == "" or path:find("%z") then return nil end
  local ph = io.popen("LC_ALL=C stat -c '%F' -- " .. sh_quote(path) .. " 2>/dev/null; LC_ALL=C stat -L -c '%d:%i' -- "
    .. sh_quote(path) .. " 2>/dev/null")
  local out = ph and ph:read(400) or ""
  if ph then ph:close() end
  local kind, inode = out:match("^([^\n]+)\n([^\n]*)")
  return kind, inode ~= "" and inode or nil
end

-- The contents of a regular file of at most max_bytes, or nil and why
-- ("is a FIFO (named pipe)", "has more than 16 MiB", ...).
function fsio.read_regular(path, max_bytes)
  local kind, size = fsio.stat(path)
  if not kind then return nil, size end
  local what = KIND_TEXT[kind]
  if what ~= false then return nil, "is " .. (what or ("a " .. kind)) .. ", not a regular file" end
  if size > max_bytes then return nil, string.format("has %d bytes, more than the %s allowed", size, fsio.human(max_bytes)) end
  local fh, err = io.open(path, "rb")
  if not fh then return nil, "cannot be opened (" .. tostring(err):gsub("^[^:]*: ", "") .. ")" end
  local data = fh:read(max_bytes + 1) or ""
  fh:close()
  if #data > max_bytes then return nil, string.format("has more than the %s allowed", fsio.human(max_bytes)) end
  return data
end

function fsio.human(bytes)
  if bytes >= 1 << 20 and bytes % (1 << 20) == 0 then return (bytes >> 20) .. " MiB" end
  if bytes >= 1 << 10 and bytes % (1 << 10) == 0 then return (bytes >> 10) .. " KiB" end
  return bytes .. " bytes"
end

-- A path as a message may show it: control characters as '?'.
function fsio.shown(path) return (path:gsub("[%c]", "?")) end

-- The one writer of every file the Lua side writes (the generator's
-- published files, the audit verbs' outputs): text goes to an exclusive
-- temporary beside path (mktemp's O_EXCL: never a file or link already
-- there, whatever its name), is written and closed with every step
-- checked, then renamed over path (a rename replaces a name, it never
-- writes through it). A path that already names anything but a regular
-- file -- a symbolic link, a directory, a device -- is refused before a
-- byte is written, as is opts.not_over (the plan an output is made from)
-- under another name. true, or nil and why (the caller's one line).
local function umask_mode()
  return "$(printf %o $((0666 & ~$(umask))))" -- (the mode a plain open would give, for sh)
end

function fsio.check_target(path, opts)
  if path == "" or path:find("%z") then return nil, "is not a path" end
  local kind, inode = fsio.identity(path)
  if kind and kind ~= "regular file" and kind ~= "regular empty file" then
    return nil, "is a " .. kind .. ", not a regular file (commplan never writes through a link, a device or a "
      .. "directory)"
  end
  if kind and opts and opts.not_over then
    local _, other = fsio.identity(opts.not_over)
    if other and other == inode then return nil, "is the plan file itself" end
  end
  return true
end

function fsio.write_file(path, text, opts)
  local ok, why = fsio.check_target(path, opts)
  if not ok then return nil, why end
  local dir, base = path:match("^(.*)/([^/]*)$")
  if not dir then dir, base = ".", path end
  if dir == "" then dir = "/" end
  if base == "" or base == "." or base == ".." then return nil, "names a directory, not a file" end
  local ph = io.popen("t=$(mktemp -- " .. sh_quote(dir .. "/." .. base:sub(1, 64) .. ".XXXXXXXX") .. " 2>/dev/null) && chmod "
    .. umask_mode() .. " \"$t\" && printf '%s' \"$t\"")
  local tmp = ph and ph:read("a") or ""
  if ph then ph:close() end
  if tmp == "" then return nil, "cannot be written (no such directory, or it is read-only)" end
  local fh, err = io.open(tmp, "wb")
  local wrote = fh and fh:write(text)
  local closed = fh and fh:close()
  if not (wrote and closed) then
    os.remove(tmp)
    return nil, "cannot be written (" .. (err and tostring(err):gsub("^[^:]*: ", "") or "disk full?") .. ")"
  end
  local renamed, rerr = os.rename(tmp, path)
  if not renamed then
    os.remove(tmp)
    return nil, "cannot be written (" .. tostring(rerr):gsub("^[^:]*: ", "") .. ")"
  end
  return true
end

-- Writes text to stdout; nil and why when the write fails (a buffered
-- write whose error the final flush would no longer see: the failed bytes
-- are gone from the buffer by then).
function fsio.write_stdout(text)
  local ok, err = io.stdout:write(text)
  if not ok then return nil, "cannot write standard output (" .. tostring(err) .. ")" end
  return true
end

-- Flushes stdout; nil and why when the bytes did not all get out.
function fsio.flush_stdout()
  local ok, err = io.stdout:flush()
  if not ok then return nil, "cannot write standard output (" .. tostring(err) .. ")" end
  return true
end

-- A file a plan names beside itself (pipeline.csv): rel, relative to dir
-- (the plan file's directory), read as read_regular reads, only when it is
-- below dir: components of letters, digits and . _ - (no "." or "..", no
-- absolute path), each one a directory, the last a regular file, none a
-- symlink (stat without -L on every component: a link planted below dir
-- cannot lead the read to another file). Returns the contents, or nil and
-- why; why shows only rel's components, which the rule above made safe to
-- print. (A component swapped for a link between the check and the open
-- is not caught: Lua cannot open with O_NOFOLLOW.)
-- A path below a plan's directory as read_below takes it: its components
-- (plain names only), or nil and why.
function fsio.below_parts(rel)
  local rule = "give a path below the plan file's directory: names of letters, digits and . _ - joined by /"
  if rel:sub(1, 1) == "/" then return nil, "is an absolute path; " .. rule end
  if #rel > 4096 then return nil, "is longer than 4096 bytes; " .. rule end
  local parts = {}
  for part in (rel .. "/"):gmatch("([^/]*)/") do
    if part == "" or part == "." or part == ".." or not part:match("^[%w._%-]+$") or #part > 255 then
      return nil, "has a component that is not a plain name (empty, . or .., or another character); " .. rule
    end
    parts[#parts + 1] = part
  end
  if #parts > 32 then return nil, "has more than 32 components; " .. rule end
  return parts
end

function fsio.read_below(dir, rel, max_bytes)
  local parts, why = fsio.below_parts(rel)
  if not parts then return nil, why end
  local paths = {}
  for i = 1, #parts do paths[i] = sh_quote(dir .. "/" .. table.concat(parts, "/", 1, i)) end
  local ph = io.popen("for p in " .. table.concat(paths, " ") .. "; do LC_ALL=C stat -c '%h|%F' -- \"$p\" 2>/dev/null "
    .. "|| echo '0|missing'; done")
  local out = ph and ph:read(64 * #parts + 64) or ""
  if ph then ph:close() end
  local i = 0
  for links, kind in out:gmatch("(%d+)|([^\n]*)\n") do
    i = i + 1
    -- a second name of a file elsewhere (a hard link) is as foreign as a symlink
    if i == #parts and kind:match("^regular") and tonumber(links) > 1 then
      return nil, "has other hard links; a plan reads only its own files: copy the file there"
    end
    local shown = table.concat(parts, "/", 1, i)
    local last = i == #parts
    if kind == "missing" then return nil, (last and "does not exist" or shown .. " does not exist") end
    if kind == "symbolic link" then
      return nil, string.format("is reached through a symlink (%s); a plan reads only files below its directory, "
        .. "not through links: copy the file there", shown)
    end
    if not last and kind ~= "directory" then return nil, string.format("%s is not a directory", shown) end
  end
  if i ~= #parts then return nil, "cannot be checked (stat failed)" end
  return fsio.read_regular(dir .. "/" .. rel, max_bytes)
end

return fsio
