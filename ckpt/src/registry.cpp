#include "forge/ckpt/registry.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"
#include "forge/common/sqlite.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <vector>

namespace forge::ckpt {

namespace fs = std::filesystem;

namespace {

// 1: the first; 2: owner_group; 3: origin; 4: image.
constexpr int kSchemaVersion = 4;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS releases (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, version INTEGER NOT NULL, path TEXT NOT NULL UNIQUE,
  source TEXT NOT NULL, team TEXT NOT NULL, run_dir TEXT NOT NULL, objective TEXT NOT NULL,
  step INTEGER NOT NULL, train_jobs TEXT NOT NULL, promote_job TEXT NOT NULL, dataset_version TEXT NOT NULL,
  tokenizer_sha256 TEXT NOT NULL, spec_hash TEXT NOT NULL, parent TEXT NOT NULL,
  parent_id INTEGER REFERENCES releases(id), lineage TEXT NOT NULL, verdict TEXT NOT NULL,
  metrics TEXT NOT NULL, export_path TEXT NOT NULL, registered_unix REAL NOT NULL,
  owner_group TEXT NOT NULL DEFAULT '', origin TEXT NOT NULL DEFAULT 'null', image TEXT NOT NULL DEFAULT '',
  UNIQUE (name, version));
CREATE INDEX IF NOT EXISTS releases_source ON releases(source);
CREATE INDEX IF NOT EXISTS releases_parent ON releases(parent);
)sql";

constexpr const char* kColumns =
    "id,name,version,path,source,team,run_dir,objective,step,train_jobs,promote_job,dataset_version,"
    "tokenizer_sha256,spec_hash,parent,parent_id,lineage,verdict,metrics,export_path,registered_unix,owner_"
    "group,origin,image";

// How the registry's SQLite failures read (forge/common/sqlite.h): a damaged file is kData, the rest kIo.
sqlite::Errors registry_errors() {
  sqlite::Errors e;
  e.noun = "registry";
  e.code = ExitCode::kIo;
  e.damaged_hint =
      "restore it from a backup, or move it aside and register the releases again (forge-ckpt registry add)";
  e.access_hint = "check its permissions, or name another with --registry or FORGE_REGISTRY";
  return e;
}

using sqlite::Stmt;
using sqlite::Transaction;

// A JSON column; a value that does not parse is a damaged registry.
Json json_column(const Stmt& s, int c, const std::string& path) {
  try {
    return Json::parse(s.text(c));
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "registry '{}' is damaged: column {} holds no JSON ({})", path, s.column_name(c),
         e.what());
  }
}

// Paths are compared as the launcher records them (lineage.parent, promotion.source): absolute and
// lexically normal, without a trailing separator.
std::string normal_path(const std::string& p) {
  fs::path n = fs::absolute(p).lexically_normal();
  if (!n.has_filename() && n.has_parent_path() && n != n.root_path()) n = n.parent_path();
  return n.string();
}

std::string str(const Json& j, const char* key) {
  if (!j.is_object()) return "";
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The run's Slurm jobs from its summary.json (forge-train: the last job, and every segment's); none when
// it is missing or damaged.
std::vector<std::string> train_jobs(const std::string& run_dir) {
  std::vector<std::string> jobs;
  const fs::path file = fs::path(run_dir) / "summary.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return jobs;
  auto add = [&](const Json& id) {
    std::string job = id.is_string() ? id.get<std::string>() : id.is_number_integer() ? id.dump() : "";
    if (!job.empty() && std::find(jobs.begin(), jobs.end(), job) == jobs.end()) jobs.push_back(job);
  };
  try {
    const Json s = read_json(file.string());
    if (s.contains("segments") && s.at("segments").is_array())
      for (const Json& g : s.at("segments"))
        if (g.is_object() && g.contains("job_id")) add(g.at("job_id"));
    if (s.contains("job_id")) add(s.at("job_id"));
  } catch (const std::exception&) {
    // A damaged summary costs the entry its job ids only.
  }
  return jobs;
}

void check_name(const std::string& name) {
  if (name.empty() || name.find_first_of(":/ \t\n") != std::string::npos)
    fail(ExitCode::kUsage,
         "model name '{}' is not usable in NAME:VERSION: give a non-empty name without ':', '/' or spaces "
         "(--name)",
         name);
}

Generation generation_of(const Release& r) {
  return Generation{
      r.ref(),     r.path, r.run_dir, r.step, r.objective, r.dataset_version, r.tokenizer_sha256,
      r.spec_hash, true,   r.origin,  r.image};
}

