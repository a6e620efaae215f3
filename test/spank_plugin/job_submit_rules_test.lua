-- job_submit.lua's admission rules, at submission and at a change of the job (scontrol update), run by Lua
-- 5.1 on the REAL script with a stub `slurm` table, the example policy and a stand-in for the checker
-- (`forge-quota admit`, tested on its own in test/quota and against the dev cluster in
-- test/slurm/governance_test.sh) that records its arguments and answers as the real one would.
-- Usage: lua5.1 job_submit_rules_test.lua JOB_SUBMIT_LUA EXAMPLE_POLICY SCRATCH_DIR
local script, example, dir = arg[1], arg[2], arg[3]
assert(script and example and dir, "usage: lua5.1 job_submit_rules_test.lua JOB_SUBMIT_LUA EXAMPLE_POLICY SCRATCH_DIR")
os.execute("rm -rf '" .. dir .. "' && mkdir -p '" .. dir .. "'")

local NO_VAL = 4294967294
-- What the script tells the user (log_user: submissions) or slurmctld's log (log_info: a refused change,
-- whose message Slurm does not pass on); the error codes as Slurm's Lua exports them (values arbitrary).
local said, failures, user_msgs = nil, 0, 0
slurm = { SUCCESS = 0, ERROR = -1, ESLURM_ACCESS_DENIED = 2002, ESLURM_INVALID_ACCOUNT = 2045,
  ESLURM_INVALID_NODE_COUNT = 2006, ESLURM_INVALID_TIME_LIMIT = 2051, log_error = function() end,
  log_info = function(_, msg) if msg:find("refused uid", 1, true) then said = msg end end,
  log_user = function(_, msg) said, user_msgs = msg, user_msgs + 1 end }

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end
local function read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local t = f:read("*a")
  f:close()
  return t
end

-- The checker: refuses the eval partition, as the pools do, and (standing in for the GPU-hour rule) times
-- of 150 to 199 minutes without a held approval; admits the rest with the train pool.
local checker = dir .. "/checker"
write(checker, [[#!/bin/sh
echo "$@" >>"$(dirname "$0")/checker.args"
case " $* " in
  *" --partition=eval "*) echo "reject partition 'eval' (pool eval) does not take tier 'explore' jobs; submit to train (--partition)"; exit 1 ;;
  *" --held-approval="*) echo "admit partition=train approval=-"; exit 0 ;;
  *" --minutes "1[5-9][0-9]" "*) echo "reject 8 GPUs for 3:00:00 needs an approval: forge-quota request ..."; exit 1 ;;
esac
echo "admit partition=train approval=-"
]])
os.execute("chmod 0755 '" .. checker .. "'")
local policy_text = assert(read(example)):gsub("\ncheckers? = [^\n]*", "\nchecker = " .. checker)

-- A fresh copy of the script next to a plugstack.conf naming `policy` (and `extra` arguments).
local function load(policy, extra)
  local copy = dir .. "/job_submit.lua"
  write(copy, assert(read(script)))
  write(dir .. "/plugstack.conf", "required /x/forge_spank.so policy=" .. policy .. " " .. (extra or "") .. "\n")
  local status, exports = dofile(copy)
  assert(status == slurm.SUCCESS, "job_submit.lua did not load")
  return exports
end

local function expect(what, rc, want_rc, pattern)
  local ok = rc == want_rc and (pattern == nil or (said or ""):find(pattern, 1, true) ~= nil)
  if not ok then
    failures = failures + 1
    io.stderr:write(string.format("FAIL: %s: rc %s (want %s), said: %s\n", what, tostring(rc), tostring(want_rc),
      tostring(said)))
  end
  said = nil
end
local function checker_args()
  local t = read(dir .. "/checker.args") or ""
  os.remove(dir .. "/checker.args")
  return t
end

local env = { "FORGE_TEAM=team-a", "FORGE_TIER=explore", "FORGE_LAYOUT=tp2,pp1,dp4" }
local function request()
  return { spank_job_env = env, tres_per_node = "gres:gpu:8", min_nodes = NO_VAL, max_nodes = NO_VAL,
    time_limit = NO_VAL, req_switch = NO_VAL }
end

-- Submission: filled in from the policy and marked for the controller's hooks.
write(dir .. "/quota.ini", policy_text)
local exports = load(dir .. "/quota.ini")
local job = request()
expect("submission", slurm_job_submit(job, {}, 4242), slurm.SUCCESS)
assert(job.qos == "explore" and job.account == "team-a" and job.partition == "train" and job.time_limit == 240,
  "submission did not fill in qos, account, partition and time")
assert((" " .. job.admin_comment .. " "):find(" forge-tier=explore ", 1, true), "no forge-tier mark: " .. job.admin_comment)
assert(checker_args():find("--uid 4242 --team team-a --tier explore --gpus 8 --minutes 240", 1, true))

local user_msgs_before = user_msgs
-- Changes by the owner (uid 4242, not an admin) of the admitted job, with an approval taken at submission.
local function record()
  return { spank_job_env = env, job_id = 7, user_id = 4242, qos = "explore", account = "team-a",
    partition = "train", time_limit = 240, min_nodes = 1, max_nodes = 1, tres_per_node = "gres:gpu:8",
    admin_comment = "forge-approval=apr-0123456789ab forge-tier=explore" }
end
local function change(fields)
  local d = { min_nodes = NO_VAL, max_nodes = NO_VAL, num_tasks = NO_VAL, time_limit = NO_VAL }
  for k, v in pairs(fields) do d[k] = v end
  return d
end
local function modify(fields, uid) return slurm_job_modify(change(fields), record(), {}, uid or 4242) end

