#include "forge/dataio/repository.h"

#include "distributed.h"
#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/filters.h"
#include "wire.h"

#include <algorithm>
#include <map>
#include <tuple>
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
  std::vector<size_t> files;         // indices into the file list, in input order
  std::vector<Hash128> hashes;       // distinct content hashes, sorted
  std::vector<Hash128> substantive;  // the hashes fork detection counts, sorted
  size_t family = 0;                 // index of the family's first repository
  enum class Fate { kKept, kDuplicate, kFork } fate = Fate::kKept;
  size_t of = 0;  // kDuplicate, kFork: the repository it repeats or forks
};

// What the plan needs of one file of a repository (a document with Document::repo), wherever it lives.
struct RepoFile {
  uint64_t doc = 0;  // global index
  uint16_t domain = 0;
  bool substantive = false, license_file = false, has_license = false;
  Hash128 hash;
  std::string repo, file_license;  // file_license: what a license file says
};

// The decision about one file: removed, its family, and the license it gets from its repository.
struct RepoVerdict {
  uint64_t doc = 0;
  bool remove = false;
  std::string family, license;
};

struct Hash128Less {
  bool operator()(const Hash128& a, const Hash128& b) const {
    return std::tie(a.high, a.low) < std::tie(b.high, b.low);
  }
};
struct Hash128Hasher {
  size_t operator()(const Hash128& h) const {
    return static_cast<size_t>(h.low ^ (h.high * 0x9E3779B97F4A7C15ull));
  }
};

