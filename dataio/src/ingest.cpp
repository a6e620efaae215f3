#include "forge/dataio/ingest.h"

#include "wire.h"

#include "forge/common/error.h"
#include "forge/common/progress_line.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/normalize.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace forge::data {
namespace {

std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  if (!ext.empty()) ext.erase(0, 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

// The files behind one input, sorted so the corpus order never depends on the directory listing order.
std::vector<fs::path> expand(const InputSpec& in, const IngestOptions& options, uint64_t* skipped) {
  std::error_code ec;
  const auto status = fs::status(in.path, ec);
  if (ec || !fs::exists(status)) fail(ExitCode::kUsage, "--input {}: no such file or directory", in.path);
  if (!fs::is_directory(status)) return {fs::path(in.path)};
  std::vector<fs::path> files;
  fs::recursive_directory_iterator it(in.path, fs::directory_options::skip_permission_denied, ec);
  if (ec) fail(ExitCode::kIo, "--input {}: cannot list directory: {}", in.path, ec.message());
  for (const auto& entry : it) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string ext = lower_extension(entry.path());
    if (std::find(options.extensions.begin(), options.extensions.end(), ext) == options.extensions.end()) {
      if (skipped) ++*skipped;
      continue;
    }
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// IngestOptions::repo_depth: the first `depth` directories of `file` below the input directory, or "" for a
// file less deep (or when the input is a file, or depth is 0).
std::string repo_of(const InputSpec& in, const fs::path& file, int depth) {
  if (depth <= 0 || !fs::is_directory(in.path)) return "";
  const fs::path rel = file.lexically_relative(in.path).parent_path();
  std::string repo;
  int parts = 0;
  for (const auto& part : rel) {
    if (parts == depth) break;
    if (parts++ > 0) repo += '/';
    repo += part.string();
  }
  return parts == depth ? repo : "";
}

std::string read_whole(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(ExitCode::kIo, "--input {}: cannot read (check permissions)", p.string());
  std::string data;
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  in.seekg(0);
  data.resize(size > 0 ? static_cast<size_t>(size) : 0);
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (!in && !in.eof()) fail(ExitCode::kIo, "--input {}: read error", p.string());
  return data;
}

size_t longest_line(std::string_view s) {
  size_t best = 0, start = 0;
  while (start <= s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string_view::npos) nl = s.size();
    best = std::max(best, nl - start);
    start = nl + 1;
  }
  return best;
}

// Applies the byte-level checks to one raw document and appends it when it passes.
void admit(std::string raw, std::string source, const std::string& domain, const std::string& license,
           const IngestOptions& options, Corpus& corpus, IngestStats& stats, const std::string& repo = "") {
  ++stats.documents_in;
  stats.bytes_in += raw.size();
  if (raw.size() > options.max_doc_bytes) {
    ++stats.dropped_too_large;
    return;
  }
  const size_t nul = static_cast<size_t>(std::count(raw.begin(), raw.end(), '\0'));
  if (nul > 0 && static_cast<double>(nul) > options.max_nul * static_cast<double>(raw.size())) {
    ++stats.dropped_binary;
    return;
  }
  size_t invalid = 0;
  std::string text = repair_utf8(raw, &invalid);
  if (invalid > 0) {
    if (static_cast<double>(invalid) > options.max_invalid_utf8 * static_cast<double>(raw.size())) {
      ++stats.dropped_invalid_utf8;
      return;
    }
    ++stats.utf8_repaired;
  }
  if (text.find_first_not_of(" \t\r\n\f\v", 0) == std::string::npos) {
    ++stats.dropped_empty;
    return;
  }
  if (longest_line(text) > options.max_line_bytes) {
    ++stats.dropped_long_lines;
    return;
  }
  ++stats.documents_out;
  stats.bytes_out += text.size();
  Document doc;
  doc.text = std::move(text);
  doc.source = std::move(source);
  doc.license = license;
  doc.repo = repo;
  doc.domain = corpus.domain_id(domain);
  corpus.docs.push_back(std::move(doc));
}

void ingest_jsonl(const std::string& data, const std::string& path, const InputSpec& in,
                  const IngestOptions& options, Corpus& corpus, IngestStats& stats) {
  size_t start = 0;
  for (int line_no = 1; start < data.size(); ++line_no) {
    size_t nl = data.find('\n', start);
    if (nl == std::string::npos) nl = data.size();
    const std::string_view line(data.data() + start, nl - start);
    start = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    ++stats.jsonl_records;
    const auto bad = [&](const std::string& why) {
      ++stats.bad_jsonl_records;
      if (stats.first_bad_jsonl.empty()) stats.first_bad_jsonl = fmt::format("{}:{}: {}", path, line_no, why);
    };
    Json rec = Json::parse(line, nullptr, false);
    if (rec.is_discarded() || !rec.is_object()) {
      bad("not a JSON object");
      continue;
    }
    const auto text = rec.find("text");
    if (text == rec.end() || !text->is_string()) {
      bad("no string field \"text\"");
      continue;
    }
    std::string domain = in.domain;
    if (domain.empty()) {
      const auto d = rec.find("domain");
      domain = d != rec.end() && d->is_string() ? d->get<std::string>() : options.default_domain;
      check_domain_name(domain, fmt::format("{}:{}", path, line_no));
    }
    const auto lic = rec.find("license");
    const auto src = rec.find("source");
    std::string source =
        src != rec.end() && src->is_string() ? src->get<std::string>() : fmt::format("{}:{}", path, line_no);
    // A repository name decides deduplication and the split of every file of the repository, so a
    // malformed one is an error in the data, not a record to skip.
    const auto repo = rec.find("repo");
    if (repo != rec.end() && !repo->is_null() && !repo->is_string())
      fail(ExitCode::kData,
           "{}:{}: field \"repo\" is a JSON {}, not a string (the repository name, e.g. "
           "\"owner/name\"); fix the record; nothing written",
           path, line_no, repo->type_name());
    admit(text->get<std::string>(), std::move(source), domain,
          lic != rec.end() && lic->is_string() ? lic->get<std::string>() : "", options, corpus, stats,
          repo != rec.end() && repo->is_string() ? repo->get<std::string>() : "");
  }
}

// Chat and preference: every non-blank line is one record, or a counted malformed line, or a counted
// degenerate record. `record(line, line_no)` parses and admits one line and returns "" or why it is
// malformed; the loop does the counting, the line numbers and the UTF-8 repair both formats share.
template <typename Record>
void ingest_records(const std::string& data, const std::string& path, const IngestOptions& options,
                    IngestStats& stats, const Record& record) {
  ChatIngestStats& cs = stats.chat;
  size_t start = 0;
  for (int line_no = 1; start < data.size(); ++line_no) {
    size_t nl = data.find('\n', start);
    if (nl == std::string::npos) nl = data.size();
    const std::string_view raw(data.data() + start, nl - start);
    start = nl + 1;
    if (raw.find_first_not_of(" \t\r") == std::string_view::npos) {
      ++cs.blank_lines;
      continue;
    }
    ++cs.lines;
    ++stats.jsonl_records;
    const auto bad = [&](const std::string& why) {
      ++cs.malformed_lines;
      ++stats.bad_jsonl_records;
      std::string where = fmt::format("{}:{}: {}", path, line_no, why);
      if (stats.first_bad_jsonl.empty()) stats.first_bad_jsonl = where;
      if (cs.first_malformed.size() < ChatIngestStats::kListedBadLines)
        cs.first_malformed.push_back(std::move(where));
    };
    // Invalid UTF-8 is repaired as in text documents (JSON syntax is ASCII, so repair cannot break it).
    size_t invalid = 0;
    const std::string line = repair_utf8(raw, &invalid);
    if (invalid > 0 &&
        static_cast<double>(invalid) > options.max_invalid_utf8 * static_cast<double>(raw.size())) {
      bad(fmt::format("{} bytes of invalid UTF-8", invalid));
      continue;
    }
    if (const std::string why = record(line, line_no); !why.empty()) {
      bad(why);
      continue;
    }
    if (invalid > 0) ++stats.utf8_repaired;
  }
}

// Each message's content is normalized before its markers are neutralized: normalization removes
// characters (controls, U+200B), so run after the check it could join "<\x01|user|>" into a live marker.
void clean_content(std::string& content, ChatIngestStats& cs) {
  content = normalize_text(content);
  cs.markers_neutralized += neutralize_markers(content);
}

// The domain of a record: the input's, else the record's, else the default.
std::string record_domain(const InputSpec& in, const std::string& from_record, const IngestOptions& options,
                          const std::string& path, int line_no) {
  if (!in.domain.empty()) return in.domain;
  std::string domain = from_record.empty() ? options.default_domain : from_record;
  check_domain_name(domain, fmt::format("{}:{}", path, line_no));
  return domain;
}

// Appends one rendered record (a conversation or a pair) through the byte-level checks.
void admit_record(std::string rendered, const std::string& source, const std::string& domain,
                  const std::string& license, const std::string& path, int line_no,
                  const IngestOptions& options, Corpus& corpus, IngestStats& stats) {
  const size_t before = corpus.docs.size();
  admit(std::move(rendered), source.empty() ? fmt::format("{}:{}", path, line_no) : source, domain, license,
        options, corpus, stats);
  stats.chat.records += corpus.docs.size() - before;
}

void ingest_chat_jsonl(const std::string& data, const std::string& path, const InputSpec& in,
                       const IngestOptions& options, Corpus& corpus, IngestStats& stats) {
  ChatIngestStats& cs = stats.chat;
  ChatRecord rec;
  ingest_records(data, path, options, stats, [&](const std::string& line, int line_no) {
    if (std::string why = parse_chat_line(line, rec); !why.empty()) return why;
    for (auto& m : rec.messages) clean_content(m.content, cs);
    if (const std::string why = chat_degenerate_reason(rec.messages); !why.empty()) {
      ++cs.degenerate[why];
      return std::string();
    }
    admit_record(render_chat(rec.messages), rec.source, record_domain(in, rec.domain, options, path, line_no),
                 rec.license, path, line_no, options, corpus, stats);
    return std::string();
  });
}

// Preference: one Document per pair, holding both rendered halves (render_preference_pair), so that every
// later stage keeps, removes or moves the pair whole; prepare splits it into two documents at encoding.
void ingest_preference_jsonl(const std::string& data, const std::string& path, const InputSpec& in,
                             const IngestOptions& options, Corpus& corpus, IngestStats& stats) {
  ChatIngestStats& cs = stats.chat;
  PreferenceRecord rec;
  ingest_records(data, path, options, stats, [&](const std::string& line, int line_no) {
    if (std::string why = parse_preference_line(line, rec); !why.empty()) return why;
    for (auto& m : rec.prompt) clean_content(m.content, cs);
    clean_content(rec.chosen, cs);
    clean_content(rec.rejected, cs);
    if (const std::string why = preference_degenerate_reason(rec); !why.empty()) {
      ++cs.degenerate[why];
      return std::string();
    }
    admit_record(render_preference_pair(rec), rec.source,
                 record_domain(in, rec.domain, options, path, line_no), rec.license, path, line_no, options,
                 corpus, stats);
    return std::string();
  });
}

// Image-text: one chat Document per record, its pictures into corpus.images. A record naming a picture that
// cannot be read is a malformed line, one whose picture is tiny or extreme a quality drop; either way none
// of its pictures is kept.
void ingest_image_text_jsonl(const std::string& data, const std::string& path, const InputSpec& in,
                             const IngestOptions& options, Corpus& corpus, IngestStats& stats) {
  ChatIngestStats& cs = stats.chat;
  ImageIngestStats& is = stats.images;
  ImageTextRecord rec;
  std::vector<LoadedImage> loaded;
  ingest_records(data, path, options, stats, [&](const std::string& line, int line_no) {
    if (std::string why = parse_image_text_line(line, rec); !why.empty()) return why;
    size_t placeholders = 0;
    for (auto& m : rec.chat.messages) {
      clean_content(m.content, cs);
      placeholders += count_placeholders(m.content);
    }
    if (placeholders != rec.images.size()) {
      ++is.bad["placeholder_mismatch"];
      return fmt::format("{} {} placeholders for {} images", placeholders, kImagePlaceholder,
                         rec.images.size());
    }
    if (const std::string why = chat_degenerate_reason(rec.chat.messages); !why.empty()) {
      ++cs.degenerate[why];
      return std::string();
    }
    loaded.clear();
    for (const auto& ref : rec.images) {
      loaded.push_back(load_record_image(path, ref, options.image));
      const LoadedImage& li = loaded.back();
      is.decode_cpu_seconds += li.cpu_seconds;
      if (li.reason.empty()) continue;
      const bool quality =
          std::find(ImageIngestStats::kQualityReasons.begin(), ImageIngestStats::kQualityReasons.end(),
                    li.reason) != ImageIngestStats::kQualityReasons.end();
      ++(quality ? is.dropped : is.bad)[li.reason];
      return quality ? std::string() : fmt::format("image {}: {} ({})", ref, li.reason, li.detail);
    }
    const size_t before = corpus.docs.size();
    admit_record(render_chat(rec.chat.messages), rec.chat.source,
                 record_domain(in, rec.chat.domain, options, path, line_no), rec.chat.license, path, line_no,
                 options, corpus, stats);
    if (corpus.docs.size() == before) return std::string();
    for (LoadedImage& li : loaded) {
      corpus.docs.back().images.push_back(static_cast<uint32_t>(corpus.images.size()));
      corpus.images.push_back(std::move(li.image));
      ++is.images;
      is.bytes += li.file_bytes;
    }
    return std::string();
  });
}

}  // namespace

InputSpec parse_input_spec(const std::string& arg) {
  InputSpec spec;
  const auto eq = arg.rfind('=');
  if (eq == std::string::npos) {
    spec.path = arg;
  } else {
    spec.path = arg.substr(0, eq);
    spec.domain = arg.substr(eq + 1);
    check_domain_name(spec.domain, "--input " + arg);
  }
  if (spec.path.empty()) fail(ExitCode::kUsage, "--input '{}': empty path", arg);
  return spec;
}

std::string repair_utf8(std::string_view in, size_t* invalid_bytes) {
  std::string out;
  out.reserve(in.size());
  size_t bad = 0, i = 0;
  const size_t n = in.size();
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  while (i < n) {
    const auto c = static_cast<unsigned char>(in[i]);
    if (c < 0x80) {
      // Fast path over ASCII runs.
      size_t j = i + 1;
      while (j < n && static_cast<unsigned char>(in[j]) < 0x80) ++j;
      out.append(in.data() + i, j - i);
      i = j;
      continue;
    }
    int len = 0;
    uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // > U+10FFFF
    }
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(in[i + k]);
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    if (ok) {
      out.append(in.data() + i, len);
      i += len;
    } else {
      out.append(kReplacement, 3);
      ++bad;
      ++i;
    }
  }
  if (invalid_bytes) *invalid_bytes = bad;
  return out;
}