// The directory whose writers own a checkpoint: its run's, or, for a model imported from elsewhere (which
// no run trained), the checkpoint directory itself.
std::string owner_dir(const std::string& path, const Manifest& m) {
  return m.meta.extra.contains("origin") ? path : run_dir_of(path);
}

// The name of the group that owns `dir`, or its gid when it has none; "" when `dir` cannot be examined.
std::string owner_group_of(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "";
  std::vector<char> buf(16384);
  struct group g {};
  struct group* found = nullptr;
  if (::getgrgid_r(st.st_gid, &g, buf.data(), buf.size(), &found) == 0 && found) return found->gr_name;
  return std::to_string(st.st_gid);
}

std::string user_name(uid_t uid) {
  std::vector<char> buf(16384);
  struct passwd p {};
  struct passwd* found = nullptr;
  if (::getpwuid_r(uid, &p, buf.data(), buf.size(), &found) == 0 && found) return found->pw_name;
  return "uid " + std::to_string(uid);
}

std::optional<Manifest> read_manifest(const std::string& dir) {
  const fs::path file = fs::path(dir) / kManifestFile;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  try {
    return Manifest::from_json(read_json(file.string()), file.string());
  } catch (const Error&) {
    return std::nullopt;  // then what the child recorded of it
  }
}

}  // namespace

bool caller_can_write(const std::string& dir) {
  return ::access(dir.c_str(), W_OK | X_OK) == 0;
}

bool caller_may_see(const Release& r) {
  if (::getuid() == 0 || ::access(r.path.c_str(), R_OK | X_OK) == 0) return true;
  if (errno != ENOENT || r.owner_group.empty()) return false;
  const group* g = ::getgrnam(r.owner_group.c_str());
  if (!g) return false;
  return g->gr_gid == ::getgid() || ::group_member(g->gr_gid) != 0;
}

void require_caller_can_write(const std::string& run_dir) {
  if (!caller_can_write(run_dir))
    fail(ExitCode::kIo,
         "user {} cannot write {}: only its team (the group that owns it) registers its releases",
         user_name(::getuid()), run_dir);
}

std::string registry_path(const std::string& given) {
  if (!given.empty()) return given;
  const std::string from_env = env("FORGE_REGISTRY");
  return from_env.empty() ? kDefaultRegistry : from_env;
}

Json Release::to_json() const {
  return Json{{"ref", ref()},
              {"id", id},
              {"name", name},
              {"version", version},
              {"path", path},
              {"source", source},
              {"team", team},
              {"run_dir", run_dir},
              {"owner_group", owner_group},
              {"objective", objective},
              {"step", step},
              {"train_jobs", train_jobs},
              {"promote_job", promote_job},
              {"dataset_version", dataset_version},
              {"tokenizer_sha256", tokenizer_sha256},
              {"spec_hash", spec_hash},
              {"parent", parent},
              {"parent_id", parent_id ? Json(*parent_id) : Json(nullptr)},
              {"lineage", lineage},
              {"verdict", verdict},
              {"metrics", metrics},
              {"export_path", export_path},
              {"registered_unix", registered_unix},
              {"origin", origin},
              {"image", image}};
}

Json Generation::to_json() const {
  return Json{{"ref", ref},
              {"path", path},
              {"run_dir", run_dir},
              {"step", step},
              {"objective", objective},
              {"dataset_version", dataset_version},
              {"tokenizer_sha256", tokenizer_sha256},
              {"spec_hash", spec_hash},
              {"on_disk", on_disk},
              {"origin", origin},
              {"image", image}};
}

