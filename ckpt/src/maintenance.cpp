#include "forge/ckpt/maintenance.h"

#include "fs.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

namespace forge::ckpt {

namespace fs = std::filesystem;

namespace {

void link_or_copy(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_hard_link(from, to, ec);
  if (!ec) return;
  fs::copy_file(from, to, ec);
  if (ec) fail(ExitCode::kIo, "cannot copy '{}' to '{}': {}", from.string(), to.string(), ec.message());
  const int fd = ::open(to.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ExitCode::kIo, "cannot open '{}' to fsync it", to.string());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(ExitCode::kIo, "fsync of '{}' failed", to.string());
}

}  // namespace

std::string promote(const std::string& checkpoint_dir, const Json& verdict) {
  const Checkpoint src = Checkpoint::open(checkpoint_dir);
  if (src.manifest().tier == tier_name(Tier::kRelease))
    fail(ExitCode::kUsage, "'{}' is a release already", checkpoint_dir);
  src.verify();
  const std::string run = run_dir_of(checkpoint_dir);
  const int64_t step = src.manifest().meta.step;
  const std::string target = ckpt::checkpoint_dir(run, Tier::kRelease, step);
  if (fs::exists(fs::path(target) / kCommittedFile))
    fail(ExitCode::kUsage, "step {} is promoted already: '{}'", step, target);
  const std::string tdir = tier_dir(run, Tier::kRelease);
  std::error_code ec;
  fs::create_directories(tdir, ec);
  if (ec) fail(ExitCode::kIo, "cannot create '{}': {}", tdir, ec.message());
  const std::string staging =
      (fs::path(tdir) / fmt::format(".step-{:08d}.partial-{}", step, detail::random_nonce())).string();
  if (!fs::create_directory(staging, ec) || ec)
    fail(ExitCode::kIo, "cannot create '{}': {}", staging, ec.message());
  auto lock = DirLock::try_exclusive(staging);
  try {
    for (const auto& [name, f] : src.manifest().files)
      link_or_copy(fs::path(checkpoint_dir) / name, fs::path(staging) / name);
    Manifest m = src.manifest();
    m.tier = tier_name(Tier::kRelease);
    m.promotion = Json{{"source", fs::absolute(checkpoint_dir).lexically_normal().string()},
                       {"source_tier", src.manifest().tier},
                       {"verdict", verdict},
                       {"promoted_unix", detail::now_unix()}};
    const std::string manifest = m.to_json().dump(2) + "\n";
    write_file_atomic((fs::path(staging) / kManifestFile).string(), manifest);
    detail::write_new_file((fs::path(staging) / kCommittedFile).string(),
                           detail::committed_text(xxh3_64_hex(manifest)));
    fsync_dir(staging);
    detail::publish_dir(staging, target);
  } catch (...) {
    lock.reset();
    detail::remove_tree(staging);
    throw;
  }
  return target;
}

GcReport collect_garbage(const std::string& run_dir, int recovery_keep, bool dry_run) {
  GcReport report;
  auto dispose = [&](const std::string& path) {
    if (dry_run) {
      if (DirLock::is_locked(path))
        report.in_use.push_back(path);
      else
        report.removed.push_back(path);
      return;
    }
    auto lock = DirLock::try_exclusive(path);
    if (!lock) {
      report.in_use.push_back(path);
      return;
    }
    detail::remove_tree(path);
    report.removed.push_back(path);
  };
  for (Tier t : {Tier::kRecovery, Tier::kMilestone, Tier::kRelease}) {
    const fs::path dir = tier_dir(run_dir, t);
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<std::string> garbage;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      const bool staging = name.rfind(".step-", 0) == 0 && name.find(".partial-") != std::string::npos;
      const bool trash = name.rfind(".trash-", 0) == 0;
      const bool uncommitted = parse_step_dir(name) && !fs::exists(e.path() / kCommittedFile);
      if (staging || trash || uncommitted) garbage.push_back(e.path().string());
    }
    for (const auto& g : garbage) dispose(g);
  }

  std::vector<CkptRef> refs;
  for (const auto& e : list_checkpoints(run_dir))
    refs.push_back(CkptRef{e.tier, e.step, DirLock::is_locked(e.path)});
  std::optional<CkptRef> newest_valid;
  for (const auto& r : resume_order(refs)) {
    try {
      Checkpoint::open(checkpoint_dir(run_dir, r.tier, r.step)).verify();
      newest_valid = r;
      report.newest_valid = checkpoint_dir(run_dir, r.tier, r.step);
      break;
    } catch (const Error&) {
      // Damaged: retention may remove it like any other old one.
    }
  }
  for (const auto& v : retention_victims(refs, recovery_keep, newest_valid)) {
    const std::string path = checkpoint_dir(run_dir, v.tier, v.step);
    if (dry_run)
      report.removed.push_back(path);
    else if (remove_checkpoint(path))
      report.removed.push_back(path);
    else
      report.in_use.push_back(path);
  }
  return report;
}

}  // namespace forge::ckpt
