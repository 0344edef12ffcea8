-- util.c_string and util.c_comment against a C compiler: hostile strings
-- (every byte, trigraphs, quotes, backslashes, comment closers, octal
-- escapes followed by digits) are written into a tiny C file as string
-- literals and comments; it must compile under plain `cc -std=c11` (with
-- and without -Werror) and print back exactly the original bytes, and no
-- comment text may declare anything.
local H = require("helpers")
local util = require("gen.util")
local T = {}

local function hostile()
  local all = {}
  for b = 0, 255 do all[#all + 1] = string.char(b) end
  return {
    "", "plain", 'quote " inside', "back\\slash", "trailing\\", "\\", '\\"', "??/", "??=define X 1",
    "??'??(??)??!??<??>??-", "???/", "a??/\nb", "*/", "/*", "*/ int injected = 1; /*", "\0011\0022\0033",
    "\0", "nul\0in the middle", "\n\r\t\v\f\a\b", "\127\128\255", "caf\195\169", "%s%d%n", "{{name}}",
    "line\\\nsplice", "end with ??", "?", "??", "\\\\\\", table.concat(all), string.rep("x?", 300),
  }
end

local function cc_available()
  return os.execute("command -v cc >/dev/null 2>&1") == true
end

local function run(cmd)
  local fh = assert(io.popen(cmd .. " 2>&1", "r"))
  local out = fh:read("a")
  local ok = fh:close()
  return ok, out
end

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p '" .. d .. "'"))
  return d
end

function T.c_string_round_trips_through_cc()
  if not cc_available() then io.stderr:write("SKIP test_cstring: no cc\n"); return end
  local strs = hostile()
  local dir = tmpdir()
  local lines = { "#include <stdio.h>", "static const struct { const char *s; unsigned long n; } strs[] = {" }
  for i, s in ipairs(strs) do
    local lit = util.c_string(s)
    -- No raw byte outside printable ASCII, and no trigraph introducer.
    H.eq(lit:find("[^ -~]"), nil, "literal " .. i .. " is printable ASCII")
    H.eq(lit:find("??", 1, true), nil, "literal " .. i .. " holds no ??")
    lines[#lines + 1] = string.format("    { %s, sizeof(%s) - 1 },", lit, lit)
  end
  lines[#lines + 1] = "};"
  lines[#lines + 1] = [[
int main(void) {
    for (unsigned i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        printf("%lu:", strs[i].n);
        for (unsigned long j = 0; j < strs[i].n; j++) printf("%02x", (unsigned char)strs[i].s[j]);
        printf("\n");
    }
    return 0;
}]]
  local f = assert(io.open(dir .. "/s.c", "wb"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  for _, flags in ipairs({ "-std=c11", "-std=c11 -Wall -Wextra -pedantic -Werror" }) do
    local ok, out = run(string.format("cc %s -o '%s/s' '%s/s.c'", flags, dir, dir))
    if not ok then error("cc " .. flags .. " failed: " .. out) end
    local _, got = run("'" .. dir .. "/s'")
    local want = {}
    for _, s in ipairs(strs) do
      want[#want + 1] = #s .. ":" .. s:gsub(".", function(c) return string.format("%02x", c:byte()) end)
    end
    H.eq(got, table.concat(want, "\n") .. "\n", "bytes back from the compiled literals (" .. flags .. ")")
  end
  os.execute("rm -rf '" .. dir .. "'")
end

function T.c_comment_cannot_escape_its_comment()
  if not cc_available() then io.stderr:write("SKIP test_cstring: no cc\n"); return end
  local strs = hostile()
  local dir = tmpdir()
  -- Each comment sits between two declarations; text that closed the
  -- comment or spliced the next line into it would redefine, break or hide
  -- a guard.
  local lines = { "static const int guard_0 = 0;" }
  for i, s in ipairs(strs) do
    local c = util.c_comment(s)
    H.eq(c:find("*/", 1, true), nil, "no */ in comment " .. i)
    H.eq(c:find("[%c\128-\255]"), nil, "no control bytes in comment " .. i)
    H.eq(c:find("??", 1, true), nil, "no ?? in comment " .. i)
    H.eq(c:find("\\%s*$") ~= nil, false, "no trailing backslash in comment " .. i)
    lines[#lines + 1] = "/* " .. c .. " */"
    lines[#lines + 1] = "/* " .. c
    lines[#lines + 1] = " " .. c .. " */"
    lines[#lines + 1] = "/*" .. c .. "*/" .. " static const int guard_" .. i .. " = " .. i .. ";"
  end
  lines[#lines + 1] = "int main(void) { return 0"
  for i = 0, #strs do lines[#lines] = lines[#lines] .. " + guard_" .. i end
  lines[#lines] = lines[#lines] .. " - " .. (#strs * (#strs + 1) // 2) .. "; }"
  local f = assert(io.open(dir .. "/c.c", "wb"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  for _, flags in ipairs({ "-std=c11", "-std=c11 -Wall -Wextra -pedantic -Werror" }) do
    local ok, out = run(string.format("cc %s -o '%s/c' '%s/c.c'", flags, dir, dir))
    if not ok then error("cc " .. flags .. " failed: " .. out) end
    H.eq(os.execute("'" .. dir .. "/c'"), true, "every guard declared once (" .. flags .. ")")
  end
  os.execute("rm -rf '" .. dir .. "'")
end

function T.c_string_examples()
  H.eq(util.c_string('a"b\\c'), '"a\\"b\\\\c"')
  H.eq(util.c_string("??/"), '"\\?\\?/"')
  H.eq(util.c_string("\0011"), '"\\0011"')
  H.eq(util.c_string("\n\255"), '"\\012\\377"')
  H.eq(util.c_comment("a*/b/*c"), "a* /b/ *c")
  H.eq(util.c_comment("x??/"), "x? ?/")
  H.eq(util.c_comment("end\\"), "end\\.")
  H.eq(util.c_comment("*//*"), "* // *")
end

return T
