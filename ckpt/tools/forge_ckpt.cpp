// forge-ckpt: look after a run's checkpoints (list, verify, inspect, promote, gc, export, advise) and the
// model registry of promoted releases (registry ...).
#include "commands.h"

#include "forge/common/error.h"
#include "forge/common/privilege.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <functional>
#include <map>

namespace {

constexpr const char* kUsage =
    R"(usage: forge-ckpt COMMAND [options]   (forge-ckpt COMMAND --help for its options)

  list RUN_DIR            checkpoints of a run: tier, step, size, loss, age
  verify CKPT|RUN_DIR     check every file against the manifest's checksums (exit 65 naming the damaged file)
  inspect CKPT            tensors, shapes, layout, spec and data position of one checkpoint
  promote CKPT --verdict FILE   commit a copy to the release tier with the gate's verdict; register it
  gc RUN_DIR              remove crash leftovers and apply retention
  export CKPT --out FILE  one self-describing HDF5 file (docs/CHECKPOINTS.md), readable with h5py
  export CKPT --format hf --out DIR   the model in the Hugging Face layout (config.json, safetensors, tokenizer)
  import DIR --out CKPT   a Hugging Face model directory as a checkpoint to start runs from (ckpt.init_from)
  advise RUN_DIR --mtbf-hours H   Young/Daly recovery interval from the measured save stall
  registry COMMAND        the model registry: add, list, show, lineage, export, init (forge-ckpt registry --help)

exit status: 0 ok, 64 usage or another model config, 65 damaged checkpoint, another dataset or a model
that cannot be read, 74 I/O
)";

}  // namespace

int main(int argc, char** argv) {
  return forge::run_cli("forge-ckpt", [&] {
    using namespace forge::ckpt::cli;
    namespace privilege = forge::privilege;
    // umask 007: a registry file made in the registry's group directory stays the group's to write. What
    // is the caller's is written with the caller's umask (and, installed setgid, without the group).
    privilege::init_umask();
    const std::string command = argc >= 2 ? argv[1] : "";
    if (command != "registry" && command != "promote") {
      // No registry here: the caller's rights only.
      privilege::drop_group();
      ::umask(privilege::caller_umask());
    }
    const std::map<std::string, std::function<int(const Args&)>> commands = {
        {"list", list},      {"verify", verify}, {"inspect", inspect},   {"promote", promote}, {"gc", gc},
        {"export", export_}, {"advise", advise}, {"registry", registry}, {"import", import_}};
    if (argc < 2) {
      fmt::print(stderr, "{}", kUsage);
      return static_cast<int>(forge::ExitCode::kUsage);
    }
    if (command == "--help" || command == "-h" || command == "help") {
      fmt::print("{}", kUsage);
      return 0;
    }
    const auto it = commands.find(command);
    if (it == commands.end())
      forge::fail(
          forge::ExitCode::kUsage,
          "unknown command '{}': use list, verify, inspect, promote, gc, export, import, advise or registry",
          command);
    return it->second(Args(argv + 2, argv + argc));
  });
}