Registry::Registry(const std::string& path, Mode mode) : path_(path) {
  std::error_code ec;
  if (mode == Mode::kExisting && !fs::exists(path, ec))
    fail(ExitCode::kUsage,
         "no registry at '{}': nothing was registered there (name another with --registry or FORGE_REGISTRY)",
         path);
  const fs::path dir = fs::path(path).parent_path();
  if (mode == Mode::kCreate && !dir.empty() && !fs::is_directory(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec)
      fail(ExitCode::kIo,
           "cannot create the registry directory '{}': {} (an admin creates the system registry's: "
           "docs/CHECKPOINTS.md, \"Registry\"; or name another registry with --registry or FORGE_REGISTRY)",
           dir.string(), ec.message());
  }
  // The system registry is a group's (root:forge-registry 2770), written through the setgid forge-ckpt.
  db_ = sqlite::open_shared(path,
                            mode == Mode::kCreate ? sqlite::Db::Mode::kCreate : sqlite::Db::Mode::kExisting,
                            registry_errors());
  auto user_version = [&] {
    Stmt v(*db_, "PRAGMA user_version");
    return v.step() ? v.integer(0) : 0;
  };
  const int64_t version = user_version();
  if (version > kSchemaVersion)
    fail(ExitCode::kData,
         "registry '{}' has schema version {}; this forge-ckpt knows version {} and below: use a newer one",
         path_, version, kSchemaVersion);
  if (version == 0) {
    // Not ours yet: an empty file becomes a registry; another program's database (the quota ledger
    // given by mistake) is left alone.
    Stmt t(*db_, "SELECT count(*) FROM sqlite_master WHERE name <> 'releases'");
    if (t.step() && t.integer(0) > 0)
      fail(ExitCode::kUsage,
           "'{}' is another SQLite database, not a model registry: name the registry's file", path_);
  }
  if (version == kSchemaVersion) return;
  // Create or bring up to date under the write lock, so that two first connections do not both alter.
  Transaction tx(*db_);
  const int64_t now = user_version();
  if (now < kSchemaVersion) {
    db_->exec(kSchema, "schema");  // an older table stays as it was: it gains the newer columns
    const auto has_column = [&](const char* name) {
      Stmt cols(*db_, "PRAGMA table_info(releases)");
      bool found = false;
      while (cols.step()) found = found || cols.text(1) == name;
      return found;
    };
    if (!has_column("owner_group"))
      db_->exec("ALTER TABLE releases ADD COLUMN owner_group TEXT NOT NULL DEFAULT ''", "schema upgrade");
    if (!has_column("origin"))
      db_->exec("ALTER TABLE releases ADD COLUMN origin TEXT NOT NULL DEFAULT 'null'", "schema upgrade");
    if (!has_column("image"))
      db_->exec("ALTER TABLE releases ADD COLUMN image TEXT NOT NULL DEFAULT ''", "schema upgrade");
    db_->exec(fmt::format("PRAGMA user_version={}", kSchemaVersion), "schema version");
  }
  tx.commit();
}

Registry::~Registry() = default;

std::vector<Release> Registry::select(const std::string& where,
                                      const std::vector<std::string>& params) const {
  Stmt s(*db_, fmt::format("SELECT {} FROM releases {}", kColumns, where));
  for (size_t i = 0; i < params.size(); ++i) s.bind(static_cast<int>(i + 1), params[i]);
  std::vector<Release> out;
  while (s.step()) {
    Release r;
    r.id = s.integer(0);
    r.name = s.text(1);
    r.version = s.integer(2);
    r.path = s.text(3);
    r.source = s.text(4);
    r.team = s.text(5);
    r.run_dir = s.text(6);
    r.objective = s.text(7);
    r.step = s.integer(8);
    const Json jobs = json_column(s, 9, path_);
    if (jobs.is_array())
      for (const Json& j : jobs)
        if (j.is_string()) r.train_jobs.push_back(j.get<std::string>());
    r.promote_job = s.text(10);
    r.dataset_version = s.text(11);
    r.tokenizer_sha256 = s.text(12);
    r.spec_hash = s.text(13);
    r.parent = s.text(14);
    if (!s.is_null(15)) r.parent_id = s.integer(15);
    r.lineage = json_column(s, 16, path_);
    r.verdict = json_column(s, 17, path_);
    r.metrics = json_column(s, 18, path_);
    r.export_path = s.text(19);
    r.registered_unix = s.real(20);
    r.owner_group = s.text(21);
    r.origin = json_column(s, 22, path_);
    r.image = s.text(23);
    out.push_back(std::move(r));
  }
  return out;
}

