// File-system steps of the commit protocol shared by the writer, promotion and gc.
#pragma once

#include "forge/common/hash.h"

#include <cstddef>
#include <string>

namespace forge::ckpt::detail {

// write(2) until done (EINTR retried); throws forge::Error(kIo) naming `path` and errno (ENOSPC: the
// message says the disk is full).
void write_all(int fd, const void* data, size_t size, const std::string& path);
void fsync_or_throw(int fd, const std::string& path);
// Creates `path` with `bytes`, fsynced; returns the xxh3 of the bytes. Not atomic: for files inside a
// staging directory, which is atomic as a whole.
std::string write_new_file(const std::string& path, std::string_view bytes);
// Renames `from` to `to` and fsyncs the parent. An existing `to` is swapped in one step
// (renameat2 RENAME_EXCHANGE) and its old contents removed, so `to` is never absent in between.
void publish_dir(const std::string& from, const std::string& to);
void remove_tree(const std::string& path) noexcept;
std::string random_nonce();
double now_unix();
// "<dir>/COMMITTED" content that ties the marker to one manifest.
std::string committed_text(const std::string& manifest_xxh3);

}  // namespace forge::ckpt::detail
