// forge-train in-image's parts (the task's runtime spec, oci.conf's pattern, what the image shows of the
// node) and the rank's check that it runs in the image its job asked for. The whole path, through crun
// under Slurm, is test/slurm/image_test.sh.
#include "in_image.h"
#include "forge/common/image.h"
#include "support/errors.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <cstdlib>

using forge::Json;
using forge::test::error_of;
using forge::test::mentions;
namespace L = forge::launcher;

namespace {

Json image_config() {
  return Json::parse(R"({
    "ociVersion": "1.0.2",
    "process": {"args": ["/opt/forge/bin/forge-train", "--help"], "cwd": "/",
                "env": ["PATH=/opt/forge/bin:/usr/bin:/bin", "OMPI_MCA_btl_vader_single_copy_mechanism=none"]},
    "root": {"path": "rootfs", "readonly": true},
    "mounts": [
      {"destination": "/proc", "type": "none", "source": "/proc", "options": ["rbind"]},
      {"destination": "/var/tmp", "type": "none", "source": "/var/tmp", "options": ["rbind"]},
      {"destination": "/data", "type": "none", "source": "/srv/elsewhere", "options": ["bind"]},
      {"destination": "/scratch", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]}],
    "linux": {"namespaces": [{"type": "user"}, {"type": "mount"}]}})");
}

// Sets an environment variable for one test and restores it.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (value != nullptr)
      setenv(name.c_str(), value, 1);
    else
      unsetenv(name.c_str());
  }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("a task's runtime spec: its arguments, environment, directory, user and the rootfs", "[image]") {
  const Json c =
      L::task_config(image_config(), "/images/a", {"/opt/forge/bin/forge-train", "spec.ini"},
                     {"PATH=/usr/bin", "SLURM_PROCID=1", "HOME=/home/alice"}, "/var/tmp/run", 1001, 1002);
  CHECK(c["root"]["path"] == "/images/a/rootfs");
  CHECK(c["process"]["args"] == Json({"/opt/forge/bin/forge-train", "spec.ini"}));
  CHECK(c["process"]["cwd"] == "/var/tmp/run");
  // The task's environment with the image's entries over it, once each.
  const auto env = c["process"]["env"].get<std::vector<std::string>>();
  CHECK(std::count(env.begin(), env.end(), "PATH=/opt/forge/bin:/usr/bin:/bin") == 1);
  CHECK(std::find(env.begin(), env.end(), "PATH=/usr/bin") == env.end());
  CHECK(std::find(env.begin(), env.end(), "SLURM_PROCID=1") != env.end());
  CHECK(std::find(env.begin(), env.end(), "OMPI_MCA_btl_vader_single_copy_mechanism=none") != env.end());
  // The same ids inside as outside: only they are mapped.
  CHECK(c["process"]["user"] == Json({{"uid", 1001}, {"gid", 1002}}));
  CHECK(c["linux"]["uidMappings"] == Json::parse(R"([{"containerID": 1001, "hostID": 1001, "size": 1}])"));
  CHECK(c["linux"]["gidMappings"] == Json::parse(R"([{"containerID": 1002, "hostID": 1002, "size": 1}])"));
  CHECK(c["mounts"] == image_config()["mounts"]);
  // An absolute rootfs stays as it is.
  Json abs = image_config();
  abs["root"]["path"] = "/elsewhere/rootfs";
  CHECK(L::task_config(abs, "/images/a", {"x"}, {}, "/", 0, 0)["root"]["path"] == "/elsewhere/rootfs");
}

