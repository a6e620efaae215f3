#include "forge/quota/policy.h"

#include "forge/common/error.h"
#include "forge/common/ini.h"
#include "forge/common/text.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace forge::quota {
namespace {

bool is_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  });
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

// Reads one section's entries against a list of allowed keys; errors cite file:line.

class Reader {
 public:
  Reader(const IniSection& section, const std::string& file, std::vector<std::string> allowed,
         std::vector<std::string> prefixes = {})
      : section_(section), file_(file) {
    for (const auto& e : section.entries) {
      const bool known = std::find(allowed.begin(), allowed.end(), e.key) != allowed.end() ||
                         std::any_of(prefixes.begin(), prefixes.end(),
                                     [&](const std::string& p) { return e.key.rfind(p, 0) == 0; });
      if (!known) {
        std::vector<std::string> all = allowed;
        for (const auto& p : prefixes) all.push_back(p + "<name>");
        fail(ExitCode::kUsage, "{}:{}: unknown key '{}' in [{}]; allowed: {}", file, e.line, e.key,
             section.name, join(all));
      }
    }
  }

  const IniEntry* find(const std::string& key) const {
    for (const auto& e : section_.entries)
      if (e.key == key) return &e;
    return nullptr;
  }
  const IniEntry& require(const std::string& key) const {
    const IniEntry* e = find(key);
    if (!e) fail(ExitCode::kUsage, "{}:{}: [{}] needs '{} = ...'", file_, section_.line, section_.name, key);
    return *e;
  }
  [[noreturn]] void bad(const IniEntry& e, const std::string& why) const {
    fail(ExitCode::kUsage, "{}:{}: {} = {}: {}", file_, e.line, e.key, e.value, why);
  }

  std::string name(const std::string& key, const std::string& fallback, bool required = false) const {
    const IniEntry* e = entry(key, required);
    if (!e) return fallback;
    if (!is_name(e->value)) bad(*e, "must be 1-64 letters, digits, '.', '_' or '-'");
    return e->value;
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    const IniEntry* e = find(key);
    if (!e) return fallback;
    if (e->value.empty()) bad(*e, "must not be empty");
    for (unsigned char c : e->value)
      if (c < 0x20 || c == 0x7f) bad(*e, "contains a control character");
    return e->value;
  }
  // The entry for `key`: required ones must be present (error citing the section), others may be null.
  const IniEntry* entry(const std::string& key, bool required) const {
    return required ? &require(key) : find(key);
  }
  int64_t integer(const IniEntry& e, int64_t min, int64_t max) const {
    const auto v = parse_int(e.value);
    if (!v || *v < min || *v > max) bad(e, fmt::format("expected a whole number from {} to {}", min, max));
    return *v;
  }
  int64_t integer(const std::string& key, int64_t fallback, int64_t min, int64_t max,
                  bool required = false) const {
    const IniEntry* e = entry(key, required);
    return e ? integer(*e, min, max) : fallback;
  }
  double number(const IniEntry& e, double min, double max) const {
    char* end = nullptr;
    const double v = e.value.empty() ? NAN : std::strtod(e.value.c_str(), &end);
    if (e.value.empty() || end != e.value.c_str() + e.value.size() || !std::isfinite(v) || v < min || v > max)
      bad(e, fmt::format("expected a number from {} to {}", min, max));
    return v;
  }
  double number(const std::string& key, double fallback, double min, double max,
                bool required = false) const {
    const IniEntry* e = entry(key, required);
    return e ? number(*e, min, max) : fallback;
  }
  bool boolean(const std::string& key, bool fallback) const {
    const IniEntry* e = find(key);
    if (!e) return fallback;
    if (e->value == "true" || e->value == "yes" || e->value == "1") return true;
    if (e->value == "false" || e->value == "no" || e->value == "0") return false;
    bad(*e, "expected true or false");
  }
  const IniSection& section() const { return section_; }

 private:
  const IniSection& section_;
  const std::string& file_;
};

Tier read_tier(const Reader& r, const std::string& name) {
  Tier t;
  t.name = name;
  t.qos = r.name("qos", "", true);
  t.priority = static_cast<int>(r.integer("priority", 0, 0, 1000000));
  t.preemptible = r.boolean("preemptible", false);
  const IniEntry& wall = r.require("max_wall");
  const auto secs = parse_wall_time(wall.value);
  if (!secs || *secs <= 0) r.bad(wall, "expected a wall time like 48:00:00 or 2-00:00:00");
  t.max_wall_s = *secs;
  t.charge = r.number("charge", 1.0, 0.001, 1000.0);
  t.grace_s = static_cast<int>(r.integer("grace_s", 0, 0, 86400));
  return t;
}

