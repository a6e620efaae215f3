// The model registry: registration from a release's manifest, idempotence, versions per name, lineage
// through registered and unregistered parents, the exit codes of unknown names and damaged files, and who
// may register (the run directory's writers, recorded as owner_group).
#include "support.h"
#include "support/temp_dir.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/maintenance.h"
#include "forge/ckpt/registry.h"
#include "forge/common/error.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

using namespace forge::ckpt;
using namespace forge::ckpt::test;
using forge::ExitCode;
using forge::Json;
namespace fs = std::filesystem;

namespace {

// Saves one milestone checkpoint of run `name` as forge-train would (spec, tokenizer, lineage from
// `parent`, the init_from checkpoint; "" for a run from scratch) and returns it.
std::string train(const std::string& run, int64_t step, const std::string& name, const std::string& dataset,
                  const std::string& parent = "", const std::string& objective = "lm") {
  CheckpointMeta m = meta_for(step);
  m.dataset_version = dataset;
  m.spec_hash = "spec-" + name;
  m.extra["spec"] = {{"run.name", name}, {"run.dir", run}, {"run.objective", objective}};
  m.extra["tokenizer_sha256"] = "tok-1";
  if (!parent.empty()) {
    const CheckpointMeta p = Checkpoint::open(parent).manifest().meta;
    m.extra["lineage"] = {{"parent", fs::absolute(parent).lexically_normal().string()},
                          {"parent_step", p.step},
                          {"parent_dataset_version", p.dataset_version},
                          {"parent_spec_hash", p.spec_hash},
                          {"parent_lineage", p.extra.value("lineage", Json())}};
  }
  SingleProcessCoordinator coord;
  Saver saver(coord, SaverOptions{run});
  const RankState st = rank_state(1, 1, 0, step);
  REQUIRE(saver.save(Tier::kMilestone, m, st.tensors()).outcome == Outcome::kCommitted);
  return checkpoint_dir(run, Tier::kMilestone, step);
}

const Json kVerdict = {{"pass", true}, {"domains", {{"web", {{"loss", 2.5}}}}}};

ExitCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const forge::Error& e) {
    return e.code();
  }
  return ExitCode::kOk;
}

}  // namespace

TEST_CASE("registry: a release is registered once, with what made it") {
  forge::test::TempDir tmp;
  const std::string run = tmp / "base";
  const std::string ckpt = train(run, 20, "base", "ds-1");
  tmp.write("base/summary.json", R"({"job_id": "102", "segments": [{"job_id": "101"}, {"job_id": "102"}]})");
  const std::string release = promote(ckpt, kVerdict);

  Registry reg(tmp / "state/registry.db", Registry::Mode::kCreate);  // its directory is created
  const Release r = reg.add(release, {.name = "", .team = "nlp", .promote_job = "103"});
  CHECK(r.ref() == "base:1");
  CHECK(r.path == fs::absolute(release).lexically_normal().string());
  CHECK(r.source == fs::absolute(ckpt).lexically_normal().string());
  CHECK(r.team == "nlp");
  CHECK(r.run_dir == fs::path(run).lexically_normal().string());
  CHECK(r.objective == "lm");
  CHECK(r.step == 20);
  CHECK(r.train_jobs == std::vector<std::string>{"101", "102"});
  CHECK(r.promote_job == "103");
  CHECK(r.dataset_version == "ds-1");
  CHECK(r.tokenizer_sha256 == "tok-1");
  CHECK(r.spec_hash == "spec-base");
  CHECK(r.parent.empty());
  CHECK_FALSE(r.parent_id);
  CHECK(r.verdict == kVerdict);
  CHECK(r.metrics == kVerdict["domains"]);

  // Again (a retried gate job): the same entry, with what the first registration knew.
  const Release again = reg.add(release + "/", {});
  CHECK(again.id == r.id);
  CHECK(again.ref() == "base:1");
  CHECK(again.team == "nlp");
  CHECK(again.promote_job == "103");
  CHECK(reg.list().size() == 1);
  CHECK(code_of([&] { reg.add(release, {.name = "other", .team = "", .promote_job = ""}); }) ==
        ExitCode::kUsage);

  // Found by name, name:version, the release path and the checkpoint it was promoted from.
  CHECK(reg.find("base").id == r.id);
  CHECK(reg.find("base:1").id == r.id);
  CHECK(reg.find(release).id == r.id);
  CHECK(reg.find(ckpt).id == r.id);

  reg.set_export(r.id, tmp / "out/base.h5");
  CHECK(reg.find("base").export_path == tmp / "out/base.h5");

  // Another process sees the same entries.
  const Registry reader(tmp / "state/registry.db", Registry::Mode::kExisting);
  CHECK(reader.find("base:1").to_json() == reg.find("base:1").to_json());
}

