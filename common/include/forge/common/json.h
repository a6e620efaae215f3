// JSON documents on disk (manifests, reports, snapshots). Writes are atomic: a reader sees the old file
// or the complete new one, never a prefix.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace forge {

using Json = nlohmann::json;

// Parses a JSON file; throws forge::Error(kData) naming the file and the parse position, or kIo.
Json read_json(const std::string& path);

// Writes `doc` (indented) to `path` atomically.
void write_json_atomic(const std::string& path, const Json& doc);

// Writes bytes to `path` through "<path>.tmp.<pid>", fsync, rename, fsync of the directory. On any
// failure the temp file is removed, `path` is untouched and forge::Error(kIo) names the file and errno.
void write_file_atomic(const std::string& path, std::string_view bytes);

// fsync of a directory, so a rename or create inside it survives a crash.
void fsync_dir(const std::string& dir);

std::string read_file(const std::string& path);

}  // namespace forge
