// The model registry: every promoted release in one SQLite database (WAL) under the admin's state
// directory, with what made it: run, jobs, team, dataset version, tokenizer, spec, parent model, the
// gate's verdict and where it was exported. A release is known by its directory; registering it again
// updates the entry, never adds another. Names carry versions (name:1, name:2, ...), one per release.
// Only who may write a release's run directory (its team: the group that owns it) registers the release
// or records its export (docs/CHECKPOINTS.md, "Registry").
#pragma once

#include "forge/common/json.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace forge::sqlite {
class Db;
}

namespace forge::ckpt {

#ifndef FORGE_SYSTEM_REGISTRY
#define FORGE_SYSTEM_REGISTRY "/var/lib/forge-registry/registry.db"
#endif

// The system registry (CMake cache variable FORGE_SYSTEM_REGISTRY): the default, and the only registry a
// setgid forge-ckpt uses.
inline constexpr const char* kDefaultRegistry = FORGE_SYSTEM_REGISTRY;

// `given` (--registry) when set, else $FORGE_REGISTRY, else kDefaultRegistry.
std::string registry_path(const std::string& given);

struct Release {
  int64_t id = 0;
  std::string name;
  int64_t version = 0;
  std::string path;    // the release directory, absolute
  std::string source;  // the checkpoint it was promoted from (a child run's init_from may name it)
  std::string team;    // the Slurm account, or given; "" when unknown
  std::string run_dir;
  std::string owner_group;  // the group owning run_dir at registration (a gid when it has no name); "" in
                            // entries from before schema version 2
  std::string objective;    // run.objective; "" when the manifest does not say
  int64_t step = 0;
  std::vector<std::string> train_jobs;  // the run's Slurm jobs (its summary.json)
  std::string promote_job;              // the job that registered it (the gate's), "" outside Slurm
  std::string dataset_version;
  std::string tokenizer_sha256;
  std::string spec_hash;
  std::string parent;                // the checkpoint the run started from (ckpt.init_from); "" for none
  std::optional<int64_t> parent_id;  // that checkpoint's entry, when it is registered
  Json lineage;                      // the manifest's extra.lineage (null for a run from scratch)
  Json verdict;                      // the gate's verdict from the promotion (null when none)
  Json metrics;                      // the verdict's per-domain results (null when none)
  std::string export_path;           // the newest export; "" when never exported
  double registered_unix = 0;
  Json origin;  // a model imported from elsewhere: where from (extra.origin; null for a model trained here)
  std::string image;  // the digest of the image its ranks ran in (extra.image; docs/IMAGES.md); "" for none

  std::string ref() const { return name + ":" + std::to_string(version); }
  Json to_json() const;
};

struct RegisterOptions {
  std::string name;         // "" -> run.name of the release's spec
  std::string team;         // "" -> $SLURM_JOB_ACCOUNT
  std::string promote_job;  // "" -> $SLURM_JOB_ID
};

// One model in a lineage: the release or checkpoint, and what trained it.
struct Generation {
  std::string ref;   // name:version when registered, else ""
  std::string path;  // the checkpoint directory
  std::string run_dir;
  int64_t step = 0;
  std::string objective;
  std::string dataset_version;
  std::string tokenizer_sha256;
  std::string spec_hash;
  bool on_disk = true;  // false: known only from its child's lineage record (run, objective unknown)
  Json origin;          // imported: the directory, model id, revision and file hashes it came from
  std::string image;    // the digest of the image that trained it; "" outside an image (or unknown)

  Json to_json() const;
};

// Whether the calling user may write `dir` (create entries in it): access(2), which checks the real
// user and groups, not a setgid program's group.
bool caller_can_write(const std::string& dir);
// kIo "user U cannot write DIR: only its team (the group that owns it) registers its releases" unless
// caller_can_write(run_dir).
void require_caller_can_write(const std::string& run_dir);
// Whether the calling user may see a release in the registry: root; who may read its directory (its team);
// once the directory is gone, the members of the group that owned it. Another team's entries (names, data,
// gate results, paths) are not listed, shown or exported to them.
bool caller_may_see(const Release& r);

class Registry {
 public:
  enum class Mode { kExisting, kCreate };
  // kCreate creates the file (and its directory) when missing, mode 0660 minus the umask; kExisting fails
  // with kUsage instead, so that reading a mistyped path says so. Every connection keeps the -wal and
  // -shm files when it closes, so that they stay the owner's of the database (root's, for the system
  // registry). An older schema is brought up to date. Throws forge::Error naming the file: kData when it
  // is damaged or newer than this program, kUsage when it is another SQLite database, kIo otherwise.
  Registry(const std::string& path, Mode mode);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  const std::string& path() const { return path_; }

  // Registers the committed release at `release_dir` (kUsage when it is not a release, kData when its
  // manifest is damaged, kIo when the caller cannot write its run directory) and returns its entry. Again for
  // the same directory: the entry keeps its name and version, and gains the jobs, team and verdict it lacked;
  // another --name is kUsage.
  Release add(const std::string& release_dir, const RegisterOptions& options = {});

  std::vector<Release> list() const;  // by name, then version

  // "NAME" (its newest version), "NAME:VERSION", or a directory (the release, or the checkpoint it was
  // promoted from). kUsage naming what is unknown.
  Release find(const std::string& ref) const;
  std::optional<Release> find_path(const std::string& dir) const;

  // Records the release's newest export; kIo when the caller cannot write its run directory.
  void set_export(int64_t id, const std::string& export_path);

  // The model at `checkpoint_dir` and its ancestors back to the run trained from scratch, child first.
  // Registered generations come from the registry, others from their manifests, and those no longer on
  // disk from their child's lineage record.
  std::vector<Generation> lineage(const std::string& checkpoint_dir) const;

 private:
  std::vector<Release> select(const std::string& where, const std::vector<std::string>& params) const;

  std::string path_;
  std::unique_ptr<sqlite::Db> db_;  // forge/common/sqlite.h
};

}  // namespace forge::ckpt
