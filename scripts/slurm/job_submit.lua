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
  * then the policy's checker (`forge-quota admit`, run as SlurmUser) decides what needs the approval
    store and the user's identity: team membership of the submitting uid, the pool (partition) of the
    tier, and an approval for a large request (--train-approval=ID), which it consumes. An admitted
    approval is recorded in the job's AdminComment ("forge-approval=ID"), which only root writes.

The policy path comes from the forge_spank.so line of the plugstack.conf next to this file
(policy=PATH). Messages go to the user with slurm.log_user("%s", msg), never as a format.
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

-- The policy path from plugstack.conf's forge_spank.so line, or nil.
local function policy_path()
  local f = io.open(dir_of_this_file() .. "/plugstack.conf", "r")
  if not f then return nil end
  local path = nil
  for line in f:lines() do
    if line:find("forge_spank%.so") and not line:match("^%s*#") then
      path = line:match("policy=(%S+)")
    end
  end
  f:close()
  return path
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
  local p = { tiers = {}, teams = {}, gpus_per_node = 8, switches = {}, default_wall_min = nil }
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

local cached, cached_at, cached_path = nil, 0, nil
local function load_policy()
  local now = os.time()
  if cached and now - cached_at < POLICY_TTL then return cached, cached_path end
  cached_path = policy_path()
  cached = cached_path and parse_policy(cached_path) or nil
  cached_at = now
  return cached, cached_path
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