// "alice, @ml" -> users and groups; each name is recorded with its line for check-policy.
Principals read_principals(const Reader& r, const IniEntry& e, const std::string& role,
                           const std::string& team, std::vector<PolicyName>& names) {
  Principals p;
  for (const auto& m : split_list(e.value)) {
    const bool group = m[0] == '@';
    const std::string who = group ? m.substr(1) : m;
    if (!is_name(who)) r.bad(e, fmt::format("'{}' is not a user or @group name", m));
    (group ? p.groups : p.users).push_back(who);
    names.push_back({who, group, role, team, e.line});
  }
  return p;
}

std::vector<std::string> read_tier_list(const IniEntry& e, const std::string& file,
                                        const std::map<std::string, Tier>& tiers) {
  const auto list = split_list(e.value);
  for (const auto& tier : list)
    if (!tiers.count(tier)) {
      std::vector<std::string> known;
      for (const auto& [n, _] : tiers) known.push_back(n);
      fail(ExitCode::kUsage, "{}:{}: {} = {}: unknown tier '{}'; defined tiers: {}", file, e.line, e.key,
           e.value, tier, join(known));
    }
  return list;
}

// An absolute directory, lexically normal, without a trailing '/'.
std::string read_directory(const Reader& r, const IniEntry& e) {
  if (e.value.empty() || e.value[0] != '/') r.bad(e, "must be an absolute path");
  for (unsigned char c : e.value)
    if (c < 0x20 || c == 0x7f) r.bad(e, "contains a control character");
  std::filesystem::path p = std::filesystem::path(e.value).lexically_normal();
  if (!p.has_filename() && p != p.root_path()) p = p.parent_path();
  if (p == p.root_path()) r.bad(e, "must be a directory below /");
  return p.string();
}

Team read_team(const Reader& r, const std::string& name, const std::string& file,
               const std::map<std::string, Tier>& tiers, std::vector<PolicyName>& names) {
  Team t;
  t.name = name;
  t.account = r.name("account", "", true);
  const IniEntry& members = r.require("members");
  t.members = read_principals(r, members, "member", name, names);
  if (t.members.empty()) r.bad(members, "list at least one user or @group");
  t.budget_gpu_hours = r.number("budget_gpu_hours", 0, 0, 1e12, true);
  t.max_gpus = static_cast<int>(r.integer("max_gpus", 0, 1, 1000000, true));
  const IniEntry& list = r.require("tiers");
  t.tiers = read_tier_list(list, file, tiers);
  if (t.tiers.empty()) r.bad(list, "list at least one tier");
  if (const IniEntry* e = r.find("approvers")) t.approvers = read_principals(r, *e, "approver", name, names);
  if (const IniEntry* e = r.find("root")) t.root = read_directory(r, *e);
  if (const IniEntry* e = r.find("group")) {
    t.group = r.name("group", "");
    names.push_back({t.group, true, "group", name, e->line});
  }
  return t;
}

// [approval]: thresholds may be empty or 0 (rule off).
ApprovalRules read_approval(const Reader& r, const std::string& file,
                            const std::map<std::string, Tier>& tiers) {
  ApprovalRules a;
  if (const IniEntry* e = r.find("gpus"); e && !e->value.empty())
    a.gpus = static_cast<int>(r.integer(*e, 0, 1048576));
  if (const IniEntry* e = r.find("gpu_hours"); e && !e->value.empty()) a.gpu_hours = r.number(*e, 0, 1e12);
  if (const IniEntry* e = r.find("tiers")) a.tiers = read_tier_list(*e, file, tiers);
  if (const IniEntry* e = r.find("ttl")) {
    const auto secs = parse_wall_time(e->value);
    if (!secs || *secs <= 0 || *secs > 366LL * 86400)
      r.bad(*e, "expected a duration up to a year like 7-00:00:00 or 12:00:00");
    a.ttl_s = *secs;
  }
  if (const IniEntry* e = r.find("checker")) {
    if (e->value.empty() || e->value[0] != '/') r.bad(*e, "must be an absolute path");
    a.checker = r.text("checker", a.checker);
  }
  if (const IniEntry* e = r.find("controller")) {
    if (!is_name(e->value)) r.bad(*e, "expected the user name slurmctld runs as (SlurmUser)");
    a.controller = e->value;
  }
  return a;
}

}  // namespace

bool Team::allows_tier(const std::string& tier) const {
  return std::find(tiers.begin(), tiers.end(), tier) != tiers.end();
}

