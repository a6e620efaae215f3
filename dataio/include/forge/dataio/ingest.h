// Stage 1: read plain-text files, JSONL records and directories (recursively, by extension) into a Corpus.
// Broken input is repaired or dropped, never passed on silently: every case has a counter.
// With format "chat" every file is JSONL of conversations (forge/dataio/chat.h); each usable one becomes
// one Document holding the rendered template. With format "preference" every file is JSONL of pairs; each
// usable one becomes one Document holding both rendered halves (render_preference_pair), so the cleaning
// stages keep or remove a pair whole. With format "image-text" every file is JSONL of captions or
// conversations about pictures (forge/dataio/image_text.h): each usable one becomes one chat Document, its
// pictures decoded and fitted into Corpus::images.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/document.h"
#include "forge/dataio/image_text.h"
#include "forge/dataio/ranks.h"

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

// One `--input PATH[=DOMAIN]`.
struct InputSpec {
  std::string path;
  std::string domain;  // "" = from the JSONL record, else IngestOptions::default_domain
};
InputSpec parse_input_spec(const std::string& arg);

struct IngestOptions {
  std::vector<std::string> extensions;  // lower-case, without dot; "" matches files without one
  size_t max_doc_bytes = 16 << 20;      // larger documents are dropped
  size_t max_line_bytes = 1 << 20;      // a longer line drops the document
  double max_invalid_utf8 = 0.01;       // above this fraction of bad bytes a document is dropped
  double max_nul = 0.001;               // above this fraction of NUL bytes a document is binary
  std::string default_domain = "text";
  // Files of an input directory belong to the repository named by their first `repo_depth` directories
  // below it (2 for a layout DIR/owner/name/...; 0 = no repositories from the layout). JSONL records name
  // theirs in a "repo" field.
  int repo_depth = 0;
  std::string format = "text";  // "text", "chat", "preference" or "image-text"
  // chat and preference: above this fraction of malformed (non-blank) lines `ingest` fails with kData, naming
  // the count, the fraction and the first bad line; at or below it they are counted and listed.
  double max_bad_lines = 0.001;
  ImageOptions image;  // image-text only
};

// What chat or preference ingestion saw; every line not turned into a conversation (a pair) is counted
// under one reason.
struct ChatIngestStats {
  static constexpr size_t kListedBadLines = 20;
  bool preference = false;  // the lines are preference pairs
  uint64_t lines = 0, blank_lines = 0, malformed_lines = 0, markers_neutralized = 0;
  uint64_t records = 0;                        // conversations (chat) or pairs (preference) ingested
  std::map<std::string, uint64_t> degenerate;  // by chat_degenerate_reason / preference_degenerate_reason
  std::vector<std::string> first_malformed;    // "file:line: why", the first kListedBadLines
  Json to_json() const;
};

struct IngestStats {
  uint64_t files = 0, skipped_files = 0, jsonl_records = 0, bad_jsonl_records = 0;
  uint64_t documents_in = 0, bytes_in = 0, documents_out = 0, bytes_out = 0;
  uint64_t utf8_repaired = 0, dropped_invalid_utf8 = 0, dropped_binary = 0, dropped_long_lines = 0,
           dropped_too_large = 0, dropped_empty = 0;
  std::string first_bad_jsonl;  // "file:line: why"
  ChatIngestStats chat;         // formats "chat", "preference" and "image-text" only
  ImageIngestStats images;      // format "image-text" only
  Json to_json() const;
};

// Replaces each invalid UTF-8 sequence (also overlong forms, surrogates, > U+10FFFF) with U+FFFD.
// `invalid_bytes` counts the bytes replaced.
std::string repair_utf8(std::string_view in, size_t* invalid_bytes);

// Reads every input. Missing or unreadable paths throw forge::Error (kUsage / kIo) naming the path; chat or
// preference input with too many malformed lines throws kData (IngestOptions::max_bad_lines). On one rank
// of a distributed prepare: a contiguous run of the input files of about 1/size() of the bytes, following
// the files of the ranks before it; domains are numbered as one process would number them.
void ingest(const std::vector<InputSpec>& inputs, const IngestOptions& options, Corpus& corpus,
            IngestStats& stats, Ranks& ranks = single_rank());

}  // namespace forge::data
