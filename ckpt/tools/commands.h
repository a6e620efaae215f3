// The subcommands of forge-ckpt; each parses its own options from `args` and returns the exit code.
#pragma once

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

}  // namespace forge::ckpt::cli