bool Principals::includes(const std::string& user, const std::vector<std::string>& user_groups) const {
  if (std::find(users.begin(), users.end(), user) != users.end()) return true;
  return std::any_of(groups.begin(), groups.end(), [&](const std::string& g) {
    return std::find(user_groups.begin(), user_groups.end(), g) != user_groups.end();
  });
}

std::string Principals::text() const {
  std::vector<std::string> all = users;
  for (const auto& g : groups) all.push_back("@" + g);
  return all.empty() ? "none" : fmt::format("{}", fmt::join(all, ", "));
}

bool Team::has_member(const std::string& user, const std::vector<std::string>& user_groups) const {
  return members.includes(user, user_groups);
}

bool Team::has_approver(const std::string& user, const std::vector<std::string>& user_groups) const {
  return approvers.includes(user, user_groups);
}

bool Pool::allows_tier(const std::string& tier) const {
  return std::find(tiers.begin(), tiers.end(), tier) != tiers.end();
}

double Prices::per_gpu_hour(const std::string& partition_name, const std::string& gpu_type_name) const {
  if (const auto it = gpu_type.find(gpu_type_name); !gpu_type_name.empty() && it != gpu_type.end())
    return it->second;
  if (const auto it = partition.find(partition_name); it != partition.end()) return it->second;
  return default_per_gpu_hour;
}

int Topology::switches_for(int gpus) const {
  for (const auto& rule : max_switches)
    if (gpus <= rule.max_gpus) return rule.max_switches;
  return 0;
}

const Team* Policy::team(const std::string& name) const {
  const auto it = teams.find(name);
  return it == teams.end() ? nullptr : &it->second;
}
const Tier* Policy::tier(const std::string& name) const {
  const auto it = tiers.find(name);
  return it == tiers.end() ? nullptr : &it->second;
}
const Tier* Policy::tier_by_qos(const std::string& qos) const {
  for (const auto& [_, t] : tiers)
    if (t.qos == qos) return &t;
  return nullptr;
}
const Team* Policy::team_by_account(const std::string& account) const {
  for (const auto& [_, t] : teams)
    if (t.account == account) return &t;
  return nullptr;
}
bool Policy::is_admin(const Identity& who) const {
  return admins.includes(who.user, who.groups);
}
bool Policy::sees_team(const Identity& who, const Team& t) const {
  return is_admin(who) || t.has_member(who.user, who.groups) || t.has_approver(who.user, who.groups);
}
const Pool* Policy::pool_for_tier(const std::string& tier_name) const {
  for (const auto& p : pools)
    if (p.allows_tier(tier_name)) return &p;
  return nullptr;
}
const Pool* Policy::pool_by_partition(const std::string& partition) const {
  for (const auto& p : pools)
    if (p.partition == partition) return &p;
  return nullptr;
}
std::string Policy::tier_names() const {
  std::vector<std::string> n;
  for (const auto& [k, _] : tiers) n.push_back(k);
  return join(n);
}
std::string Policy::team_names() const {
  std::vector<std::string> n;
  for (const auto& [k, _] : teams) n.push_back(k);
  return join(n);
}

bool path_within(const std::string& inner, const std::string& outer) {
  const std::filesystem::path i(inner), o(outer);
  auto it = i.begin();
  for (const auto& part : o) {
    if (it == i.end() || *it != part) return false;
    ++it;
  }
  return true;
}

std::optional<int64_t> parse_wall_time(const std::string& text) {
  // Slurm's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
  if (text.empty() || text.size() > 32) return std::nullopt;
  int64_t days = 0;
  std::string rest = text;
  const auto dash = text.find('-');
  const auto number = [](const std::string& s) -> std::optional<int64_t> {
    const auto v = parse_int(s);
    return v && *v >= 0 ? v : std::nullopt;
  };
  if (dash != std::string::npos) {
    const auto d = number(text.substr(0, dash));
    if (!d) return std::nullopt;
    days = *d;
    rest = text.substr(dash + 1);
  }
  const auto parts = split_list(rest, ':');
  if (parts.empty() || parts.size() > 3 ||
      std::count(rest.begin(), rest.end(), ':') + 1 != (long)parts.size())
    return std::nullopt;
  std::vector<int64_t> v;
  for (const auto& p : parts) {
    const auto n = number(p);
    if (!n) return std::nullopt;
    v.push_back(*n);
  }
  int64_t h = 0, m = 0, s = 0;
  if (dash != std::string::npos) {
    h = v[0];
    m = v.size() > 1 ? v[1] : 0;
    s = v.size() > 2 ? v[2] : 0;
  } else if (v.size() == 1) {
    m = v[0];
  } else if (v.size() == 2) {
    m = v[0], s = v[1];
  } else {
    h = v[0], m = v[1], s = v[2];
  }
  return ((days * 24 + h) * 60 + m) * 60 + s;
}

