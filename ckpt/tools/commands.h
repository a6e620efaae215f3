// The subcommands of forge-ckpt; each parses its own options from `args` and returns the exit code.
#pragma once

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/registry.h"

#include <boost/program_options.hpp>

#include <string>
#include <vector>

namespace forge::ckpt::cli {

using Args = std::vector<std::string>;

int list(const Args& args);
int verify(const Args& args);
int inspect(const Args& args);
int promote(const Args& args);
int gc(const Args& args);
int export_(const Args& args);
int import_(const Args& args);  // hf_commands.cpp
// export --format hf (hf_commands.cpp), with export_'s parsed options.
int export_hf(const Checkpoint& checkpoint, const std::string& out,
              const boost::program_options::variables_map& vm);
int advise(const Args& args);
int registry(const Args& args);  // registry_commands.cpp
// --registry PATH (default: $FORGE_REGISTRY, else the admin's state directory) into `path`.
void add_registry_option(boost::program_options::options_description& desc, std::string& path);
// The registry a command uses: --registry (`given`), else $FORGE_REGISTRY, else the system registry. A
// setgid forge-ckpt (AT_SECURE) uses only the system registry: another path is kUsage.
std::string registry_for(const std::string& given);
// Opens the registry at `path` (from registry_for). A setgid forge-ckpt first requires the database and
// its -wal and -shm files to exist and be root's (kIo otherwise): a file SQLite made for the user who runs
// it would be that user's to write.
Registry open_registry(const std::string& path, Registry::Mode mode);

// Parses `args` against `desc` plus --help and one positional option; prints the usage ("forge-ckpt "
// + `usage`) and returns false for --help.
bool parse(const Args& args, boost::program_options::options_description& desc, const char* positional,
           const char* usage, boost::program_options::variables_map& vm);

}  // namespace forge::ckpt::cli
