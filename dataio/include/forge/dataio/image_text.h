// The image-text format (docs/DATA.md, "Image-text data"): captions and conversations about pictures. A
// record is JSONL with "image" (a path relative to the JSONL file, or a list of them) and either "text" (a
// caption: one user turn of placeholders, the caption as the reply) or "messages" (a conversation whose
// contents hold one kImagePlaceholder per image, in order). Each record becomes one chat Document (the
// placeholders kept in its text) and its images one CorpusImage each, decoded and fitted to the encoder's
// square input at ingest. In the shards every placeholder becomes ImageOptions::tokens() positions of the
// tokenizer's placeholder id, unscored; /image_positions says where each image's run starts and /images
// holds its pixels.
#pragma once

#include "forge/common/json.h"
#include "forge/dataio/chat.h"
#include "forge/dataio/dedup.h"
#include "forge/dataio/document.h"
#include "forge/dataio/image.h"

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace forge::data {

class Tokenizer;

inline constexpr const char* kImageTextFormat = "image-text";
inline constexpr std::string_view kImagePlaceholder = "<image>";

// The [image] keys of prepare (prepare_schema); part of the dataset's settings and so of its version.
struct ImageOptions {
  uint32_t size = 224;  // the encoder's input side: every stored image is size x size x 3 bytes
  uint32_t patch = 14;  // the encoder's patch side: an image is (size / patch)^2 token positions
  ImageFit fit = ImageFit::kPad;
  uint32_t min_side = 16;            // a smaller source side: dropped as "tiny"
  double max_aspect = 4.0;           // longer over shorter side above this: dropped as "extreme_aspect"
  uint64_t max_pixels = kMaxPixels;  // larger sources: bad ("too_large"), refused from the header
  int near_distance = 6;             // perceptual-hash bits within which two pictures are near duplicates

  uint32_t tokens() const { return (size / patch) * (size / patch); }
  Json to_json() const;
};

// forge::Error(kUsage) naming the keys when the options cannot describe an encoder's input (size not a
// multiple of patch, sizes out of range).
void check_image_options(const ImageOptions& options);

struct ImageTextRecord {
  std::vector<std::string> images;  // as written in the record
  ChatRecord chat;                  // a caption becomes {user: placeholders, assistant: caption}
};

// Parses one line. Returns "" or why it is malformed: what parse_chat_line says, no "image" string or list
// of strings, or neither a string "text" nor "messages". The placeholders are counted by the caller, after
// the contents are cleaned (normalization could make one of a look-alike).
std::string parse_image_text_line(std::string_view line, ImageTextRecord& record);

// Placeholders in `text`.
size_t count_placeholders(std::string_view text);

// What image ingestion saw; a record with a bad image is a malformed line (counted against
// --max-bad-lines), one with a tiny or extreme image a quality drop.
struct ImageIngestStats {
  static constexpr std::array<const char*, 7> kBadReasons = {
      "missing_file",      "unreadable", "unsupported_format",  "undecodable",
      "unsupported_color", "too_large",  "placeholder_mismatch"};
  static constexpr std::array<const char*, 2> kQualityReasons = {"tiny", "extreme_aspect"};
  uint64_t images = 0, bytes = 0;  // decoded and kept, and their file bytes
  std::map<std::string, uint64_t> bad, dropped;
  double decode_cpu_seconds = 0;
  Json to_json() const;
};

// One image named by a record of `jsonl_path` (relative to its directory, or absolute): read, decoded,
// checked and fitted. `reason` is "" or one of ImageIngestStats's bad or quality reasons, `detail` what the
// bad-line listing shows.
struct LoadedImage {
  CorpusImage image;
  std::string reason, detail;
  uint64_t file_bytes = 0;
  double cpu_seconds = 0;  // reading, decoding, hashing and fitting it
};
LoadedImage load_record_image(const std::filesystem::path& jsonl_path, const std::string& ref,
                              const ImageOptions& options);

// Image-text dedup, instead of the text stages (whose unit, the text, would call two questions about two
// pictures duplicates): a document is removed as an exact duplicate of an earlier one with the same text
// and the same pictures (pixel_hash), and as a near duplicate of one with the same text and every picture
// near (perceptual hashes within near_distance bits), or the same pictures and near text (MinHash at
// `minhash`'s threshold; text-only records, which all share the empty set of pictures, only exactly). Reports
// pictures that repeat across documents too (kept: a picture with two
// captions is two samples).
Json dedup_image_text(Corpus& corpus, const MinHashOptions& minhash, int near_distance);

// The perceptual hashes of the pictures of eval sets: records of JSONL eval files with an "image" field
// (paths relative to the file). Bad images there are an error (forge::Error(kData) naming file and line):
// decontamination must not silently check less than it says.
std::vector<uint64_t> load_eval_images(const std::vector<std::string>& files, const ImageOptions& options);

// Removes documents with a picture within near_distance bits of an eval picture.
Json decontaminate_images(Corpus& corpus, std::span<const uint64_t> eval_hashes, int near_distance);

// The placeholder's id in `tokenizer`: a piece it produces for kImagePlaceholder wherever it occurs.
// forge::Error(kUsage) naming `model_path` and the fix otherwise.
uint32_t image_token_id(const Tokenizer& tokenizer, const std::string& model_path);

// Each occurrence of image_id in `ids` (one per picture) becomes `tokens` of them; `mask`, when not empty,
// gets 0 there. Returns the start of each run.
std::vector<uint64_t> expand_image_tokens(std::vector<uint32_t>& ids, std::vector<uint8_t>& mask,
                                          uint32_t image_id, uint32_t tokens);

// For an image-text dataset: every shard's /image_positions are runs of `tokens` placeholder ids inside
// one document each, unscored, every placeholder id of the shard in one of them, and /images holds one
// size x size picture per run. forge::Error(kData) names the shard and the problem.
void verify_image_runs(const std::string& dataset_dir);

}  // namespace forge::data