Release Registry::add(const std::string& release_dir, const RegisterOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(release_dir, ec)) fail(ExitCode::kUsage, "no release directory '{}'", release_dir);
  const std::string path = normal_path(release_dir);
  const Checkpoint c = Checkpoint::open(path);
  const Manifest& m = c.manifest();
  if (m.tier != tier_name(Tier::kRelease))
    fail(ExitCode::kUsage,
         "'{}' is a {} checkpoint, not a release: promote it first (forge-ckpt promote CKPT --verdict FILE)",
         release_dir, m.tier);
  const Json spec = m.meta.extra.value("spec", Json::object());

  Release r;
  r.path = path;
  r.source = str(m.promotion, "source");
  r.origin = m.meta.extra.value("origin", Json());
  r.run_dir = owner_dir(path, m);
  require_caller_can_write(r.run_dir);
  r.owner_group = owner_group_of(r.run_dir);
  r.name = !options.name.empty() ? options.name : str(spec, "run.name");
  if (r.name.empty()) r.name = fs::path(r.run_dir).filename().string();
  check_name(r.name);
  r.team = !options.team.empty() ? options.team : env("SLURM_JOB_ACCOUNT");
  r.promote_job = !options.promote_job.empty() ? options.promote_job : env("SLURM_JOB_ID");
  r.objective = str(spec, "run.objective");
  r.step = m.meta.step;
  r.train_jobs = train_jobs(r.run_dir);
  r.dataset_version = m.meta.dataset_version;
  r.tokenizer_sha256 = str(m.meta.extra, "tokenizer_sha256");
  r.spec_hash = m.meta.spec_hash;
  r.lineage = m.meta.extra.value("lineage", Json());
  r.image = str(m.meta.extra, "image");
  if (const std::string parent = str(r.lineage, "parent"); !parent.empty()) r.parent = normal_path(parent);
  r.verdict = m.promotion.is_object() ? m.promotion.value("verdict", Json()) : Json();
  if (r.verdict.is_object() && r.verdict.contains("domains")) r.metrics = r.verdict.at("domains");
  r.registered_unix = now_unix();

  Transaction tx(*db_);
  if (!r.parent.empty())
    if (const auto parent = find_path(r.parent); parent && parent->path != r.path) r.parent_id = parent->id;
  const auto existing = select("WHERE path = ?1", {r.path});
  if (!existing.empty()) {
    // The same release again (a retried gate job, or promote's registration followed by `add`): keep its
    // identity and what was known of it.
    const Release& old = existing.front();
    if (!options.name.empty() && options.name != old.name)
      fail(ExitCode::kUsage, "'{}' is registered already as {}: it cannot also be '{}'", release_dir,
           old.ref(), options.name);
    r.id = old.id;
    r.name = old.name;
    r.version = old.version;
    if (options.team.empty() && !old.team.empty()) r.team = old.team;
    if (options.promote_job.empty() && !old.promote_job.empty()) r.promote_job = old.promote_job;
    for (const auto& j : old.train_jobs)
      if (std::find(r.train_jobs.begin(), r.train_jobs.end(), j) == r.train_jobs.end())
        r.train_jobs.insert(r.train_jobs.begin(), j);
    if (!r.parent_id) r.parent_id = old.parent_id;
    r.export_path = old.export_path;
    r.registered_unix = old.registered_unix;
  } else {
    Stmt v(*db_, "SELECT COALESCE(MAX(version), 0) + 1 FROM releases WHERE name = ?1");
    v.bind(1, r.name);
    r.version = v.step() ? v.integer(0) : 1;
  }
  Stmt up(*db_,
          "INSERT INTO releases (name,version,path,source,team,run_dir,objective,step,train_jobs,promote_job,"
          "dataset_version,tokenizer_sha256,spec_hash,parent,parent_id,lineage,verdict,metrics,export_path,"
          "registered_unix,owner_group,origin,image) VALUES "
          "(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,"
          "?18,?19,?20,?21,?22,?23) ON CONFLICT(path) DO UPDATE SET "
          "source=?4,team=?5,run_dir=?6,objective=?7,step=?8,"
          "train_jobs=?9,promote_job=?10,dataset_version=?11,tokenizer_sha256=?12,spec_hash=?13,parent=?14,"
          "parent_id=?15,lineage=?16,verdict=?17,metrics=?18,owner_group=?21,origin=?22,image=?23");
  up.bind(1, r.name).bind(2, r.version).bind(3, r.path).bind(4, r.source).bind(5, r.team).bind(6, r.run_dir);
  up.bind(7, r.objective).bind(8, r.step).bind(9, Json(r.train_jobs).dump()).bind(10, r.promote_job);
  up.bind(11, r.dataset_version).bind(12, r.tokenizer_sha256).bind(13, r.spec_hash).bind(14, r.parent);
  up.bind(15, r.parent_id).bind(16, r.lineage.dump()).bind(17, r.verdict.dump()).bind(18, r.metrics.dump());
  up.bind(19, r.export_path).bind(20, r.registered_unix).bind(21, r.owner_group).bind(22, r.origin.dump());
  up.bind(23, r.image);
  up.step();
  // Children registered before their parent get their link now.
  Stmt link(*db_,
            "UPDATE releases SET parent_id = (SELECT id FROM releases WHERE path = ?1) "
            "WHERE parent_id IS NULL AND parent <> '' AND parent IN (?1, ?2) AND path <> ?1");
  link.bind(1, r.path).bind(2, r.source.empty() ? r.path : normal_path(r.source));
  link.step();
  tx.commit();
  return select("WHERE path = ?1", {r.path}).front();
}

