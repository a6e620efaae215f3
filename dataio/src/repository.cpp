#include "forge/dataio/repository.h"

#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/filters.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace forge::data {
namespace {

// The file name of a document's source: a path, or a JSONL record's "path:line" or "source" field.
std::string_view file_name(std::string_view source) {
  if (const auto colon = source.rfind(':');
      colon != std::string_view::npos && colon + 1 < source.size() &&
      source.find_first_not_of("0123456789", colon + 1) == std::string_view::npos)
    source = source.substr(0, colon);
  const auto slash = source.rfind('/');
  return slash == std::string_view::npos ? source : source.substr(slash + 1);
}

bool is_license_file(std::string_view source) {
  std::string name(file_name(source));
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name.starts_with("LICENSE") || name.starts_with("LICENCE") || name.starts_with("COPYING");
}

struct Repo {
  std::string name;
  std::vector<size_t> docs;              // indices into the corpus, in input order
  std::vector<std::string> hashes;       // distinct content hashes, sorted
  std::vector<std::string> substantive;  // the hashes fork detection counts, sorted
  size_t family = 0;                     // index of the family's first repository
  enum class Fate { kKept, kDuplicate, kFork } fate = Fate::kKept;
  size_t of = 0;      // kDuplicate, kFork: the repository it repeats or forks
  size_t shared = 0;  // kFork: substantive files shared with `of`
};

}  // namespace

Json dedup_repositories(Corpus& corpus, const RepositoryOptions& options) {
  ProgressLine progress("prepare repositories", "docs");
  std::vector<Repo> repos;
  std::unordered_map<std::string, size_t> by_name;
  uint64_t files = 0;
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    const Document& doc = corpus.docs[i];
    progress.add(1, doc.text.size());
    if (doc.repo.empty()) continue;
    ++files;
    const auto [it, added] = by_name.emplace(doc.repo, repos.size());
    if (added) repos.push_back({doc.repo, {}, {}, {}, repos.size()});
    Repo& r = repos[it->second];
    r.docs.push_back(i);
    std::string h = xxh3_128_hex(doc.text);
    if (!is_license_file(doc.source) && doc.text.size() >= kMinForkFileBytes) r.substantive.push_back(h);
    r.hashes.push_back(std::move(h));
  }
  // Licenses from license files, before anything is removed: the first license file that names one.
  uint64_t licensed_from_file = 0;
  for (const Repo& r : repos) {
    std::string license;
    for (size_t i : r.docs)
      if (is_license_file(corpus.docs[i].source) && !(license = detect_license(corpus.docs[i].text)).empty())
        break;
    if (license.empty()) continue;
    for (size_t i : r.docs)
      if (corpus.docs[i].license.empty()) {
        corpus.docs[i].license = license;
        ++licensed_from_file;
      }
  }
  // Duplicates by the whole set of hashes; forks by the share of substantive files first seen in an
  // earlier repository (the first holder of a file is the repository a copy of it came from).
  std::unordered_map<std::string, size_t> by_content, first_holder;
  Json examples = Json::array();
  uint64_t duplicates = 0, forks = 0;
  for (size_t r = 0; r < repos.size(); ++r) {
    Repo& repo = repos[r];
    for (auto* v : {&repo.hashes, &repo.substantive}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
    std::string fingerprint;
    for (const auto& h : repo.hashes) fingerprint += h;
    const auto [dup, fresh] = by_content.emplace(xxh3_128_hex(fingerprint), r);
    if (!fresh) {
      repo.fate = Repo::Fate::kDuplicate;
      repo.of = dup->second;
      repo.family = repos[dup->second].family;
      ++duplicates;
      if (examples.size() < 5) examples.push_back({{"duplicate", repo.name}, {"of", repos[repo.of].name}});
      continue;
    }
    std::map<size_t, size_t> shared;  // earlier repository -> substantive files first held there
    for (const auto& h : repo.substantive)
      if (const auto it = first_holder.find(h); it != first_holder.end()) ++shared[it->second];
    size_t best = 0, best_shared = 0;
    for (const auto& [q, n] : shared)
      if (n > best_shared) best = q, best_shared = n;  // ties: the earlier repository
    if (best_shared >= 2 && double(best_shared) >= options.fork_threshold * double(repo.substantive.size())) {
      repo.fate = Repo::Fate::kFork;
      repo.of = best;
      repo.shared = best_shared;
      repo.family = repos[best].family;
      ++forks;
      if (examples.size() < 5)
        examples.push_back({{"fork", repo.name},
                            {"of", repos[best].name},
                            {"shared_files", best_shared},
                            {"substantive_files", repo.substantive.size()}});
    }
    for (const auto& h : repo.substantive) first_holder.emplace(h, r);
  }
  // Apply: families, then removals.
  std::vector<uint8_t> remove(corpus.docs.size(), 0);
  uint64_t removed_dup = 0, removed_fork = 0;
  std::map<std::string, uint64_t> removed_per_domain;
  std::map<size_t, uint64_t> family_repos;
  for (const Repo& repo : repos) {
    const bool drop =
        repo.fate == Repo::Fate::kDuplicate || (repo.fate == Repo::Fate::kFork && options.drop_forks);
    if (!drop) ++family_repos[repo.family];
    for (size_t i : repo.docs) {
      corpus.docs[i].repo_family = repos[repo.family].name;
      if (!drop) continue;
      remove[i] = 1;
      ++(repo.fate == Repo::Fate::kDuplicate ? removed_dup : removed_fork);
      ++removed_per_domain[corpus.domains[corpus.docs[i].domain]];
    }
  }
  const uint64_t in = corpus.docs.size();
  size_t kept = 0;
  for (size_t i = 0; i < corpus.docs.size(); ++i)
    if (!remove[i]) {
      if (kept != i) corpus.docs[kept] = std::move(corpus.docs[i]);
      ++kept;
    }
  corpus.docs.resize(kept);
  progress.finish();
  uint64_t largest = 0;
  for (const auto& [_, n] : family_repos) largest = std::max(largest, n);
  return {{"documents_in", in},
          {"files_with_repository", files},
          {"repositories", repos.size()},
          {"duplicate_repositories", duplicates},
          {"forks", forks},
          {"fork_threshold", options.fork_threshold},
          {"drop_forks", options.drop_forks},
          {"families", family_repos.size()},
          {"largest_family_repositories", largest},
          {"licensed_from_repository_file", licensed_from_file},
          {"removed", {{"repository_duplicate", removed_dup}, {"repository_fork", removed_fork}}},
          {"removed_per_domain", removed_per_domain},
          {"examples", examples},
          {"documents_out", corpus.docs.size()},
          {"seconds", progress.seconds()}};
}

}  // namespace forge::data
