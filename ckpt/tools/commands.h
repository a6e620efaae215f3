// The subcommands of forge-ckpt; each parses its own options from `args` and returns the exit code.
#pragma once

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
int advise(const Args& args);
int registry(const Args& args);  // registry_commands.cpp
// --registry PATH (default: $FORGE_REGISTRY, else the admin's state directory) into `path`.
void add_registry_option(boost::program_options::options_description& desc, std::string& path);

// Parses `args` against `desc` plus --help and one positional option; prints the usage ("forge-ckpt "
// + `usage`) and returns false for --help.
bool parse(const Args& args, boost::program_options::options_description& desc, const char* positional,
           const char* usage, boost::program_options::variables_map& vm);

}  // namespace forge::ckpt::cli