void ingest(const std::vector<InputSpec>& inputs, const IngestOptions& options, Corpus& corpus,
            IngestStats& stats, Ranks& ranks) {
  stats.chat.preference = options.format == "preference";
  // Every rank lists every input (sorted), then reads one contiguous run of files of about equal bytes,
  // so that its documents follow those of the ranks before it in input order.
  struct File {
    size_t input;
    fs::path path;
    uint64_t bytes;
  };
  std::vector<File> files;
  uint64_t total = 0, skipped = 0;
  for (size_t k = 0; k < inputs.size(); ++k)
    for (auto& path : expand(inputs[k], options, &skipped)) {
      std::error_code ec;
      const uint64_t bytes = fs::file_size(path, ec);
      files.push_back({k, std::move(path), ec ? 0 : bytes});
      total += files.back().bytes;
    }
  if (ranks.rank() == 0) stats.skipped_files += skipped;
  const auto R = static_cast<uint64_t>(ranks.size());
  uint64_t mine = 0, before = 0;
  std::vector<const File*> to_read;
  for (const File& f : files) {
    // The rank whose share of the bytes holds the middle of this file.
    const uint64_t middle = before + f.bytes / 2;
    const uint64_t rank = total == 0
                              ? 0
                              : std::min<uint64_t>(R - 1, static_cast<uint64_t>(static_cast<double>(middle) *
                                                                                double(R) / double(total)));
    before += f.bytes;
    if (rank != static_cast<uint64_t>(ranks.rank())) continue;
    to_read.push_back(&f);
    mine += f.bytes;
  }
  ProgressLine progress("prepare ingest", "docs", 0, mine);
  for (const File* f : to_read) {
    const InputSpec& in = inputs[f->input];
    const std::string path = f->path.string();
    std::string data = read_whole(f->path);
    ++stats.files;
    const uint64_t docs_before = corpus.docs.size();
    const uint64_t size = data.size();
    if (options.format == "chat") {
      ingest_chat_jsonl(data, path, in, options, corpus, stats);
    } else if (options.format == "preference") {
      ingest_preference_jsonl(data, path, in, options, corpus, stats);
    } else if (options.format == kImageTextFormat) {
      ingest_image_text_jsonl(data, path, in, options, corpus, stats);
    } else if (lower_extension(f->path) == "jsonl") {
      ingest_jsonl(data, path, in, options, corpus, stats);
    } else {
      admit(std::move(data), path, in.domain.empty() ? options.default_domain : in.domain, "", options,
            corpus, stats, repo_of(in, f->path, options.repo_depth));
    }
    progress.add(corpus.docs.size() - docs_before, size);
  }
  // Domains are numbered in order of first appearance in the input: over the ranks, in rank order.
  if (ranks.size() > 1) {
    Packer names;
    for (const auto& d : corpus.domains) names.put(std::string_view(d));
    std::vector<std::string> global;
    for (const auto& block : ranks.all_gather(names.bytes()))
      for (Unpacker u(block); !u.done();)
        if (std::string name = u.str(); std::find(global.begin(), global.end(), name) == global.end())
          global.push_back(std::move(name));
    if (global.size() > 65535) fail(ExitCode::kUsage, "more than 65535 domains");
    for (auto& doc : corpus.docs)
      doc.domain = static_cast<uint16_t>(std::find(global.begin(), global.end(), corpus.domains[doc.domain]) -
                                         global.begin());
    corpus.domains = std::move(global);
  }
  progress.finish();
  const ChatIngestStats& cs = stats.chat;
  if (options.format != "text" && static_cast<double>(ranks.sum(cs.malformed_lines)) >
                                      options.max_bad_lines * static_cast<double>(ranks.sum(cs.lines)))
    fail(ExitCode::kData,
         "{} of {} {} lines are malformed ({:.3g}%, above --max-bad-lines {:.3g}%); first: {}; fix or "
         "remove them, or raise --max-bad-lines; nothing written",
         cs.malformed_lines, cs.lines, options.format, 100.0 * double(cs.malformed_lines) / double(cs.lines),
         100.0 * options.max_bad_lines, cs.first_malformed.empty() ? "-" : cs.first_malformed.front());
}

