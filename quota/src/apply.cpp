#include "forge/quota/apply.h"

#include "forge/common/error.h"
#include "forge/common/ini.h"
#include "forge/common/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace forge::quota {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::set<std::string> set_of(const std::string& list) {
  std::set<std::string> out;
  for (const auto& x : split_list(list)) out.insert(x);
  return out;
}

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ",") + x;
  return out;
}

std::vector<std::string> split_bars(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream in(line);
  std::string f;
  while (std::getline(in, f, '|')) out.push_back(f);
  if (!line.empty() && line.back() == '|') out.push_back("");
  return out;
}

// The value of `tres` ("gres/gpu") in a TRES list, or -1.
int64_t tres_value(const std::string& list, const std::string& tres) {
  for (const auto& item : split_list(list)) {
    const auto eq = item.find('=');
    if (eq != std::string::npos && item.substr(0, eq) == tres) return std::stoll(item.substr(eq + 1));
  }
  return -1;
}

}  // namespace

std::vector<std::string> show_qos_args() {
  return {"-n", "-P", "show", "qos",
          "format=Name,Priority,Preempt,PreemptMode,GraceTime,Flags,UsageFactor,MaxWall"};
}

std::vector<std::string> show_assoc_args(const std::string& cluster) {
  return {"-n",
          "-P",
          "show",
          "assoc",
          "where",
          "cluster=" + cluster,
          "format=Account,User,GrpTRESMins,GrpTRES,QOS"};
}

SlurmState parse_slurm_state(const std::string& qos_text, const std::string& assoc_text) {
  SlurmState st;
  std::istringstream q(qos_text);
  std::string line;
  for (int n = 1; std::getline(q, line); ++n) {
    if (line.empty()) continue;
    const auto f = split_bars(line);
    if (f.size() != 8)
      fail(ExitCode::kData, "sacctmgr show qos line {}: expected 8 fields, got {}: '{}'", n, f.size(), line);
    QosState s;
    s.priority = f[1].empty() ? 0 : std::stoi(f[1]);
    s.preempt = set_of(f[2]);
    s.preempt_mode = lower(f[3]);
    s.grace_s = parse_wall_time(f[4]).value_or(0);
    s.flags = set_of(f[5]);
    s.usage_factor = f[6].empty() ? 1.0 : std::stod(f[6]);
    s.max_wall_s = f[7].empty() ? 0 : parse_wall_time(f[7]).value_or(0);
    st.qos[f[0]] = s;
  }
  std::istringstream a(assoc_text);
  for (int n = 1; std::getline(a, line); ++n) {
    if (line.empty()) continue;
    const auto f = split_bars(line);
    if (f.size() != 5)
      fail(ExitCode::kData, "sacctmgr show assoc line {}: expected 5 fields, got {}: '{}'", n, f.size(),
           line);
    AssocState s{f[2], f[3], set_of(f[4])};
    if (f[1].empty())
      st.accounts[f[0]] = s;
    else
      st.users[{f[0], f[1]}] = s;
  }
  return st;
}

