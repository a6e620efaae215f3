--[[
job_submit.lua — SlurmForge's server-side admission check (docs/ADMISSION.md).

The SPANK plugin checks a training job in sbatch and passes its choices on with
spank_job_control_setenv (FORGE_TEAM, FORGE_TIER, FORGE_LAYOUT, ...). sbatch cannot see the real
request and a user can run client tools with their own plugstack.conf, so this script, run by
slurmctld on the real request, is the lock:

  * a job asking for a tier's QOS must come with the plugin's choices;
  * the choices are re-derived from the policy file (never trusted as sent): team -> account,
    tier -> QOS and max wall time, layout -> GPUs (tp*cp*dp*pp), nodes, TP <= GPUs per node, switches;
  * the request must match them: GPU count, node count, QOS, account; unset QOS, account, nodes, time
    and switch limits are filled in from the policy;
  * then the policy's checker (`forge-quota admit`, run as SlurmUser; /usr/local/bin/forge-quota when the
    policy names none) decides what needs the approval store and the user's identity: team membership of
    the submitting uid, the pool (partition) of the tier, and an approval for a large request
    (--train-approval=ID), which it consumes.
  * An admitted training job is marked in its AdminComment, which only root and the controller write:
    "forge-tier=T", "forge-approval=ID" for the approval it took, "forge-elastic:nodes=A-B" for a node
    range. Hooks and this script read those words, never the Comment, which the job's owner writes.

A change to a training job (scontrol update, slurm_job_modify) by anyone but root, the controller's user
or the policy's admins runs the rules that read what it changes (nodes, tasks, GPUs, QOS, account,
partition, time limit) on the job as it would be, the pool and the approval through the same checker. A
refusal is the rule's Slurm error code (Slurm 22.05 drops job_modify's messages to the user) and the whole
sentence in slurmctld's log.

The policy path comes from the forge_spank.so line of the plugstack.conf next to this file
(policy=PATH). A policy that cannot be read refuses training jobs and jobs naming a QOS (fail closed),
unless that line says controller_fallback=trust-plugin. Messages go to the user with
slurm.log_user("%s", msg), never as a format.
--]]

local NO_VAL = 4294967294
local INFINITE = 4294967295
local POLICY_TTL = 30  -- seconds a parsed policy is reused before the file is read again

local function dir_of_this_file()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) == "@" then src = src:sub(2) end
  return src:match("^(.*)/[^/]*$") or "."
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

local function split(s, sep)
  local out = {}
  for item in string.gmatch(s or "", "[^" .. sep .. "]+") do
    item = trim(item)
    if item ~= "" then out[#out + 1] = item end
  end
  return out
end

-- Where the policy is, from plugstack.conf's forge_spank.so line: { path = its policy=PATH (the plugin's
-- default /etc/forge/quota.ini without one; nil without the line), fallback = its controller_fallback=...
-- ("trust-plugin", else nil) }. The fallback lives there, not in the
-- policy, because it says what to do when the policy cannot be read.
local function policy_source()
  local src = {}
  local f = io.open(dir_of_this_file() .. "/plugstack.conf", "r")
  if not f then return src end
  for line in f:lines() do
    if line:find("forge_spank%.so") and not line:match("^%s*#") then
      src.path = line:match("[%s]policy=(%S+)") or "/etc/forge/quota.ini"
      src.fallback = line:match("[%s]controller_fallback=(%S+)")
    end
  end
  f:close()
  return src
end

-- Slurm wall time ("48:00:00", "2-00:00:00", "90") -> minutes.
local function wall_minutes(text)
  local d, rest = text:match("^(%d+)%-(.*)$")
  local days = tonumber(d) or 0
  rest = rest or text
  local parts = split(rest, ":")
  local h, m, s = 0, 0, 0
  if d then
    h, m, s = tonumber(parts[1]) or 0, tonumber(parts[2]) or 0, tonumber(parts[3]) or 0
  elseif #parts == 1 then m = tonumber(parts[1]) or 0
  elseif #parts == 2 then m, s = tonumber(parts[1]) or 0, tonumber(parts[2]) or 0
  else h, m, s = tonumber(parts[1]) or 0, tonumber(parts[2]) or 0, tonumber(parts[3]) or 0 end
  return math.ceil(((days * 24 + h) * 60 + m) + s / 60)