TEST_CASE("oci.conf's RunTimeRun is read and its patterns filled in as slurmstepd does", "[image]") {
  forge::test::TempDir dir;
  const auto conf = dir.write("oci.conf",
                              "# comment = not this\n"
                              "RunTimeQuery=\"crun state %n.%u.%j.%s.%t\"\n"
                              "  runtimerun = \"crun --root=/tmp/c-%U run --bundle %b %n.%u.%j.%s.%t\" \n");
  const std::string pattern = L::oci_run_pattern(conf);
  CHECK(pattern == "crun --root=/tmp/c-%U run --bundle %b %n.%u.%j.%s.%t");
  const L::TaskIds ids{"node3", "alice", "1001", "42", "0", "1"};
  CHECK(L::runtime_command(pattern, "/tmp/b", "/img/rootfs", ids) ==
        "crun --root=/tmp/c-1001 run --bundle /tmp/b node3.alice.42.0.1");
  CHECK(L::runtime_command("%r 100%%", "/b", "/img/rootfs", ids) == "/img/rootfs 100%");

  const auto unknown = error_of([&] { L::runtime_command("crun %@", "/b", "/r", ids); });
  CHECK(unknown.code() == forge::ExitCode::kUsage);
  CHECK(mentions(unknown, "'%@'"));
  const auto none = error_of([&] { L::oci_run_pattern(dir.write("empty.conf", "RunTimeQuery=\"x\"\n")); });
  CHECK(none.code() == forge::ExitCode::kUsage);
  CHECK(mentions(none, "has no RunTimeRun"));
  const auto missing = error_of([&] { L::oci_run_pattern(dir / "nope.conf"); });
  CHECK(missing.code() == forge::ExitCode::kUsage);
  CHECK(mentions(missing, "not set up to run jobs in images"));
}

TEST_CASE("what the image shows of the node: its bind mounts at their own paths", "[image]") {
  const Json c = image_config();
  CHECK(L::visible_in_image(c, "/var/tmp/run/spec.ini"));
  CHECK(L::visible_in_image(c, "/var/tmp"));
  CHECK_FALSE(L::visible_in_image(c, "/var/tmpx/spec.ini"));
  CHECK_FALSE(L::visible_in_image(c, "/var/tmp/../lib/secret"));  // '..' out of the mount
  CHECK_FALSE(L::visible_in_image(c, "/home/alice/spec.ini"));
  CHECK_FALSE(L::visible_in_image(c, "/srv/elsewhere/x"));  // bound, but at another path inside
  CHECK_FALSE(L::visible_in_image(c, "/scratch/x"));        // the image's own tmpfs
}

TEST_CASE("a rank checks that it runs in the image its job asked for", "[image]") {
  forge::test::TempDir dir;
  const std::string none = dir / "absent.json";
  const std::string inside = dir.write("forge-image.json", R"({"digest": "sha256:aa", "programs": {}})");
  ScopedEnv clear("FORGE_IMAGE_DIGEST", nullptr);

  CHECK(forge::running_image_digest(none).empty());
  CHECK(forge::running_image_digest(inside) == "sha256:aa");
  CHECK(forge::check_running_image("", none).empty());           // no image asked for, none used
  CHECK(forge::check_running_image("", inside) == "sha256:aa");  // in an image the spec does not name
  CHECK(forge::check_running_image("/images/a", inside) == "sha256:aa");

  const auto outside = error_of([&] { forge::check_running_image("/images/a", none); });
  CHECK(outside.code() == forge::ExitCode::kUsage);
  CHECK(mentions(outside, "run.image = /images/a but this rank runs outside any image"));
  {
    ScopedEnv wanted("FORGE_IMAGE_DIGEST", "sha256:bb");
    const auto other = error_of([&] { forge::check_running_image("/images/b", inside); });
    CHECK(other.code() == forge::ExitCode::kUsage);
    CHECK(mentions(other, "asked for image /images/b (sha256:bb) but this rank runs in sha256:aa"));
  }
  const auto damaged =
      error_of([&] { forge::running_image_digest(dir.write("bad.json", R"({"digest": 1})")); });
  CHECK(damaged.code() == forge::ExitCode::kData);
  CHECK(mentions(damaged, "has no image digest"));
}