function slurm_job_submit(job_desc, part_list, submit_uid)
  local policy, path = load_policy()
  local c = choices_of(job_desc.spank_job_env)
  local tier_of_qos = tier_qos_set(policy)

  if c.FORGE_TIER == nil then
    if job_desc.qos ~= nil and tier_of_qos[job_desc.qos] then
      return reject(string.format("QOS '%s' is for training jobs of tier '%s': submit with --train-team, " ..
        "--train-tier=%s and --train-layout", job_desc.qos, tier_of_qos[job_desc.qos], tier_of_qos[job_desc.qos]))
    end
    -- Not a training job: only the default time limit, without which a budgeted account never starts it.
    if policy and policy.default_wall_min and not set_value(job_desc.time_limit) then
      job_desc.time_limit = policy.default_wall_min
    end
    return slurm.SUCCESS
  end

  -- Expectations: from the policy when readable, else from what the plugin sent.
  local layout = parse_layout(c.FORGE_LAYOUT)
  if not layout then return reject("the plugin's layout is missing or malformed; resubmit with --train-layout=tpX,ppY,dpZ") end
  local tp, gpus = layout.tp, layout.ranks
  local want = {}
  if policy then
    local team, tier = policy.teams[c.FORGE_TEAM or ""], policy.tiers[c.FORGE_TIER]
    if not team then return reject(string.format("unknown team '%s' in %s", tostring(c.FORGE_TEAM), path)) end
    if not tier or not tier.qos then return reject(string.format("unknown tier '%s' in %s", c.FORGE_TIER, path)) end
    local allowed = false
    for _, t in ipairs(team.tiers or {}) do if t == c.FORGE_TIER then allowed = true end end
    if not allowed then
      return reject(string.format("team '%s' may not use tier '%s'", c.FORGE_TEAM, c.FORGE_TIER))
    end
    want.qos, want.account, want.wall = tier.qos, team.account, tier.max_wall_min
    want.gpn = policy.gpus_per_node
    want.switches = 0
    for _, rule in ipairs(policy.switches) do
      if want.switches == 0 and gpus <= rule.gpus then want.switches = rule.switches end
    end
  else
    slurm.log_info("%s", "forge job_submit: policy not readable (plugstack.conf next to job_submit.lua?); " ..
      "checking against the plugin's choices only")
    want.qos, want.account = c.FORGE_QOS, c.FORGE_ACCOUNT
    want.wall = tonumber(c.FORGE_MAX_WALL_MIN or "")
    want.gpn = tonumber(c.FORGE_GPUS_PER_NODE or "") or 8
    want.switches = tonumber(c.FORGE_MAX_SWITCHES or "") or 0
  end
  local nodes = gpus <= want.gpn and 1 or math.ceil(gpus / want.gpn)
  if tp > want.gpn then
    return reject(string.format("TP=%d exceeds the %d GPUs of a node", tp, want.gpn))
  end

  -- QOS and account: fill in when absent, reject when different.
  if job_desc.qos == nil or job_desc.qos == "" then
    job_desc.qos = want.qos
  elseif job_desc.qos ~= want.qos then
    return reject(string.format("--qos=%s does not match tier '%s' (QOS '%s'); drop --qos or use --qos=%s",
      job_desc.qos, c.FORGE_TIER, want.qos, want.qos))
  end
  if want.account then
    if job_desc.account == nil or job_desc.account == "" then
      job_desc.account = want.account
    elseif job_desc.account ~= want.account then
      return reject(string.format("--account=%s does not match team '%s' (account '%s')",
        job_desc.account, c.FORGE_TEAM, want.account))
    end
  end

  -- Nodes.
  local min_nodes = set_value(job_desc.min_nodes) and job_desc.min_nodes or nil
  local max_nodes = set_value(job_desc.max_nodes) and job_desc.max_nodes or nil
  if min_nodes and max_nodes and min_nodes < max_nodes then
    -- A node range (-N MIN-MAX): an elastic job (parallel.elastic), which trains on what it gets with tp, cp
    -- and pp fixed and dp from the allocation. The layout is its largest size; every size down to MIN must
    -- hold at least one model replica, with whole TP groups in each node.
    local per_node = math.floor(gpus / nodes)
    local replica = layout.ranks / layout.dp
    if max_nodes ~= nodes then
      return reject(string.format("--train-layout=%s is the elastic job's largest size, %d node(s), but the range " ..
        "ends at %d; use --nodes=%d-%d", c.FORGE_LAYOUT, nodes, max_nodes, min_nodes, nodes))
    end
    if min_nodes * per_node < replica or gpus % nodes ~= 0 then
      local least = math.ceil(replica / math.max(per_node, 1))
      return reject(string.format("--nodes=%d-%d: at %d node(s) the job has %d GPUs, fewer than one model replica " ..
        "of --train-layout=%s (tp*cp*pp = %d); use --nodes=%d-%d", min_nodes, max_nodes, min_nodes,
        min_nodes * per_node, c.FORGE_LAYOUT, replica, least, nodes))
    end
    job_desc.min_nodes, job_desc.max_nodes = min_nodes, nodes
    -- Slurm pins an allocated job's node and task counts: after a requeue it would wait for the full size
    -- again. The range is kept where only root writes, for the Epilog to restore (scripts/slurm/
    -- health-hook.sh, release_requeued).
    job_desc.admin_comment = string.format("forge-elastic:nodes=%d-%d", min_nodes, nodes)
  else
    if (min_nodes and min_nodes ~= nodes) or (max_nodes and max_nodes ~= nodes) then
      return reject(string.format("--train-layout=%s needs %d node(s) but the job asks for %s; use --nodes=%d",
        c.FORGE_LAYOUT, nodes, tostring(min_nodes or max_nodes), nodes))
    end
    job_desc.min_nodes, job_desc.max_nodes = nodes, nodes
  end

  -- GPUs: per job, or per node x nodes, or per task x tasks.
  local asked = gpus_in(job_desc.tres_per_job)
  if asked == nil then
    local per_node = gpus_in(job_desc.tres_per_node)
    if per_node then
      if per_node < tp then
        return reject(string.format("%d GPUs per node cannot hold a TP group of %d", per_node, tp))
      end
      asked = per_node * nodes
    end
  end
  if asked == nil then
    local per_task = gpus_in(job_desc.tres_per_task)
    local tasks = set_value(job_desc.num_tasks) and job_desc.num_tasks or nil
    if per_task and tasks then asked = per_task * tasks end
  end
  if asked ~= gpus then
    return reject(string.format("--train-layout=%s needs tp*cp*dp*pp = %d GPUs but the job asks for %s; submit " ..
      "with --nodes=%d --gpus-per-node=%d", c.FORGE_LAYOUT, gpus, asked and tostring(asked) or "none", nodes,
      math.floor(gpus / nodes)))
  end

  -- Time limit: the tier's max wall by default, never more.
  if want.wall then
    if not set_value(job_desc.time_limit) then
      job_desc.time_limit = want.wall
    elseif job_desc.time_limit > want.wall then
      return reject(string.format("--time of %d minutes exceeds tier '%s''s max wall of %d minutes",
        job_desc.time_limit, c.FORGE_TIER, want.wall))
    end
  end

  -- Switches: the topology rule for this job size, when the job spans nodes.
  if want.switches > 0 and nodes > 1 then
    if not set_value(job_desc.req_switch) or job_desc.req_switch == 0 or job_desc.req_switch > want.switches then
      job_desc.req_switch = want.switches
    end
  end

  -- Membership, pool and approval: last, so that an approval is consumed only by a job that passed
  -- everything above. Without a checker in the policy (an older policy) none of the three applies.
  if policy and policy.checker then
    local approval = c.FORGE_APPROVAL
    if approval ~= nil and approval ~= "" and not word(approval) then
      return reject("--train-approval: approval id is malformed (expected apr- and 12 hex digits, as " ..
        "`forge-quota request` prints it)")
    end
    local partition = job_desc.partition
    if partition ~= nil and partition ~= "" and not word(partition) then
      return reject(string.format("--partition=%s: a training job runs in one partition (its tier's pool)",
        tostring(partition):sub(1, 100)))
    end
    if not policy.checker:match("^/[%w._/-]+$") then
      slurm.log_error("%s", "forge job_submit: [approval] checker must be an absolute plain path: " .. policy.checker)
      return reject("the admission checker is misconfigured; ask an admin (slurmctld log)")
    end
    if not (word(c.FORGE_TEAM) and word(c.FORGE_TIER)) then return reject("team and tier must be plain names") end
    local args = { "--uid", tostring(submit_uid), "--team", word(c.FORGE_TEAM), "--tier", word(c.FORGE_TIER),
      "--gpus", tostring(gpus), "--minutes", tostring(job_desc.time_limit) }
    -- "--key=value": a value that starts with '-' is never read as an option.
    if partition ~= nil and partition ~= "" then args[#args + 1] = "--partition=" .. partition end
    if approval ~= nil and approval ~= "" then args[#args + 1] = "--approval=" .. approval end
    local verdict, why = run_checker(policy.checker, args)
    if not verdict then
      slurm.log_error("%s", "forge job_submit: approval checker failed: " .. why)
      return reject("the admission checker failed; ask an admin (slurmctld log)")
    end
    if not verdict.admit then return reject(verdict.message) end
    if verdict.partition ~= "-" and verdict.partition ~= "" then job_desc.partition = verdict.partition end
    if verdict.approval ~= "-" then
      local mark = "forge-approval=" .. verdict.approval
      job_desc.admin_comment = job_desc.admin_comment and (job_desc.admin_comment .. " " .. mark) or mark
    end
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  -- A training job's QOS stays its tier's: scontrol update QOS=... may not move it.
  if job_desc.qos == nil or job_desc.qos == "" then return slurm.SUCCESS end
  local c = choices_of(job_rec.spank_job_env)
  if c.FORGE_TIER == nil then
    local policy = load_policy()
    local tier = tier_qos_set(policy)[job_desc.qos]
    if tier then
      return reject(string.format("QOS '%s' belongs to tier '%s'; only jobs submitted with --train-tier=%s " ..
        "may use it", job_desc.qos, tier, tier))
    end
    return slurm.SUCCESS
  end
  if c.FORGE_QOS and job_desc.qos ~= c.FORGE_QOS then
    return reject(string.format("job of tier '%s' must keep QOS '%s'", c.FORGE_TIER, c.FORGE_QOS))
  end
  return slurm.SUCCESS
end

slurm.log_info("%s", "forge job_submit.lua loaded")
-- slurmctld keeps only the first value (the load status); the second is for the tests, which load this
-- file with a stub `slurm` table (test/spank_plugin/job_submit_lua_test.lua).
return slurm.SUCCESS, { parse_layout = parse_layout }