std::string format_wall_time(int64_t seconds) {
  const int64_t d = seconds / 86400, h = seconds / 3600 % 24, m = seconds / 60 % 60, s = seconds % 60;
  return d > 0 ? fmt::format("{}-{:02}:{:02}:{:02}", d, h, m, s) : fmt::format("{:02}:{:02}:{:02}", h, m, s);
}

std::string format_hours(int64_t seconds) {
  return fmt::format("{}:{:02}:{:02}", seconds / 3600, seconds / 60 % 60, seconds % 60);
}

const char* period_name(Period p) {
  switch (p) {
    case Period::kMonth:
      return "month";
    case Period::kQuarter:
      return "quarter";
    case Period::kYear:
      return "year";
  }
  return "month";
}

std::pair<int64_t, int64_t> period_bounds(Period p, int64_t now) {
  const time_t t = static_cast<time_t>(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  int first_month = tm.tm_mon, months = 1;
  if (p == Period::kQuarter) first_month = tm.tm_mon / 3 * 3, months = 3;
  if (p == Period::kYear) first_month = 0, months = 12;
  std::tm start{};
  start.tm_year = tm.tm_year;
  start.tm_mon = first_month;
  start.tm_mday = 1;
  std::tm end = start;
  end.tm_mon += months;  // timegm normalises month overflow into the next year
  return {static_cast<int64_t>(timegm(&start)), static_cast<int64_t>(timegm(&end))};
}

Policy load_policy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ExitCode::kUsage, "cannot read policy file '{}': check the path and permissions", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_policy(text.str(), path);
}

