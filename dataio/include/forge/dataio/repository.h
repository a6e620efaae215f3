// The repository stage: for code that comes with repository names (Document::repo), deduplication by
// repository and the families that keep a repository's files on one side of the validation split.
//
// A repository is a set of file-content hashes. One whose set equals an earlier repository's (input order)
// is a whole-repository duplicate and is removed. One that shares at least `fork_threshold` of its
// substantive files (not license files, not shorter than kMinForkFileBytes) with an earlier repository, and
// at least two of them, is a fork of it: it joins that repository's family (the family of a fork of a fork
// is the first repository's), and with drop_forks it is removed whole. The files a fork shares are exact
// duplicates and go in the next stage either way; what the family adds is that the fork's own files never
// land on the other side of the split from the code they were derived from.
//
// A repository's license file (LICENSE*, LICENCE*, COPYING*) gives its license to its files that name none.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"
#include "forge/dataio/ranks.h"

#include <cstddef>

namespace forge::data {

inline constexpr size_t kMinForkFileBytes = 64;

struct RepositoryOptions {
  double fork_threshold = 0.5;
  bool drop_forks = false;
};

// Sets Document::repo_family (and licenses from license files), removes duplicate repositories (and forks
// with drop_forks). Documents without a repository are left as they are. Distributed: rank 0 decides from
// every rank's file hashes (O(files with a repository) bytes, not their text).
Json dedup_repositories(Corpus& corpus, const RepositoryOptions& options, Ranks& ranks = single_rank());

}  // namespace forge::data