std::vector<std::vector<std::string>> plan_apply(const Policy& policy, const SlurmState& st) {
  std::vector<std::vector<std::string>> cmds;
  // QOS first (all of them exist before any Preempt= names one), then their settings.
  for (const auto& [_, tier] : policy.tiers)
    if (!st.qos.count(tier.qos)) cmds.push_back({"add", "qos", tier.qos});
  for (const auto& [_, tier] : policy.tiers) {
    std::set<std::string> preempt;
    if (!tier.preemptible)
      for (const auto& [__, other] : policy.tiers)
        if (other.preemptible && other.priority < tier.priority) preempt.insert(other.qos);
    const auto it = st.qos.find(tier.qos);
    const QosState cur = it == st.qos.end() ? QosState{} : it->second;
    const bool fresh = it == st.qos.end();
    std::vector<std::string> set;
    if (fresh || cur.priority != tier.priority) set.push_back(fmt::format("Priority={}", tier.priority));
    if (fresh || cur.preempt != preempt) set.push_back("Preempt=" + joined(preempt));
    if (fresh || cur.preempt_mode != "requeue") set.push_back("PreemptMode=requeue");
    if (fresh || cur.grace_s != tier.grace_s) set.push_back(fmt::format("GraceTime={}", tier.grace_s));
    if (fresh || !cur.flags.count("DenyOnLimit")) set.push_back("Flags+=DenyOnLimit");
    if (fresh || std::fabs(cur.usage_factor - tier.charge) > 1e-6)
      set.push_back(fmt::format("UsageFactor={}", tier.charge));
    if (fresh || cur.max_wall_s != tier.max_wall_s)
      set.push_back("MaxWall=" + format_wall_time(tier.max_wall_s));
    if (set.empty()) continue;
    std::vector<std::string> cmd = {"modify", "qos", "where", "name=" + tier.qos, "set"};
    cmd.insert(cmd.end(), set.begin(), set.end());
    cmds.push_back(std::move(cmd));
  }
  std::set<std::string> tier_qos;
  for (const auto& [_, tier] : policy.tiers) tier_qos.insert(tier.qos);
  // The QOS list an association should have: the team's tiers, plus whatever non-tier QOS (such as
  // "normal") it already had, so jobs that are not training jobs keep running as before.
  const auto wanted_qos = [&](const Team& team, const std::set<std::string>& current) {
    std::set<std::string> q;
    for (const auto& name : team.tiers) q.insert(policy.tier(name)->qos);
    for (const auto& c : current)
      if (!tier_qos.count(c)) q.insert(c);
    return q;
  };
  for (const auto& [_, team] : policy.teams) {
    const auto it = st.accounts.find(team.account);
    const bool fresh = it == st.accounts.end();
    if (fresh)
      cmds.push_back({"add", "account", team.account, "Cluster=" + policy.cluster,
                      "Description=forge team " + team.name, "Organization=forge"});
    const AssocState cur = fresh ? AssocState{} : it->second;
    const int64_t mins = static_cast<int64_t>(std::llround(team.budget_gpu_hours * 60));
    const std::set<std::string> qos = wanted_qos(team, fresh ? std::set<std::string>{"normal"} : cur.qos);
    std::vector<std::string> set;
    if (tres_value(cur.grp_tres_mins, "gres/gpu") != mins)
      set.push_back(fmt::format("GrpTRESMins=gres/gpu={}", mins));
    if (tres_value(cur.grp_tres, "gres/gpu") != team.max_gpus)
      set.push_back(fmt::format("GrpTRES=gres/gpu={}", team.max_gpus));
    if (cur.qos != qos) set.push_back("QOS=" + joined(qos));
    if (!set.empty()) {
      std::vector<std::string> cmd = {
          "modify", "account", "where", "name=" + team.account, "cluster=" + policy.cluster, "set"};
      cmd.insert(cmd.end(), set.begin(), set.end());
      cmds.push_back(std::move(cmd));
    }
    for (const auto& user : team.members.users)
      if (!st.users.count({team.account, user}))
        cmds.push_back({"add", "user", user, "Account=" + team.account, "Cluster=" + policy.cluster});
    // Users' own QOS lists override the account's: keep them in step.
    for (const auto& [key, assoc] : st.users) {
      if (key.first != team.account) continue;
      const auto want = wanted_qos(team, assoc.qos);
      if (assoc.qos != want)
        cmds.push_back({"modify", "user", "where", "name=" + key.second, "account=" + team.account,
                        "cluster=" + policy.cluster, "set", "QOS=" + joined(want)});
    }
  }
  return cmds;
}

std::string shell_line(const std::vector<std::string>& argv) {
  std::string out = "sacctmgr -i";
  for (const auto& a : argv) {
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789=,._-/:+@") == std::string::npos;
    if (plain) {
      out += " " + a;
      continue;
    }
    out += " '";
    for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += "'";
  }
  return out;
}

}  // namespace forge::quota
