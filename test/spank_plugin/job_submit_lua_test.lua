-- job_submit.lua's layout reader against the C++ parser's table of cases, with Lua 5.1 (the version
-- Slurm's job_submit_lua.so links). Loads the REAL script with a stub `slurm` table and takes the
-- function it hands back. For every valid case the reader, given the normalised spelling (what the
-- plugin sends), yields the same dimensions and ranks; given the raw input it yields those or nothing,
-- never others; every invalid case is rejected.
-- Usage: lua5.1 job_submit_lua_test.lua JOB_SUBMIT_LUA LAYOUT_CASES
local script, table_path = arg[1], arg[2]
assert(script and table_path, "usage: lua5.1 job_submit_lua_test.lua JOB_SUBMIT_LUA LAYOUT_CASES")

slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end, log_user = function() end }
local status, exports = dofile(script)
assert(status == slurm.SUCCESS, "job_submit.lua did not return slurm.SUCCESS on load")
assert(type(exports) == "table" and type(exports.parse_layout) == "function",
  "job_submit.lua does not hand back { parse_layout = ... } as its second value")
local parse = exports.parse_layout

local failures, valid, invalid = 0, 0, 0
local function fail(where, msg)
  failures = failures + 1
  io.stderr:write(string.format("FAIL: %s: %s\n", where, msg))
end

local function same(got, want)
  for _, k in ipairs({ "tp", "cp", "ep", "dp", "pp", "ranks" }) do
    if got[k] ~= want[k] then return false end
  end
  return true
end

local function show(l)
  if not l then return "nil" end
  return string.format("tp=%s cp=%s ep=%s dp=%s pp=%s ranks=%s", tostring(l.tp), tostring(l.cp),
    tostring(l.ep), tostring(l.dp), tostring(l.pp), tostring(l.ranks))
end

local n = 0
for line in io.lines(table_path) do
  n = n + 1
  if line ~= "" and not line:match("^#") then
    local where = string.format("%s:%d", table_path, n)
    local input, rest = line:match('^"([^"]*)"%s+(.*)$')
    if not input then error(where .. ": malformed case: " .. line) end
    if rest:match("^error ") then
      invalid = invalid + 1
      local got = parse(input)
      if got then fail(where, string.format("'%s' is invalid but job_submit.lua read %s", input, show(got))) end
    else
      valid = valid + 1
      local want = {}
      local normalised, dims = rest:match("^(%S+)%s+(.*)$")
      for k, v in dims:gmatch("(%a+)=(%d+)") do want[k] = tonumber(v) end
      local got = parse(normalised)
      if not got or not same(got, want) then
        fail(where, string.format("normalised '%s': want %s, got %s", normalised, show(want), show(got)))
      end
      got = parse(input)
      if got and not same(got, want) then
        fail(where, string.format("raw '%s': want %s or a rejection, got %s", input, show(want), show(got)))
      end
    end
  end
end
if valid == 0 or invalid == 0 then error(table_path .. ": no valid or no invalid cases") end
if failures > 0 then os.exit(1) end
print(string.format("ok: job_submit.lua agrees with %d valid and %d invalid layout cases", valid, invalid))