std::vector<Release> Registry::list() const {
  return select("ORDER BY name, version", {});
}

std::optional<Release> Registry::find_path(const std::string& dir) const {
  const std::string p = normal_path(dir);
  auto found = select("WHERE path = ?1 OR source = ?1 ORDER BY path = ?1 DESC, id DESC LIMIT 1", {p});
  if (found.empty()) return std::nullopt;
  return std::move(found.front());
}

Release Registry::find(const std::string& ref) const {
  if (ref.find('/') != std::string::npos) {
    if (auto r = find_path(ref)) return *r;
    fail(ExitCode::kUsage, "'{}' is not a registered release in '{}' (forge-ckpt registry add RELEASE_DIR)",
         ref, path_);
  }
  std::string name = ref;
  std::optional<int64_t> version;
  if (const auto colon = ref.rfind(':'); colon != std::string::npos) {
    name = ref.substr(0, colon);
    const std::string v = ref.substr(colon + 1);
    char* end = nullptr;
    const long long n = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 1)
      fail(ExitCode::kUsage, "'{}': give NAME, NAME:VERSION with a version from 1, or a path with a '/'",
           ref);
    version = n;
  }
  auto all = select("WHERE name = ?1 ORDER BY version DESC", {name});
  if (all.empty())
    fail(ExitCode::kUsage, "no model '{}' in registry '{}' (forge-ckpt registry list shows what is there)",
         name, path_);
  if (!version) return all.front();
  for (auto& r : all)
    if (r.version == *version) return std::move(r);
  fail(ExitCode::kUsage, "no version {} of '{}' in registry '{}' (the newest is {})", *version, name, path_,
       all.front().ref());
}

void Registry::set_export(int64_t id, const std::string& export_path) {
  const auto entry = select("WHERE id = ?1", {std::to_string(id)});
  if (entry.empty()) fail(ExitCode::kUsage, "no release with id {} in registry '{}'", id, path_);
  require_caller_can_write(entry.front().run_dir);
  Stmt s(*db_, "UPDATE releases SET export_path = ?1 WHERE id = ?2");
  s.bind(1, normal_path(export_path)).bind(2, id);
  s.step();
}

std::vector<Generation> Registry::lineage(const std::string& checkpoint_dir) const {
  std::vector<Generation> out;
  std::set<std::string> seen;
  std::string path = normal_path(checkpoint_dir);
  std::optional<Release> release = find_path(path);
  Json record;  // what the child recorded of `path` (its lineage), for a parent that is gone
  while (!path.empty()) {
    if (!seen.insert(path).second)
      fail(ExitCode::kData, "the lineage of '{}' comes back to '{}': a manifest's lineage is damaged",
           checkpoint_dir, path);
    Generation g;
    Json next;
    if (release) {
      g = generation_of(*release);
      next = release->lineage;
    } else if (const auto m = read_manifest(path)) {
      const Json spec = m->meta.extra.value("spec", Json::object());
      g = Generation{"",
                     path,
                     owner_dir(path, *m),
                     m->meta.step,
                     str(spec, "run.objective"),
                     m->meta.dataset_version,
                     str(m->meta.extra, "tokenizer_sha256"),
                     m->meta.spec_hash,
                     true,
                     m->meta.extra.value("origin", Json()),
                     str(m->meta.extra, "image")};
      next = m->meta.extra.value("lineage", Json());
    } else if (record.is_object()) {
      g.path = path;
      g.run_dir = run_dir_of(path);
      g.step = record.value("parent_step", int64_t{0});
      g.dataset_version = str(record, "parent_dataset_version");
      g.spec_hash = str(record, "parent_spec_hash");
      g.on_disk = false;
      next = record.value("parent_lineage", Json());
    } else {
      fail(ExitCode::kUsage, "'{}' is neither a registered release in '{}' nor a checkpoint (no {})",
           checkpoint_dir, path_, kManifestFile);
    }
    // A registered release links its parent's entry; otherwise the parent may be registered all the same.
    const int64_t parent_id = release ? release->parent_id.value_or(0) : 0;  // ids start at 1
    out.push_back(std::move(g));
    const std::string parent = str(next, "parent");
    path = parent.empty() ? "" : normal_path(parent);
    record = next;
    release.reset();
    if (parent_id > 0) {
      auto by_id = select("WHERE id = ?1", {std::to_string(parent_id)});
      if (!by_id.empty()) release = std::move(by_id.front());
    }
    if (!release && !path.empty()) release = find_path(path);
  }
  return out;
}

}  // namespace forge::ckpt