Json ChatIngestStats::to_json() const {
  // Every reason of the format is listed, 0 or not, so a report reader need not know which can occur.
  Json degenerate_json = Json::object();
  if (preference) {
    for (const char* reason : kPreferenceDegenerateReasons) degenerate_json[reason] = 0;
  } else {
    for (const char* reason : {"empty_conversation", "no_assistant_turn", "empty_assistant_reply"})
      degenerate_json[reason] = 0;
  }
  for (const auto& [k, v] : degenerate) degenerate_json[k] = v;
  return {{"lines", lines},
          {"blank_lines", blank_lines},
          {"malformed_lines",
           {{"count", malformed_lines},
            {"fraction", lines ? double(malformed_lines) / double(lines) : 0.0},
            {"first", first_malformed}}},
          {"degenerate", degenerate_json},
          {"markers_neutralized", markers_neutralized},
          {preference ? "pairs_ingested" : "conversations_ingested", records}};
}

Json IngestStats::to_json() const {
  Json j = {{"files", files},
            {"skipped_files_by_extension", skipped_files},
            {"jsonl_records", jsonl_records},
            {"bad_jsonl_records", bad_jsonl_records},
            {"documents_in", documents_in},
            {"bytes_in", bytes_in},
            {"documents_out", documents_out},
            {"bytes_out", bytes_out},
            {"utf8_repaired", utf8_repaired},
            {"removed",
             {{"invalid_utf8", dropped_invalid_utf8},
              {"binary_nul", dropped_binary},
              {"long_lines", dropped_long_lines},
              {"too_large", dropped_too_large},
              {"empty", dropped_empty}}}};
  if (!first_bad_jsonl.empty()) j["first_bad_jsonl"] = first_bad_jsonl;
  return j;
}

}  // namespace forge::data