TEST_CASE("registry: versions count up per name") {
  forge::test::TempDir tmp;
  Registry reg(tmp / "registry.db", Registry::Mode::kCreate);
  const std::string a = promote(train(tmp / "a", 10, "chat", "ds-1"), kVerdict);
  const std::string b = promote(train(tmp / "a", 20, "chat", "ds-1"), kVerdict);
  const std::string c = promote(train(tmp / "c", 10, "code", "ds-1"), kVerdict);
  CHECK(reg.add(a).ref() == "chat:1");
  CHECK(reg.add(b).ref() == "chat:2");
  CHECK(reg.add(c).ref() == "code:1");
  CHECK(reg.add(a).ref() == "chat:1");
  CHECK(reg.find("chat").step == 20);  // the newest version
  CHECK(reg.find("chat:1").step == 10);
  const auto all = reg.list();
  REQUIRE(all.size() == 3);
  CHECK(all[0].ref() == "chat:1");
  CHECK(all[1].ref() == "chat:2");
  CHECK(all[2].ref() == "code:1");
  // --name: another name, its own versions.
  const std::string d = promote(train(tmp / "d", 10, "chat", "ds-1"), kVerdict);
  CHECK(reg.add(d, {.name = "chat-large", .team = "", .promote_job = ""}).ref() == "chat-large:1");
  CHECK(code_of([&] {
          reg.add(promote(train(tmp / "e", 10, "x", "d"), kVerdict),
                  {.name = "bad:name", .team = "", .promote_job = ""});
        }) == ExitCode::kUsage);
}

TEST_CASE("registry: lineage walks parents back to the pretraining run") {
  forge::test::TempDir tmp;
  Registry reg(tmp / "registry.db", Registry::Mode::kCreate);
  const std::string base = promote(train(tmp / "base", 20, "base", "ds-1"), kVerdict);
  // Continued from the base release on new data; then fine-tuned from the continued run's milestone (not
  // its release: the release's `source`).
  const std::string cont_ckpt = train(tmp / "cont", 12, "cont", "ds-2", base);
  const std::string ft_ckpt = train(tmp / "ft", 6, "ft", "ds-3", cont_ckpt, "sft");
  const std::string cont = promote(cont_ckpt, kVerdict);
  const std::string ft = promote(ft_ckpt, kVerdict);

  // Registered child first: the link to its parent comes when the parent is registered.
  const Release f = reg.add(ft);
  CHECK_FALSE(f.parent_id);
  const Release c = reg.add(cont);
  CHECK(reg.find("ft").parent_id == c.id);
  const Release b = reg.add(base);
  CHECK(reg.find("cont").parent_id == b.id);

  const auto gens = reg.lineage(ft);
  REQUIRE(gens.size() == 3);
  CHECK(gens[0].ref == "ft:1");
  CHECK(gens[0].objective == "sft");
  CHECK(gens[0].dataset_version == "ds-3");
  CHECK(gens[1].ref == "cont:1");
  CHECK(gens[1].path == c.path);
  CHECK(gens[1].dataset_version == "ds-2");
  CHECK(gens[2].ref == "base:1");
  CHECK(gens[2].run_dir == fs::path(tmp / "base").lexically_normal().string());
  CHECK(gens[2].step == 20);
  CHECK(gens[2].dataset_version == "ds-1");
  CHECK(gens[2].tokenizer_sha256 == "tok-1");
  // By name, the same.
  CHECK(reg.lineage(reg.find("ft:1").path).size() == 3);

  // An unregistered checkpoint: its own manifest, then the registered parents.
  const std::string more = train(tmp / "more", 3, "more", "ds-4", ft);
  const auto from_disk = reg.lineage(more);
  REQUIRE(from_disk.size() == 4);
  CHECK(from_disk[0].ref.empty());
  CHECK(from_disk[0].dataset_version == "ds-4");
  CHECK(from_disk[1].ref == "ft:1");
  CHECK(from_disk[3].ref == "base:1");
}