end

-- The parts of the policy this script needs. The file was validated by `forge-quota check-policy`;
-- this reader only has to find values, not judge them.
local function parse_policy(path)
  local f = io.open(path, "r")
  if not f then return nil end
  -- The checker's default is the C++ side's (forge::quota::Approval::checker): a policy without the line
  -- is still checked for membership, pools and approvals.
  local p = { tiers = {}, teams = {}, gpus_per_node = 8, switches = {}, default_wall_min = nil,
    checker = "/usr/local/bin/forge-quota", admins = {} }
  local section = nil
  for line in f:lines() do
    local t = trim(line)
    if t ~= "" and not t:match("^[#;]") then
      local name = t:match("^%[(.*)%]$")
      if name then
        section = trim(name)
      else
        -- '#' ends a value, as in forge::parse_ini (common/include/forge/common/ini.h).
        local k, v = t:gsub("#.*$", ""):match("^([^=]+)=(.*)$")
        if k then
          k, v = trim(k), trim(v)
          local tier = section and section:match("^tier%.(.+)$")
          local team = section and section:match("^team%.(.+)$")
          if tier then
            p.tiers[tier] = p.tiers[tier] or {}
            if k == "qos" then p.tiers[tier].qos = v end
            if k == "max_wall" then p.tiers[tier].max_wall_min = wall_minutes(v) end
          elseif team then
            p.teams[team] = p.teams[team] or {}
            if k == "account" then p.teams[team].account = v end
            if k == "tiers" then p.teams[team].tiers = split(v, ",") end
          elseif section == "approval" and k == "checker" then
            p.checker = v
          elseif section == "policy" and k == "default_wall" then
            p.default_wall_min = wall_minutes(v)
          elseif section == "policy" and k == "admins" then
            p.admins = split(v, ",")
          elseif section == "topology" and k == "gpus_per_node" then
            p.gpus_per_node = tonumber(v) or 8
          elseif section == "topology" and k == "max_switches" then
            for _, rule in ipairs(split(v, ",")) do
              local g, s = rule:match("^(%d+):(%d+)$")
              if g then p.switches[#p.switches + 1] = { gpus = tonumber(g), switches = tonumber(s) } end
            end
          end
        end
      end
    end
  end
  f:close()
  return p
end

-- The policy (nil when it cannot be read) and its source (policy_source).
local cached, cached_at, cached_source = nil, 0, {}
local function load_policy()
  local now = os.time()
  if cached and now - cached_at < POLICY_TTL then return cached, cached_source end
  cached_source = policy_source()
  cached = cached_source.path and parse_policy(cached_source.path) or nil
  cached_at = now
  return cached, cached_source
end

-- The plugin's FORGE_LAYOUT -> { tp, cp, ep, dp, pp, ranks }, or nil. The plugin parsed the user's
-- --train-layout (forge::parse_layout) and sends its normalised spelling, Layout::str(): "tpA,ppB,dpC",
-- then ",cpD" and ",epE" when they are not 1. Any other spelling did not come from the plugin, so this
-- reads exactly that one and rejects the rest. ranks = tp*cp*dp*pp: ep is carved out of dp.
-- Tested against the C++ parser's table of cases (test/spank_plugin/job_submit_lua_test.lua).
local function parse_layout(text)
  local tp, pp, dp, rest = (text or ""):match("^tp(%d+),pp(%d+),dp(%d+)(.*)$")
  if not tp then return nil end
  local cp = rest:match("^,cp(%d+)")
  if cp then rest = rest:sub(#cp + 4) end
  local ep = rest:match("^,ep(%d+)$")
  if ep then rest = "" end
  if rest ~= "" then return nil end
  -- Numbers as str() writes them: no leading zero, 1..65536, cp and ep only when not 1.
  local function dim(digits, optional)
    if digits == nil then return optional and 1 or nil end
    local n = digits:match("^[1-9]%d*$") and tonumber(digits)
    if not n or n > 65536 or (optional and n == 1) then return nil end
    return n
  end
  local l = { tp = dim(tp), pp = dim(pp), dp = dim(dp), cp = dim(cp, true), ep = dim(ep, true) }
  if not (l.tp and l.pp and l.dp and l.cp and l.ep) then return nil end
  l.ranks = l.tp * l.cp * l.dp * l.pp
  if l.ranks > 1048576 then return nil end
  return l
end

-- "FORGE_TEAM=x" entries (a SPANK_ prefix is accepted) -> { FORGE_TEAM = "x", ... }.
local function choices_of(spank_env)
  local c = {}
  if type(spank_env) ~= "table" then return c end
  for _, entry in pairs(spank_env) do
    local k, v = tostring(entry):match("^([%w_]+)=(.*)$")
    if k then
      k = k:gsub("^SPANK_", "")
      if k:match("^FORGE_") then c[k] = v end
    end
  end
  return c
end

-- GPUs in a TRES request string ("gres:gpu:8", "gres/gpu:h100=4", "gres:gpu:a100:2"); nil if none.
local function gpus_in(tres)
  if tres == nil or tres == "" then return nil end
  local total = nil
  for _, item in ipairs(split(tres, ",")) do
    if item:find("gpu") then
      total = (total or 0) + (tonumber(item:match("(%d+)$")) or 1)
    end
  end
  return total
end

local function set_value(v) return v ~= nil and v ~= NO_VAL and v ~= INFINITE and v ~= "" end

-- A value passed to the checker's command line: a plain word (names, numbers, approval ids), never
-- anything a shell would interpret; nil when it is not.
local function word(v, max_len)
  v = tostring(v or "")
  if #v > (max_len or 64) or not v:match("^[%w._-]*$") then return nil end
  return v
end

-- `forge-quota admit` (docs/ADMISSION.md): exactly one line, "admit partition=P|- approval=ID|-" or
-- "reject MESSAGE". Returns the verdict table, or nil and why the checker could not be asked.
local function run_checker(checker, args)
  local f = io.popen(checker .. " admit " .. table.concat(args, " ") .. " 2>&1", "r")
  if not f then return nil, "cannot run " .. checker end
  local out = f:read("*a") or ""
  f:close()
  local line = out:match("^([^\n]*)")
  local rest = line:match("^reject (.*)$")
  if rest then return { admit = false, message = rest } end
  local partition, approval = line:match("^admit partition=(%S*) approval=(%S+)$")
  if partition then return { admit = true, partition = partition, approval = approval } end
  return nil, checker .. " said: " .. out:sub(1, 300)
end

local function reject(msg)
  slurm.log_user("%s", "forge: " .. msg)
  slurm.log_info("%s", "forge job_submit: rejected: " .. msg)
  return slurm.ERROR
end

local function tier_qos_set(policy)
  local set = {}
  if policy then for name, t in pairs(policy.tiers) do if t.qos then set[t.qos] = name end end end
  return set
end

-- The AdminComment's "key=value" words (job_submit.lua writes them; only root and the controller can):
-- { ["forge-approval"] = "apr-...", ["forge-elastic:nodes"] = "1-2", ... }. Whole words only, so nothing
-- inside another word counts.
local function admin_marks(text)
  local marks = {}
  for w in string.gmatch(text or "", "%S+") do
    local k, v = w:match("^(forge%-[%w:-]+)=(%S*)$")
    if k then marks[k] = v end
  end
  return marks
end

local function add_mark(job, mark)
  job.admin_comment = (job.admin_comment and job.admin_comment ~= "") and (job.admin_comment .. " " .. mark) or mark
end

-- What the policy expects of a job with the plugin's choices `c` (want.layout: the plugin's layout), or nil
-- and the rejection. An unreadable policy refuses training jobs (fail closed) unless plugstack.conf's
-- forge_spank.so line says controller_fallback=trust-plugin: then the plugin's FORGE_* values stand in for
-- it (docs/ADMISSION.md, "When a component is unavailable").
local function expectations(policy, source, c)
  local layout = parse_layout(c.FORGE_LAYOUT)
  if not layout then
    return nil, "the plugin's layout is missing or malformed; resubmit with --train-layout=tpX,ppY,dpZ"
  end
  local want = { layout = layout }
  if policy then
    local team, tier = policy.teams[c.FORGE_TEAM or ""], policy.tiers[c.FORGE_TIER]
    if not team then return nil, string.format("unknown team '%s' in %s", tostring(c.FORGE_TEAM), source.path) end
    if not tier or not tier.qos then return nil, string.format("unknown tier '%s' in %s", c.FORGE_TIER, source.path) end
    local allowed = false
    for _, t in ipairs(team.tiers or {}) do if t == c.FORGE_TIER then allowed = true end end
    if not allowed then return nil, string.format("team '%s' may not use tier '%s'", c.FORGE_TEAM, c.FORGE_TIER) end
    want.qos, want.account, want.wall = tier.qos, team.account, tier.max_wall_min
    want.gpn = policy.gpus_per_node
    want.switches = 0
    for _, rule in ipairs(policy.switches) do
      if want.switches == 0 and layout.ranks <= rule.gpus then want.switches = rule.switches end
    end
  elseif source.fallback == "trust-plugin" then
    slurm.log_info("%s", "forge job_submit: policy " .. tostring(source.path) .. " not readable; " ..
      "controller_fallback=trust-plugin: checking against the plugin's choices only")
    want.qos, want.account = c.FORGE_QOS, c.FORGE_ACCOUNT
    want.wall = tonumber(c.FORGE_MAX_WALL_MIN or "")
    want.gpn = tonumber(c.FORGE_GPUS_PER_NODE or "") or 8
    want.switches = tonumber(c.FORGE_MAX_SWITCHES or "") or 0
  else
    slurm.log_error("%s", "forge job_submit: cannot read the admission policy " .. tostring(source.path) ..
      " (named by plugstack.conf next to job_submit.lua); refusing training jobs")
    return nil, string.format("slurmctld cannot read the admission policy %s, so training jobs are refused " ..
      "until it can; ask an admin", tostring(source.path or "(plugstack.conf names none)"))
  end
  want.nodes = layout.ranks <= want.gpn and 1 or math.ceil(layout.ranks / want.gpn)
  if layout.tp > want.gpn then return nil, string.format("TP=%d exceeds the %d GPUs of a node", layout.tp, want.gpn) end
  return want
end

-- The admission rules, each on `job`: at submission the request (unset values are filled in), at a
-- modification the job record with the change applied. Each returns the rejection, or nil.
local check = {}

function check.qos(job, want, c)
  if job.qos == nil or job.qos == "" then
    job.qos = want.qos
  elseif job.qos ~= want.qos then
    return string.format("--qos=%s does not match tier '%s' (QOS '%s'); drop --qos or use --qos=%s",
      job.qos, c.FORGE_TIER, want.qos, want.qos)
  end
end

function check.account(job, want, c)
  if not want.account then return nil end
  if job.account == nil or job.account == "" then
    job.account = want.account
  elseif job.account ~= want.account then
    return string.format("--account=%s does not match team '%s' (account '%s')", job.account, c.FORGE_TEAM,
      want.account)
  end
end

-- Nodes and GPUs against the layout.
function check.size(job, want, c, layout)
  local gpus, nodes, tp = layout.ranks, want.nodes, layout.tp
  local min_nodes = set_value(job.min_nodes) and job.min_nodes or nil
  local max_nodes = set_value(job.max_nodes) and job.max_nodes or nil
  if min_nodes and max_nodes and min_nodes < max_nodes then
    -- A node range (-N MIN-MAX): an elastic job (parallel.elastic), which trains on what it gets with tp, cp
    -- and pp fixed and dp from the allocation. The layout is its largest size; every size down to MIN must
    -- hold at least one model replica, with whole TP groups in each node.
    local per_node = math.floor(gpus / nodes)
    local replica = layout.ranks / layout.dp
    if max_nodes ~= nodes then
      return string.format("--train-layout=%s is the elastic job's largest size, %d node(s), but the range " ..
        "ends at %d; use --nodes=%d-%d", c.FORGE_LAYOUT, nodes, max_nodes, min_nodes, nodes)
    end
    if min_nodes * per_node < replica or gpus % nodes ~= 0 then
      local least = math.ceil(replica / math.max(per_node, 1))
      return string.format("--nodes=%d-%d: at %d node(s) the job has %d GPUs, fewer than one model replica " ..
        "of --train-layout=%s (tp*cp*pp = %d); use --nodes=%d-%d", min_nodes, max_nodes, min_nodes,
        min_nodes * per_node, c.FORGE_LAYOUT, replica, least, nodes)
    end
    job.min_nodes, job.max_nodes = min_nodes, nodes
    -- Slurm pins an allocated job's node and task counts: after a requeue it would wait for the full size
    -- again. The range is kept where only root writes, for the controller's epilog to restore
    -- (scripts/slurm/health-hook.sh, release_requeued).
    add_mark(job, string.format("forge-elastic:nodes=%d-%d", min_nodes, nodes))
  else
    if (min_nodes and min_nodes ~= nodes) or (max_nodes and max_nodes ~= nodes) then
      return string.format("--train-layout=%s needs %d node(s) but the job asks for %s; use --nodes=%d",
        c.FORGE_LAYOUT, nodes, tostring(min_nodes or max_nodes), nodes)
    end
    job.min_nodes, job.max_nodes = nodes, nodes
  end

  -- GPUs: per job, per node x nodes, per task x tasks; every one the job states must be the layout's.
  local stated = {}
  stated[#stated + 1] = gpus_in(job.tres_per_job)
  local per_node = gpus_in(job.tres_per_node)
  if per_node then
    if per_node < tp then return string.format("%d GPUs per node cannot hold a TP group of %d", per_node, tp) end
    stated[#stated + 1] = per_node * nodes
  end
  local per_task = gpus_in(job.tres_per_task)
  if per_task and set_value(job.num_tasks) then stated[#stated + 1] = per_task * job.num_tasks end
  local asked = nil
  for _, n in ipairs(stated) do if n ~= gpus then asked = n end end
  if asked or #stated == 0 then
    return string.format("--train-layout=%s needs tp*cp*dp*pp = %d GPUs but the job asks for %s; submit " ..
      "with --nodes=%d --gpus-per-node=%d", c.FORGE_LAYOUT, gpus, asked and tostring(asked) or "none", nodes,
      math.floor(gpus / nodes))
  end
end

-- Time limit: the tier's max wall by default, never more.
function check.time(job, want, c)
  if not want.wall then return nil end
  if not set_value(job.time_limit) then
    job.time_limit = want.wall
  elseif job.time_limit > want.wall then
    return string.format("--time of %d minutes exceeds tier '%s''s max wall of %d minutes", job.time_limit,
      c.FORGE_TIER, want.wall)
  end
end

-- Switches: the topology rule for this job size, when the job spans nodes (filled in, never refused).
function check.switches(job, want)
  if want.switches > 0 and want.nodes > 1 and
      (not set_value(job.req_switch) or job.req_switch == 0 or job.req_switch > want.switches) then
    job.req_switch = want.switches
  end
end

-- Membership, pool and approval: the policy's checker (`forge-quota admit`, run as SlurmUser) decides
-- what needs the approval store and the user's identity. `approval`: { give = ID } spends a use of ID (a
-- submission), { held = ID } checks that the use the job took at submission still covers it (a
-- modification). An admitted job's partition and approval are written into it.
function check.admit(job, c, uid, policy, layout, approval)
  local checker = policy.checker
  if approval.give ~= nil and approval.give ~= "" and not word(approval.give) then
    return "--train-approval: approval id is malformed (expected apr- and 12 hex digits, as " ..
      "`forge-quota request` prints it)"
  end
  local partition = job.partition
  if partition ~= nil and partition ~= "" and not word(partition) then
    return string.format("--partition=%s: a training job runs in one partition (its tier's pool)",
      tostring(partition):sub(1, 100))
  end
  if not checker:match("^/[%w._/-]+$") then
    slurm.log_error("%s", "forge job_submit: [approval] checker must be an absolute plain path: " .. checker)
    return "the admission checker is misconfigured; ask an admin (slurmctld log)"
  end
  if not (word(c.FORGE_TEAM) and word(c.FORGE_TIER)) then return "team and tier must be plain names" end
  local args = { "--uid", tostring(uid), "--team", word(c.FORGE_TEAM), "--tier", word(c.FORGE_TIER),
    "--gpus", tostring(layout.ranks), "--minutes", tostring(job.time_limit) }
  -- "--key=value": a value that starts with '-' is never read as an option.
  if partition ~= nil and partition ~= "" then args[#args + 1] = "--partition=" .. partition end
  if approval.give ~= nil and approval.give ~= "" then args[#args + 1] = "--approval=" .. approval.give end
  if approval.held and word(approval.held) then args[#args + 1] = "--held-approval=" .. approval.held end
  local verdict, why = run_checker(checker, args)
  if not verdict then
    slurm.log_error("%s", "forge job_submit: approval checker failed: " .. why)
    -- Its own error line says what it could not do (a policy it cannot read names the file).
    local said = why:match("forge%-quota: error: ([^\n]*)")
    return "the admission checker failed" .. (said and (": " .. said:sub(1, 200)) or "") ..
      "; ask an admin (slurmctld log)"
  end
  if not verdict.admit then return verdict.message end
  if verdict.partition ~= "-" and verdict.partition ~= "" then job.partition = verdict.partition end
  if approval.give and verdict.approval ~= "-" then add_mark(job, "forge-approval=" .. verdict.approval) end
end

-- A training job: the plugin's choices (FORGE_TIER set), or nil for any other job.
local function training_choices(spank_env)
  local c = choices_of(spank_env)
  return c.FORGE_TIER ~= nil and c or nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local policy, source = load_policy()
  local c = training_choices(job_desc.spank_job_env)

  if not c then
    if job_desc.qos ~= nil and job_desc.qos ~= "" then
      local tier = tier_qos_set(policy)[job_desc.qos]
      if tier then
        return reject(string.format("QOS '%s' is for training jobs of tier '%s': submit with --train-team, " ..
          "--train-tier=%s and --train-layout", job_desc.qos, tier, tier))
      end
      -- Which QOS are tiers' is the policy's to say: without it, none may be named.
      if not policy and source.fallback ~= "trust-plugin" then
        return reject(string.format("slurmctld cannot read the admission policy %s, so jobs naming a QOS are " ..
          "refused until it can; drop --qos or ask an admin", tostring(source.path)))
      end
    end
    -- Not a training job: only the default time limit, without which a budgeted account never starts it.
    if policy and policy.default_wall_min and not set_value(job_desc.time_limit) then
      job_desc.time_limit = policy.default_wall_min
    end
    return slurm.SUCCESS
  end

  local want, why = expectations(policy, source, c)
  if not want then return reject(why) end
  local layout = want.layout
  for _, rule in ipairs({ check.qos, check.account, check.size, check.time }) do
    why = rule(job_desc, want, c, layout)
    if why then return reject(why) end
  end
  check.switches(job_desc, want)
  -- Last, so that an approval is consumed only by a job that passed everything above.
  if policy then
    why = check.admit(job_desc, c, submit_uid, policy, layout, { give = c.FORGE_APPROVAL })
    if why then return reject(why) end
  end
  -- The mark the controller's hooks know a training job by (health-hook.sh): never the Comment, which
  -- the job's owner writes.
  add_mark(job_desc, "forge-tier=" .. (word(c.FORGE_TIER) or "-"))
  return slurm.SUCCESS
end

-- Who may change a training job past the rules: root, the controller's own user (its hooks), and the
-- policy's admins (users, or @groups). Asked only of a change the rules would judge.
local controller_uid = nil
local function is_admin(uid, policy)
  if uid == 0 then return true end
  if controller_uid == nil then
    local f = io.popen("id -u 2>/dev/null")
    controller_uid = f and tonumber(f:read("*l") or "") or -1
    if f then f:close() end
  end
  if uid == controller_uid then return true end
  if not policy then return false end
  local f = io.popen("getent passwd " .. string.format("%d", uid) .. " 2>/dev/null")
  local user = f and (f:read("*l") or ""):match("^([^:]+):") or nil
  if f then f:close() end
  if not user or not word(user) then return false end
  local groups = nil
  for _, who in ipairs(policy.admins) do
    if who == user then return true end
    local g = who:match("^@(.+)$")
    if g then
      if groups == nil then
        groups = {}
        local gf = io.popen("id -Gn " .. user .. " 2>/dev/null")
        for name in string.gmatch(gf and gf:read("*a") or "", "%S+") do groups[name] = true end
        if gf then gf:close() end
      end
      if groups[g] then return true end
    end
  end
  return false
end

-- The fields a change to a job sets (scontrol update): each admission rule that reads one of them runs
-- again on the job record with the change applied.
local SIZE_FIELDS = { "min_nodes", "max_nodes", "num_tasks", "tres_per_job", "tres_per_node", "tres_per_task" }

-- Slurm (22.05) does not pass a job_modify's message to the user: a refusal is the error code of the rule
-- (scontrol prints its text: "Invalid node count specified", "Access/permission denied", ...) and the
-- whole sentence goes to slurmctld's log.
local function refuse_change(modify_uid, job_id, why, code)
  slurm.log_info("%s", string.format("forge job_modify: refused uid %d's update of job %d: %s", modify_uid, job_id, why))
  return code or slurm.ESLURM_ACCESS_DENIED
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local c = training_choices(job_rec.spank_job_env)
  local changes = {}
  for _, f in ipairs(SIZE_FIELDS) do if set_value(job_desc[f]) then changes.size = true end end
  for _, f in ipairs({ "qos", "account", "partition", "time_limit" }) do
    if set_value(job_desc[f]) then changes[f] = true end
  end
  if next(changes) == nil then return slurm.SUCCESS end  -- a hold, a release, a comment, a priority, ...
  local policy, source = load_policy()
  local function refuse(why, code) return refuse_change(modify_uid, job_rec.job_id, why, code) end

  if not c then
    -- Any job: a tier's QOS only through the plugin.
    local tier = changes.qos and tier_qos_set(policy)[job_desc.qos]
    if tier then
      return refuse(string.format("QOS '%s' belongs to tier '%s'; only jobs submitted with --train-tier=%s " ..
        "may use it", job_desc.qos, tier, tier))
    end
    return slurm.SUCCESS
  end

  if is_admin(modify_uid, policy) then
    local what = {}
    for k in pairs(changes) do what[#what + 1] = k end
    table.sort(what)
    slurm.log_info("%s", string.format("forge job_modify: admin uid %d changed training job %d: %s", modify_uid,
      job_rec.job_id, table.concat(what, ",")))
    return slurm.SUCCESS
  end
  local want, why = expectations(policy, source, c)
  if not want then return refuse(why) end
  local layout = want.layout

  -- The job as it would be: the record, with what the change sets.
  local job = {}
  for _, f in ipairs({ "qos", "account", "partition", "time_limit", "min_nodes", "max_nodes", "tres_per_job",
      "tres_per_node", "tres_per_task", "admin_comment" }) do
    job[f] = job_rec[f]
  end
  for _, f in ipairs({ "qos", "account", "partition", "time_limit" }) do
    if changes[f] then job[f] = job_desc[f] end
  end
  for _, f in ipairs(SIZE_FIELDS) do if set_value(job_desc[f]) then job[f] = job_desc[f] end end
  if set_value(job_desc.min_nodes) and not set_value(job_desc.max_nodes) then job.max_nodes = job_desc.min_nodes end

  for _, rule in ipairs({ { "qos", check.qos, slurm.ESLURM_ACCESS_DENIED },
      { "account", check.account, slurm.ESLURM_INVALID_ACCOUNT },
      { "size", check.size, slurm.ESLURM_INVALID_NODE_COUNT },
      { "time_limit", check.time, slurm.ESLURM_INVALID_TIME_LIMIT } }) do
    if changes[rule[1]] then
      why = rule[2](job, want, c, layout)
      if why then return refuse(why, rule[3]) end
    end
  end
  -- The pool and the approval (GPU-hours grow with the time limit) through the same checker as at
  -- submission; the approval the job took then is checked for cover, not spent again.
  if policy and (changes.partition or changes.time_limit) then
    why = check.admit(job, c, job_rec.user_id, policy, layout,
      { held = admin_marks(job_rec.admin_comment)["forge-approval"] })
    if why then return refuse(why) end
  end
  return slurm.SUCCESS
end

slurm.log_info("%s", "forge job_submit.lua loaded")
-- slurmctld keeps only the first value (the load status); the second is for the tests, which load this
-- file with a stub `slurm` table (test/spank_plugin/job_submit_lua_test.lua).
return slurm.SUCCESS, { parse_layout = parse_layout, parse_policy = parse_policy }