Policy parse_policy(const std::string& text, const std::string& file) {
  const auto sections = parse_ini(text, file);
  Policy p;
  p.path = file;
  p.cluster = "";
  p.ledger_path = "/var/lib/forge-quota/ledger.db";
  p.snapshot_path = "/var/lib/forge-quota/usage.json";

  // Tiers first: teams refer to them.
  for (const auto& s : sections) {
    if (s.name.rfind("tier.", 0) != 0) continue;
    const std::string name = s.name.substr(5);
    if (!is_name(name))
      fail(ExitCode::kUsage, "{}:{}: [{}]: a tier name is 1-64 letters, digits, '.', '_' or '-'", file,
           s.line, s.name);
    Reader r(s, file, {"qos", "priority", "preemptible", "max_wall", "charge", "grace_s"});
    Tier t = read_tier(r, name);
    for (const auto& [other, o] : p.tiers)
      if (o.qos == t.qos)
        fail(ExitCode::kUsage, "{}:{}: qos = {}: tier '{}' already uses that QOS; give each tier its own",
             file, r.require("qos").line, t.qos, other);
    p.tiers.emplace(name, std::move(t));
  }
  bool saw_policy = false;
  for (const auto& s : sections) {
    if (s.name == "policy") {
      saw_policy = true;
      Reader r(s, file,
               {"cluster", "period", "ledger", "snapshot", "snapshot_max_age_s", "runs", "default_wall",
                "admins"});
      p.cluster = r.name("cluster", "", true);
      if (const IniEntry* e = r.find("period")) {
        if (e->value == "month")
          p.period = Period::kMonth;
        else if (e->value == "quarter")
          p.period = Period::kQuarter;
        else if (e->value == "year")
          p.period = Period::kYear;
        else
          r.bad(*e, "must be one of: month, quarter, year");
      }
      p.ledger_path = r.text("ledger", p.ledger_path);
      p.snapshot_path = r.text("snapshot", p.snapshot_path);
      p.snapshot_max_age_s = r.integer("snapshot_max_age_s", 900, 1, 366LL * 86400);
      if (const IniEntry* e = r.find("runs")) p.runs_dirs = split_list(e->value);
      if (const IniEntry* e = r.find("default_wall")) {
        const auto secs = parse_wall_time(e->value);
        if (!secs || *secs <= 0) r.bad(*e, "expected a wall time like 1:00:00");
        p.default_wall_s = *secs;
      }
      if (const IniEntry* e = r.find("admins")) p.admins = read_principals(r, *e, "admin", "", p.names);
    } else if (s.name.rfind("team.", 0) == 0) {
      const std::string name = s.name.substr(5);
      if (!is_name(name))
        fail(ExitCode::kUsage, "{}:{}: [{}]: a team name is 1-64 letters, digits, '.', '_' or '-'", file,
             s.line, s.name);
      Reader r(s, file,
               {"members", "account", "budget_gpu_hours", "max_gpus", "tiers", "approvers", "root", "group"});
      Team t = read_team(r, name, file, p.tiers, p.names);
      for (const auto& [other, o] : p.teams) {
        if (o.account == t.account)
          fail(ExitCode::kUsage, "{}:{}: account = {}: team '{}' already uses that account", file,
               r.require("account").line, t.account, other);
        // Nested or shared roots would let one team's jobs write into the other's directory.
        if (!t.root.empty() && !o.root.empty() &&
            (path_within(t.root, o.root) || path_within(o.root, t.root)))
          r.bad(*r.find("root"),
                fmt::format("overlaps team '{}''s root {}; give each team its own", other, o.root));
      }
      p.teams.emplace(name, std::move(t));
    } else if (s.name == "approval") {
      Reader r(s, file, {"gpus", "gpu_hours", "tiers", "ttl", "checker", "controller"});
      p.approval = read_approval(r, file, p.tiers);
    } else if (s.name.rfind("pool.", 0) == 0) {
      Pool pool;
      pool.name = s.name.substr(5);
      if (!is_name(pool.name))
        fail(ExitCode::kUsage, "{}:{}: [{}]: a pool name is 1-64 letters, digits, '.', '_' or '-'", file,
             s.line, s.name);
      Reader r(s, file, {"partition", "tiers"});
      pool.partition = r.name("partition", "", true);
      if (const IniEntry* e = r.find("tiers")) pool.tiers = read_tier_list(*e, file, p.tiers);
      if (const Pool* other = p.pool_by_partition(pool.partition))
        r.bad(r.require("partition"),
              fmt::format("pool '{}' already uses that partition; give each pool its own", other->name));
      p.pools.push_back(std::move(pool));
    } else if (s.name == "prices") {
      Reader r(s, file, {"default"}, {"partition.", "gpu_type."});
      p.prices.default_per_gpu_hour = r.number("default", 0, 0, 1e9);
      for (const auto& e : s.entries) {
        const bool part = e.key.rfind("partition.", 0) == 0;
        if (e.key == "default") continue;
        const std::string what = e.key.substr(part ? 10 : 9);
        if (!is_name(what)) r.bad(e, "the name after the dot must be a partition or GPU type name");
        (part ? p.prices.partition : p.prices.gpu_type)[what] = r.number(e, 0, 1e9);
      }
    } else if (s.name == "topology") {
      Reader r(s, file, {"gpus_per_node", "tp_within_node", "pp_align_nodes", "max_switches"});
      p.topology.gpus_per_node = static_cast<int>(r.integer("gpus_per_node", 8, 1, 1024, true));
      p.topology.tp_within_node = r.boolean("tp_within_node", true);
      p.topology.pp_align_nodes = r.boolean("pp_align_nodes", true);
      if (const IniEntry* e = r.find("max_switches")) {
        for (const auto& item : split_list(e->value)) {
          const auto colon = item.find(':');
          IniEntry a{e->key, colon == std::string::npos ? item : item.substr(0, colon), e->line};
          IniEntry b{e->key, colon == std::string::npos ? "" : item.substr(colon + 1), e->line};
          if (colon == std::string::npos) r.bad(*e, fmt::format("'{}': expected GPUS:SWITCHES", item));
          SwitchRule rule{static_cast<int>(r.integer(a, 1, 1000000)),
                          static_cast<int>(r.integer(b, 1, 4096))};
          if (!p.topology.max_switches.empty() && rule.max_gpus <= p.topology.max_switches.back().max_gpus)
            r.bad(*e, "list the rules by increasing GPU count");
          p.topology.max_switches.push_back(rule);
        }
      }
    } else if (s.name.rfind("tier.", 0) != 0) {
      fail(ExitCode::kUsage,
           "{}:{}: unknown section [{}]; allowed: [policy], [tier.<name>], [team.<name>], [approval], "
           "[pool.<name>], [prices], [topology]",
           file, s.line, s.name);
    }
  }
  if (!saw_policy)
    fail(ExitCode::kUsage, "{}: missing [policy] section (it needs at least 'cluster = ...')", file);
  if (p.tiers.empty()) fail(ExitCode::kUsage, "{}: no [tier.<name>] section: define at least one tier", file);
  if (p.teams.empty()) fail(ExitCode::kUsage, "{}: no [team.<name>] section: define at least one team", file);
  return p;
}

}  // namespace forge::quota