expect("grow the GPUs", modify({ tres_per_node = "gres:gpu:16" }), slurm.ESLURM_INVALID_NODE_COUNT,
  "refused uid 4242's update of job 7: --train-layout=tp2,pp1,dp4 needs tp*cp*dp*pp = 8 GPUs but the job asks for 16")
expect("grow the nodes", modify({ min_nodes = 3 }), slurm.ESLURM_INVALID_NODE_COUNT, "needs 1 node(s) but the job asks for 3")
expect("more GPUs per task", modify({ tres_per_task = "gres:gpu:8", num_tasks = 3 }), slurm.ESLURM_INVALID_NODE_COUNT,
  "needs tp*cp*dp*pp = 8 GPUs but the job asks for 24")
expect("another tier's QOS", modify({ qos = "pretrain" }), slurm.ESLURM_ACCESS_DENIED,
  "--qos=pretrain does not match tier 'explore'")
expect("another account", modify({ account = "team-b" }), slurm.ESLURM_INVALID_ACCOUNT,
  "--account=team-b does not match team 'team-a'")
expect("over the max wall", modify({ time_limit = 600 }), slurm.ESLURM_INVALID_TIME_LIMIT,
  "exceeds tier 'explore''s max wall of 240")
assert(checker_args() == "", "the checker ran for a change the local rules refused")
expect("into the eval pool", modify({ partition = "eval" }), slurm.ESLURM_ACCESS_DENIED,
  "refused uid 4242's update of job 7: partition 'eval' (pool eval) does not take tier 'explore' jobs")
local args = checker_args()
assert(args:find("--uid 4242 ", 1, true) and args:find("--partition=eval", 1, true) and
  args:find("--held-approval=apr-0123456789ab", 1, true) and not args:find("--approval=", 1, true),
  "the checker was not asked about the owner's job with its held approval: " .. args)
expect("a shorter time", modify({ time_limit = 120 }), slurm.SUCCESS)
assert(checker_args():find("--minutes 120", 1, true), "the checker did not see the new time")
-- Not admission's business: no rule and no checker run.
expect("a comment", modify({ comment = "forge:{}" }), slurm.SUCCESS)
expect("a hold", modify({ priority = 0 }), slurm.SUCCESS)
assert(checker_args() == "", "the checker ran for a change admission does not depend on")
-- A job without the approval mark: a longer time needs one, with the submission's message.
local plain = record()
plain.admin_comment = "forge-tier=explore"
expect("a change that needs an approval", slurm_job_modify(change({ time_limit = 180 }), plain, {}, 4242),
  slurm.ESLURM_ACCESS_DENIED,
  "needs an approval: forge-quota request")
assert(not checker_args():find("held-approval", 1, true), "a job without an approval was said to hold one")
-- The Comment is the owner's: a marker written there holds nothing.
plain.admin_comment = nil
plain.comment = "forge-approval=apr-0123456789ab"
expect("an approval mark in the Comment", slurm_job_modify(change({ time_limit = 180 }), plain, {}, 4242),
  slurm.ESLURM_ACCESS_DENIED)
checker_args()
-- Root may change anything.
expect("root grows the job", modify({ min_nodes = 3, tres_per_node = "gres:gpu:16" }, 0), slurm.SUCCESS)
-- Any job: a tier's QOS only through the plugin.
expect("a tier's QOS for a plain job", slurm_job_modify(change({ qos = "pretrain" }), { job_id = 8, user_id = 4242 }, {}, 4242),
  slurm.ESLURM_ACCESS_DENIED, "QOS 'pretrain' belongs to tier 'pretrain'")

-- (Slurm discards a job_modify's log_user and logs an error for it.)
assert(user_msgs == user_msgs_before, "slurm_job_modify called slurm.log_user")

-- A policy without a checker line still has the checker (the C++ side's default path).
write(dir .. "/nochecker.ini", (policy_text:gsub("\nchecker = [^\n]*", "")))
assert(exports.parse_policy(dir .. "/nochecker.ini").checker == "/usr/local/bin/forge-quota",
  "a policy without 'checker' switched the checker off")

-- A policy slurmctld cannot read: training jobs and tier QOS refused, naming the path (fail closed) ...
load(dir .. "/missing.ini")
expect("training job, policy unreadable", slurm_job_submit(request(), {}, 4242), slurm.ERROR,
  "slurmctld cannot read the admission policy " .. dir .. "/missing.ini, so training jobs are refused")
expect("a QOS, policy unreadable", slurm_job_submit({ qos = "pretrain", time_limit = NO_VAL }, {}, 4242), slurm.ERROR,
  "jobs naming a QOS are refused")
expect("a plain job, policy unreadable", slurm_job_submit({ time_limit = NO_VAL }, {}, 4242), slurm.SUCCESS)
expect("a change, policy unreadable", modify({ partition = "eval" }), slurm.ESLURM_ACCESS_DENIED,
  "cannot read the admission policy")
-- ... unless the site chose to trust the plugin's values then.
load(dir .. "/missing.ini", "controller_fallback=trust-plugin")
local trusted = request()
trusted.spank_job_env = { "FORGE_TEAM=team-a", "FORGE_TIER=explore", "FORGE_LAYOUT=tp2,pp1,dp4", "FORGE_QOS=explore",
  "FORGE_ACCOUNT=team-a", "FORGE_MAX_WALL_MIN=240", "FORGE_GPUS_PER_NODE=8" }
expect("trust-plugin", slurm_job_submit(trusted, {}, 4242), slurm.SUCCESS)
assert(trusted.qos == "explore" and trusted.time_limit == 240, "trust-plugin did not use the plugin's values")
assert(checker_args() == "", "the checker ran without a policy")

if failures > 0 then os.exit(1) end
print("ok: job_submit.lua's rules at submission and at changes, the checker's default and the unreadable policy")