// The stage on the metadata of every file of every repository, in input order (on rank 0 of a
// distributed prepare, which sees them all).
Json plan(const std::vector<RepoFile>& files, const std::vector<std::string>& domains,
          const RepositoryOptions& options, std::vector<RepoVerdict>& verdicts) {
  std::vector<Repo> repos;
  std::unordered_map<std::string, size_t> by_name;
  for (size_t f = 0; f < files.size(); ++f) {
    const auto [it, added] = by_name.emplace(files[f].repo, repos.size());
    if (added) repos.emplace_back().name = files[f].repo;
    Repo& r = repos[it->second];
    r.family = it->second;
    r.files.push_back(f);
    if (files[f].substantive) r.substantive.push_back(files[f].hash);
    r.hashes.push_back(files[f].hash);
  }
  // Licenses from license files, before anything is removed: the first license file that names one.
  std::vector<std::string> repo_license(repos.size());
  uint64_t licensed_from_file = 0;
  for (size_t r = 0; r < repos.size(); ++r) {
    for (size_t f : repos[r].files)
      if (files[f].license_file && !files[f].file_license.empty()) {
        repo_license[r] = files[f].file_license;
        break;
      }
    if (!repo_license[r].empty())
      for (size_t f : repos[r].files) licensed_from_file += !files[f].has_license;
  }
  // Duplicates by the whole set of hashes; forks by the share of substantive files first seen in an
  // earlier repository (the first holder of a file is the repository a copy of it came from).
  std::unordered_map<Hash128, size_t, Hash128Hasher> by_content, first_holder;
  Json examples = Json::array();
  uint64_t duplicates = 0, forks = 0;
  for (size_t r = 0; r < repos.size(); ++r) {
    Repo& repo = repos[r];
    for (auto* v : {&repo.hashes, &repo.substantive}) {
      std::sort(v->begin(), v->end(), Hash128Less());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
    std::string fingerprint;
    for (const auto& h : repo.hashes) fingerprint.append(reinterpret_cast<const char*>(&h), sizeof h);
    const auto [dup, fresh] = by_content.emplace(xxh3_128(fingerprint), r);
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
  uint64_t removed_dup = 0, removed_fork = 0;
  std::map<std::string, uint64_t> removed_per_domain;
  std::map<size_t, uint64_t> family_repos;
  for (size_t r = 0; r < repos.size(); ++r) {
    const Repo& repo = repos[r];
    const bool drop =
        repo.fate == Repo::Fate::kDuplicate || (repo.fate == Repo::Fate::kFork && options.drop_forks);
    if (!drop) ++family_repos[repo.family];
    for (size_t f : repo.files) {
      verdicts.push_back(
          {files[f].doc, drop, repos[repo.family].name, files[f].has_license ? "" : repo_license[r]});
      if (!drop) continue;
      ++(repo.fate == Repo::Fate::kDuplicate ? removed_dup : removed_fork);
      ++removed_per_domain[domains.at(files[f].domain)];
    }
  }
  uint64_t largest = 0;
  for (const auto& [_, n] : family_repos) largest = std::max(largest, n);
  return {{"files_with_repository", files.size()},
          {"repositories", repos.size()},
          {"duplicate_repositories", duplicates},
          {"forks", forks},
          {"families", family_repos.size()},
          {"largest_family_repositories", largest},
          {"licensed_from_repository_file", licensed_from_file},
          {"removed", {{"repository_duplicate", removed_dup}, {"repository_fork", removed_fork}}},
          {"removed_per_domain", removed_per_domain},
          {"examples", examples}};
}

}  // namespace

Json dedup_repositories(Corpus& corpus, const RepositoryOptions& options, Ranks& ranks) {
  ProgressLine progress("prepare repositories", "docs");
  const Placement at = place(ranks, corpus.docs.size());
  // Every rank's repository files go to rank 0, which plans; each rank gets back its files' verdicts.
  Packer mine;
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    const Document& doc = corpus.docs[i];
    progress.add(1, doc.text.size());
    if (doc.repo.empty()) continue;
    const bool license_file = is_license_file(doc.source);
    mine.put<uint64_t>(at.first + i)
        .put(doc.domain)
        .put<uint8_t>(!license_file && doc.text.size() >= kMinForkFileBytes)
        .put<uint8_t>(license_file)
        .put<uint8_t>(!doc.license.empty())
        .put(xxh3_128(doc.text))
        .put(std::string_view(doc.repo))
        .put(std::string_view(license_file ? detect_license(doc.text) : std::string()));
  }
  std::vector<std::string> to_root(static_cast<size_t>(ranks.size()));
  to_root[0] = std::move(mine.bytes());
  const auto gathered = ranks.exchange(std::move(to_root));
  Json report = {{"files_with_repository", 0},
                 {"repositories", 0},
                 {"duplicate_repositories", 0},
                 {"forks", 0},
                 {"families", 0},
                 {"largest_family_repositories", 0},
                 {"licensed_from_repository_file", 0},
                 {"removed", {{"repository_duplicate", 0}, {"repository_fork", 0}}},
                 {"removed_per_domain", Json::object()},
                 {"examples", Json::array()}};
  Outbox back(ranks.size());
  if (ranks.rank() == 0) {
    std::vector<RepoFile> files;
    for (const auto& block : gathered)  // rank order: input order
      for (Unpacker in(block); !in.done();) {
        RepoFile& f = files.emplace_back();
        f.doc = in.get<uint64_t>();
        f.domain = in.get<uint16_t>();
        f.substantive = in.get<uint8_t>();
        f.license_file = in.get<uint8_t>();
        f.has_license = in.get<uint8_t>();
        f.hash = in.get<Hash128>();
        f.repo = in.str();
        f.file_license = in.str();
      }
    std::vector<RepoVerdict> verdicts;
    report = plan(files, corpus.domains, options, verdicts);
    for (const auto& v : verdicts)
      back.to[static_cast<size_t>(at.rank_of(v.doc))]
          .put(v.doc)
          .put<uint8_t>(v.remove)
          .put(std::string_view(v.family))
          .put(std::string_view(v.license));
  }
  std::vector<uint8_t> remove(corpus.docs.size(), 0);
  for (const auto& block : ranks.exchange(back.blocks()))
    for (Unpacker in(block); !in.done();) {
      const auto i = in.get<uint64_t>() - at.first;
      remove[i] = in.get<uint8_t>();
      Document& doc = corpus.docs[i];
      doc.repo_family = in.str();
      if (std::string license = in.str(); !license.empty()) doc.license = std::move(license);
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
  report["documents_in"] = in;
  report["fork_threshold"] = options.fork_threshold;
  report["drop_forks"] = options.drop_forks;
  report["documents_out"] = corpus.docs.size();
  report["seconds"] = progress.seconds();
  return report;
}

}  // namespace forge::data