TEST_CASE("registry: lineage from manifests when the parents are not registered or gone") {
  forge::test::TempDir tmp;
  Registry reg(tmp / "registry.db", Registry::Mode::kCreate);
  const std::string base_ckpt = train(tmp / "base", 20, "base", "ds-1");
  const std::string cont_ckpt = train(tmp / "cont", 12, "cont", "ds-2", base_ckpt);
  const Release c = reg.add(promote(cont_ckpt, kVerdict));
  CHECK(c.parent == fs::absolute(base_ckpt).lexically_normal().string());
  CHECK_FALSE(c.parent_id);

  auto gens = reg.lineage(c.path);
  REQUIRE(gens.size() == 2);
  CHECK(gens[1].ref.empty());
  CHECK(gens[1].path == c.parent);
  CHECK(gens[1].on_disk);
  CHECK(gens[1].objective == "lm");

  // The pretraining run's checkpoint removed: what the child recorded of it.
  fs::remove_all(tmp / "base");
  gens = reg.lineage(c.path);
  REQUIRE(gens.size() == 2);
  CHECK_FALSE(gens[1].on_disk);
  CHECK(gens[1].step == 20);
  CHECK(gens[1].dataset_version == "ds-1");
  CHECK(gens[1].spec_hash == "spec-base");
}

TEST_CASE("registry: unknown names, non-releases and damaged files") {
  forge::test::TempDir tmp;
  CHECK(code_of([&] { Registry(tmp / "none.db", Registry::Mode::kExisting); }) == ExitCode::kUsage);
  Registry reg(tmp / "registry.db", Registry::Mode::kCreate);
  const std::string ckpt = train(tmp / "base", 20, "base", "ds-1");
  CHECK(code_of([&] { reg.add(ckpt); }) == ExitCode::kUsage);  // a milestone, not a release
  CHECK(code_of([&] { reg.add(tmp / "nowhere"); }) == ExitCode::kUsage);
  reg.add(promote(ckpt, kVerdict));
  CHECK(code_of([&] { reg.find("nope"); }) == ExitCode::kUsage);
  CHECK(code_of([&] { reg.find("base:2"); }) == ExitCode::kUsage);
  CHECK(code_of([&] { reg.find("base:x"); }) == ExitCode::kUsage);
  CHECK(code_of([&] { reg.find("base:0"); }) == ExitCode::kUsage);
  CHECK(code_of([&] { reg.find(tmp / "other/checkpoints/release/step-00000001"); }) == ExitCode::kUsage);
  CHECK(code_of([&] { reg.lineage(tmp / "nowhere"); }) == ExitCode::kUsage);

  const std::string damaged = tmp.write("damaged.db", std::string(4096, 'x'));
  CHECK(code_of([&] { Registry(damaged, Registry::Mode::kExisting); }) == ExitCode::kData);
  CHECK(code_of([&] { Registry(damaged, Registry::Mode::kCreate); }) == ExitCode::kData);

  // The registry path: --registry, else $FORGE_REGISTRY, else the admin's state directory.
  ::setenv("FORGE_REGISTRY", "/tmp/from-env.db", 1);
  CHECK(registry_path("given.db") == "given.db");
  CHECK(registry_path("") == "/tmp/from-env.db");
  ::unsetenv("FORGE_REGISTRY");
  CHECK(registry_path("") == kDefaultRegistry);
}

TEST_CASE("registry: only who may write the run directory registers its releases") {
  forge::test::TempDir tmp;
  const std::string run = tmp / "base";
  const std::string release = promote(train(run, 20, "base", "ds-1"), kVerdict);
  Registry reg(tmp / "registry.db", Registry::Mode::kCreate);
  for (const char* suffix : {"", "-wal", "-shm"})  // kept after the connection closes, made by their owner
    CHECK(fs::is_regular_file(tmp / (std::string("registry.db") + suffix)));

  // The entry records the group that owns the run directory.
  struct stat st {};
  REQUIRE(::stat(run.c_str(), &st) == 0);
  const struct group* g = ::getgrgid(st.st_gid);
  const Release r = reg.add(release);
  CHECK(r.owner_group == (g ? std::string(g->gr_name) : std::to_string(st.st_gid)));
  CHECK(reg.find("base").owner_group == r.owner_group);
  CHECK(r.to_json().at("owner_group") == r.owner_group);
  CHECK(caller_can_write(run));

  // A run directory the caller may not write (root may write any): no registration, no recorded export.
  if (::getuid() != 0) {
    fs::permissions(run, fs::perms::owner_write, fs::perm_options::remove);
    CHECK_FALSE(caller_can_write(run));
    CHECK(code_of([&] { reg.add(release); }) == ExitCode::kIo);
    CHECK(code_of([&] { reg.set_export(r.id, tmp / "out.h5"); }) == ExitCode::kIo);
    try {
      reg.add(release);
    } catch (const forge::Error& e) {
      CHECK_THAT(e.what(), Catch::Matchers::EndsWith(
                               "cannot write " + fs::path(run).lexically_normal().string() +
                               ": only its team (the group that owns it) registers its releases"));
    }
    fs::permissions(run, fs::perms::owner_write, fs::perm_options::add);
  }
  CHECK(reg.find("base").export_path.empty());
}
