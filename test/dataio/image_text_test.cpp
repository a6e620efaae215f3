// The image-text format: `prepare --format image-text` end to end on generated PNG pictures — the pictures
// and their runs in the shards, the mask, bad and dropped pictures by reason, dedup of text with pictures,
// decontamination by picture, --max-tokens cutting a run, the version covering pixels, and the refusals.
#include "forge/dataio/image_text.h"
#include "chat_test_support.h"
#include "forge/common/error.h"
#include "forge/dataio/manifest.h"
#include "forge/dataio/prepare.h"
#include "forge/dataio/reader.h"
#include "forge/dataio/shard.h"
#include "forge/dataio/tokenizer.h"
#include "forge/dataio/verify.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

using namespace forge::data;
using namespace forge::test::chat;
namespace fs = std::filesystem;

namespace {

// A picture with structure a perceptual hash sees: a seeded gradient background and a block of another
// colour at a seeded place.
Image picture(uint32_t w, uint32_t h, uint32_t seed, int brighten = 0) {
  std::mt19937 rng(seed);
  const int base[3] = {int(rng() % 200), int(rng() % 200), int(rng() % 200)};
  const int block[3] = {int(rng() % 256), int(rng() % 256), int(rng() % 256)};
  const uint32_t bx = rng() % (w / 2), by = rng() % (h / 2), bw = w / 3 + rng() % (w / 4), bh = h / 3;
  Image im{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  for (uint32_t y = 0; y < h; ++y)
    for (uint32_t x = 0; x < w; ++x) {
      const bool in = x >= bx && x < bx + bw && y >= by && y < by + bh;
      for (int c = 0; c < 3; ++c) {
        const int v = (in ? block[c] : base[c] + int(40 * x / w) + int(30 * y / h)) + brighten;
        im.rgb[3 * (size_t(y) * w + x) + size_t(c)] = static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
    }
  return im;
}

void write_png(const forge::test::TempDir& tmp, const std::string& name, const Image& im) {
  const std::vector<uint8_t> png = encode_png(im);
  tmp.write(name, std::string(png.begin(), png.end()));
}

std::string caption_line(const std::string& image, const std::string& text) {
  return forge::Json{{"image", image}, {"text", text}}.dump() + "\n";
}

// 40 captioned pictures, 6 two-picture conversations, a text-only conversation, one with a picture in its
// second turn; then one line of each bad
// and dropped kind and the duplicates. What the assertions need to know is kept here.
struct Fixture {
  std::string jsonl;
  std::vector<std::string> good_images;  // the file of every picture kept, in order
};

Fixture write_corpus(const forge::test::TempDir& tmp) {
  std::mt19937 rng(11);
  Fixture c;
  std::string text;
  for (uint32_t i = 0; i < 40; ++i) {
    const std::string name = "img/cap" + std::to_string(i) + ".png";
    write_png(tmp, name, picture(48 + 4 * (i % 5), 40 + 8 * (i % 3), i));
    text += caption_line(name, words(rng, 6 + int(i % 7)));
  }
  for (uint32_t i = 0; i < 6; ++i) {
    const std::string a = "img/pair" + std::to_string(i) + "a.png",
                      b = "img/pair" + std::to_string(i) + "b.png";
    write_png(tmp, a, picture(64, 64, 100 + i));
    write_png(tmp, b, picture(56, 72, 200 + i));
    forge::Json messages = forge::Json::array(
        {{{"role", "user"}, {"content", "Compare <image> with\n<image>. " + words(rng, 5)}},
         {{"role", "assistant"}, {"content", words(rng, 9)}}});
    text += forge::Json{{"image", {a, b}}, {"messages", messages}}.dump() + "\n";
  }
  text += forge::Json{{"image", forge::Json::array()},
                      {"messages", forge::Json::array({{{"role", "user"}, {"content", words(rng, 6)}},
                                                       {{"role", "assistant"}, {"content", words(rng, 6)}}})}}
              .dump() +
          "\n";
  // A picture in a later turn, after a scored reply: a cut inside its run keeps the first reply.
  write_png(tmp, "img/late.png", picture(40, 40, 300));
  text += forge::Json{{"image", "img/late.png"},
                      {"messages", forge::Json::array({{{"role", "user"}, {"content", words(rng, 4)}},
                                                       {{"role", "assistant"}, {"content", words(rng, 4)}},
                                                       {{"role", "user"}, {"content", "And <image>?"}},
                                                       {{"role", "assistant"}, {"content", words(rng, 5)}}})}}
              .dump() +
          "\n";
  // Bad lines (lines 49-52) and dropped pictures (53-54).
  const std::vector<uint8_t> whole = encode_png(picture(40, 40, 77));
  tmp.write("img/garbage.png", std::string(whole.begin(), whole.begin() + 90));  // truncated
  text += caption_line("img/missing.png", "a caption of nothing");
  text += caption_line("img/garbage.png", "a caption of garbage");
  text += forge::Json{{"image", "img/cap1.png"},
                      {"messages", forge::Json::array({{{"role", "user"}, {"content", "no placeholder"}},
                                                       {{"role", "assistant"}, {"content", "hm"}}})}}
              .dump() +
          "\n";
  text += "{\"image\": 7, \"text\": \"not a path\"}\n";
  write_png(tmp, "img/tiny.png", picture(8, 8, 5));
  write_png(tmp, "img/wide.png", picture(200, 20, 6));
  text += caption_line("img/tiny.png", "too small to see");
  text += caption_line("img/wide.png", "a banner");
  // Duplicates: cap3 again with its caption re-read from the file (exact), and a brightened cap4 with the
  // same caption (near); cap5 with another caption stays (another sample of the same picture).
  write_png(tmp, "img/cap4-bright.png", picture(48 + 4 * 4, 40 + 8 * 1, 4, 6));
  c.jsonl = tmp.write("data/captions.jsonl", "");
  {
    // Copy the caption lines of cap3 and cap4 from what was written.
    size_t line_start = 0;
    std::vector<std::string> lines;
    for (size_t nl; (nl = text.find('\n', line_start)) != std::string::npos; line_start = nl + 1)
      lines.push_back(text.substr(line_start, nl - line_start));
    text += lines[3] + "\n";
    forge::Json bright = forge::Json::parse(lines[4]);
    bright["image"] = "img/cap4-bright.png";
    text += bright.dump() + "\n";
    text += caption_line("img/cap5.png", "another caption of the fifth picture");
  }
  // Paths are relative to the JSONL file's directory: the file lives beside img/.
  fs::remove(c.jsonl);
  c.jsonl = tmp.write("captions.jsonl", text);
  return c;
}

PrepareOptions image_options(const std::string& input, const std::string& out) {
  PrepareOptions o;
  o.inputs = {{input, "vision"}};
  o.out = out;
  o.ingest.format = kImageTextFormat;
  o.ingest.max_bad_lines = 0.2;
  o.ingest.image.size = 32;
  o.ingest.image.patch = 8;  // 16 positions per picture
  o.tokenizer.vocab = 300;
  o.valid_fraction = 0.1;
  o.threads = 1;
  return o;
}

struct Stored {
  std::vector<std::vector<uint32_t>> docs;
  std::vector<std::vector<uint8_t>> masks;
  uint64_t pictures = 0;
};

// Every shard of the dataset, checked for runs against its pictures on the way.
Stored read_all(const std::string& dir) {
  const Manifest m = load_manifest(dir);
  const auto id = m.settings["image"]["token_id"].get<uint32_t>();
  const auto tokens = m.settings["image"]["tokens"].get<uint64_t>();
  Stored s;
  for (const auto& e : m.shards) {
    ShardLayout layout;
    const ShardData d = read_shard((fs::path(dir) / e.file).string(), &layout);
    s.pictures += d.image_positions.size();
    CHECK(d.images.size() == d.image_positions.size() * 32 * 32 * 3);
    for (const uint64_t at : d.image_positions)
      for (uint64_t t = at; t < at + tokens; ++t) {
        REQUIRE(d.tokens[t] == id);
        REQUIRE(d.loss_mask[t] == 0);
      }
    for (size_t k = 0; k + 1 < d.doc_offsets.size(); ++k) {
      s.docs.emplace_back(d.tokens.begin() + int64_t(d.doc_offsets[k]),
                          d.tokens.begin() + int64_t(d.doc_offsets[k + 1]));
      s.masks.emplace_back(d.loss_mask.begin() + int64_t(d.doc_offsets[k]),
                           d.loss_mask.begin() + int64_t(d.doc_offsets[k + 1]));
    }
  }
  return s;
}

}  // namespace

TEST_CASE("image-text records parse as captions and conversations, with placeholders counted") {
  ImageTextRecord rec;
  REQUIRE(parse_image_text_line(R"({"image": "a.png", "text": "a cat"})", rec).empty());
  REQUIRE(rec.images == std::vector<std::string>{"a.png"});
  REQUIRE(rec.chat.messages.size() == 2);
  CHECK(rec.chat.messages[0].content == "<image>");
  CHECK(rec.chat.messages[1].content == "a cat");
  REQUIRE(
      parse_image_text_line(R"({"image": ["a.png", "b.png"], "text": "two", "domain": "web"})", rec).empty());
  CHECK(rec.chat.messages[0].content == "<image>\n<image>");
  CHECK(rec.chat.domain == "web");
  REQUIRE(
      parse_image_text_line(
          R"({"image": ["a.png"], "messages": [{"role": "user", "content": "What is <image>?"}, {"role": "assistant", "content": "A cat."}]})",
          rec)
          .empty());
  CHECK(count_placeholders(rec.chat.messages[0].content) == 1);
  CHECK(parse_image_text_line(R"({"text": "x"})", rec).find("image") != std::string::npos);
  CHECK(parse_image_text_line(R"({"image": "a.png"})", rec).find("text") != std::string::npos);
  CHECK(parse_image_text_line(R"({"image": [1], "text": "x"})", rec).find("non-string") != std::string::npos);
  CHECK(!parse_image_text_line("[1, 2]", rec).empty());
}

TEST_CASE("expand_image_tokens gives each placeholder its run, unscored") {
  std::vector<uint32_t> ids = {5, 9, 6, 9, 9, 7};
  std::vector<uint8_t> mask = {0, 1, 1, 1, 1, 1};
  const auto starts = expand_image_tokens(ids, mask, 9, 3);
  CHECK(starts == std::vector<uint64_t>{1, 5, 8});
  CHECK(ids == std::vector<uint32_t>{5, 9, 9, 9, 6, 9, 9, 9, 9, 9, 9, 7});
  CHECK(mask == std::vector<uint8_t>{0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1});
}

TEST_CASE("prepare --format image-text stores fitted pictures beside their runs and counts what it dropped") {
  forge::test::TempDir tmp;
  const Fixture c = write_corpus(tmp);
  const PrepareResult r = prepare_dataset(image_options(c.jsonl, tmp / "ds"));
  const forge::Json& q = r.quality;
  INFO(q.dump(1));
  const forge::Json& images = q["image-text"]["images"];
  CHECK(images["bad"]["missing_file"] == 1);
  CHECK(images["bad"]["undecodable"] == 1);
  CHECK(images["bad"]["placeholder_mismatch"] == 1);
  CHECK(images["dropped"]["tiny"] == 1);
  CHECK(images["dropped"]["extreme_aspect"] == 1);
  CHECK(q["image-text"]["malformed_lines"]["count"] == 4);  // the three bad pictures and "image": 7
  const auto first = q["image-text"]["malformed_lines"]["first"].get<std::vector<std::string>>();
  CHECK(first.at(0).find("captions.jsonl:49: image img/missing.png: missing_file") != std::string::npos);
  const forge::Json& dedup = q["stages"]["image_dedup"];
  CHECK(dedup["removed"]["exact_duplicate"] == 1);
  CHECK(dedup["removed"]["same_text_near_pictures"] == 1);
  CHECK(dedup["repeated_pictures"] == 1);  // cap5 under two captions
  CHECK(q["stages"]["exact_dedup"].contains("skipped"));

  // 40 captions + 6 conversations + text-only + late picture + cap5's second caption; 40 + 12 + 1 + 1
  // pictures.
  const Stored s = read_all(r.dataset_dir);
  CHECK(s.docs.size() == 49);
  CHECK(s.pictures == 54);
  CHECK(images["images"] == 40 + 12 + 1 + 1 + 2);  // ingested: the duplicates' pictures go at dedup
  for (size_t k = 0; k < s.docs.size(); ++k)
    CHECK(std::count(s.masks[k].begin(), s.masks[k].end(), uint8_t{1}) > 0);
  verify_dataset(r.dataset_dir);
  verify_chat_masks(r.dataset_dir);
  verify_image_runs(r.dataset_dir);

  // The stored pixels are the fitted source: find cap7 (unique caption) by its pixels.
  const Image source = picture(48 + 4 * 2, 40 + 8 * 1, 7);
  const std::vector<uint8_t> fitted = fit_image(source, 32, ImageFit::kPad).rgb;
  bool found = false;
  for (const auto& e : load_manifest(r.dataset_dir).shards) {
    const ShardData d = read_shard((fs::path(r.dataset_dir) / e.file).string());
    for (size_t k = 0; k < d.image_positions.size(); ++k)
      found |= std::equal(fitted.begin(), fitted.end(), d.images.begin() + int64_t(k * fitted.size()));
  }
  CHECK(found);
}

TEST_CASE("an image-text dataset's version covers the pixels, and a cut inside a picture drops it") {
  forge::test::TempDir tmp;
  const Fixture c = write_corpus(tmp);
  const PrepareResult a = prepare_dataset(image_options(c.jsonl, tmp / "a"));
  // A white corner: what the shards store of cap7 changes.
  Image changed = picture(48 + 4 * 2, 40 + 8 * 1, 7);
  for (uint32_t y = 0; y < 8; ++y)
    std::fill_n(changed.rgb.begin() + 3 * y * changed.width, 3 * 8, uint8_t{255});
  write_png(tmp, "img/cap7.png", changed);
  const PrepareResult b = prepare_dataset(image_options(c.jsonl, tmp / "b"));
  CHECK(a.version != b.version);

  // 28 tokens: a caption keeps its picture (positions 1-16) and the start of its reply; the late picture
  // (from about position 18) is cut inside its run and goes, its first reply stays.
  PrepareOptions o = image_options(c.jsonl, tmp / "cut");
  o.chat.max_tokens = 28;
  const PrepareResult cut = prepare_dataset(o);
  const auto id = load_manifest(cut.dataset_dir).settings["image"]["token_id"].get<uint32_t>();
  const Stored s = read_all(cut.dataset_dir);
  uint64_t runs = 0;
  for (const auto& doc : s.docs) {
    CHECK(doc.size() <= 28);
    const auto placeholders = static_cast<uint64_t>(std::count(doc.begin(), doc.end(), id));
    CHECK(placeholders % 16 == 0);
    runs += placeholders / 16;
  }
  CHECK(runs == s.pictures);
  CHECK(s.docs.size() >= 42);  // the captions, the text-only and the late-picture conversation
  CHECK(cut.quality["image-text"]["truncation"]["truncated"].get<uint64_t>() >= 41);
  verify_chat_masks(cut.dataset_dir);
  verify_image_runs(cut.dataset_dir);
}

TEST_CASE("image-text decontamination removes documents showing an eval picture") {
  forge::test::TempDir tmp;
  const Fixture c = write_corpus(tmp);
  // The eval set shows cap9 re-encoded a little brighter: a near duplicate by perceptual hash.
  write_png(tmp, "eval/q.png", picture(48 + 4 * 4, 40 + 8 * 0, 9, 4));
  const std::string eval = tmp.write("eval/vqa.jsonl", R"({"image": "q.png", "prompt": "What colour?"})"
                                                       "\n");
  PrepareOptions o = image_options(c.jsonl, tmp / "ds");
  o.eval_sets = {eval};
  const PrepareResult r = prepare_dataset(o);
  CHECK(r.quality["stages"]["image_decontam"]["removed"]["contaminated_picture"] == 1);
  CHECK(read_all(r.dataset_dir).docs.size() == 48);

  tmp.write("eval/bad.jsonl", R"({"image": "nope.png", "prompt": "?"})"
                              "\n");
  o.out = tmp / "ds2";
  o.eval_sets = {tmp / "eval/bad.jsonl"};
  expect_error(forge::ExitCode::kData, [&] { prepare_dataset(o); }, {"bad.jsonl:1", "nope.png"});
  CHECK(!fs::exists(tmp / "ds2"));
}

TEST_CASE("image-text refusals: too many bad lines, bad image keys, a tokenizer without the placeholder") {
  forge::test::TempDir tmp;
  const Fixture c = write_corpus(tmp);
  PrepareOptions o = image_options(c.jsonl, tmp / "ds");
  o.ingest.max_bad_lines = 0.01;
  expect_error(forge::ExitCode::kData, [&] { prepare_dataset(o); }, {"malformed", "captions.jsonl:49"});
  CHECK(!fs::exists(tmp / "ds"));

  o = image_options(c.jsonl, tmp / "ds");
  o.ingest.image.patch = 10;
  expect_error(forge::ExitCode::kUsage, [&] { prepare_dataset(o); }, {"image.size", "image.patch"});

  // A chat dataset's tokenizer has the chat markers but no picture placeholder.
  std::mt19937 rng(5);
  std::string chat;
  for (int i = 0; i < 40; ++i)
    chat +=
        forge::Json{{"messages", forge::Json::array({{{"role", "user"}, {"content", words(rng, 8)}},
                                                     {{"role", "assistant"}, {"content", words(rng, 8)}}})}}
            .dump() +
        "\n";
  PrepareOptions chat_options = image_options(tmp.write("chat.jsonl", chat), tmp / "chat");
  chat_options.ingest.format = "chat";
  const PrepareResult text_only = prepare_dataset(chat_options);
  o = image_options(c.jsonl, tmp / "ds");
  o.tokenizer_model = (fs::path(text_only.dataset_dir) / "tokenizer.model").string();
  expect_error(forge::ExitCode::kUsage, [&] { prepare_dataset(o); }, {"<image>", "tokenizer.model"});
  CHECK(!fs::exists(tmp / "ds"));
}

TEST_CASE("the reader serves conversations with their pictures whole, in order after a resume") {
  forge::test::TempDir tmp;
  const Fixture c = write_corpus(tmp);
  PrepareOptions o = image_options(c.jsonl, tmp / "ds");
  o.valid_fraction = 0;
  const PrepareResult r = prepare_dataset(o);
  const Manifest m = load_manifest(r.dataset_dir);
  const auto id = m.settings["image"]["token_id"].get<int32_t>();
  std::vector<std::vector<uint8_t>> stored;  // every picture of the split
  for (const auto& e : m.shards) {
    const ShardData d = read_shard((fs::path(r.dataset_dir) / e.file).string());
    for (size_t k = 0; k < d.image_positions.size(); ++k)
      stored.emplace_back(d.images.begin() + int64_t(k * 32 * 32 * 3),
                          d.images.begin() + int64_t((k + 1) * 32 * 32 * 3));
  }
  ReaderOptions ro;
  ro.seq_len = 48;
  ro.global_batch = 4;
  ro.document_mask = ro.loss_mask = true;
  ro.prefetch = 0;
  Reader reader(r.dataset_dir, ro);
  std::vector<forge::MicroBatch> epoch;
  uint64_t delivered = 0;
  for (uint64_t seen = 0; seen < reader.samples_per_epoch(); seen += ro.global_batch) {
    epoch.push_back(reader.next());
    const forge::MicroBatch& b = epoch.back();
    INFO("batch " << epoch.size());
    REQUIRE(!b.problem(int(m.vocab_size), 48));
    REQUIRE(b.image_tokens == 16);
    for (size_t k = 0; k < b.images(); ++k) {
      for (int t = 0; t < 16; ++t) REQUIRE(b.inputs[size_t(b.image_starts[k] + t)] == id);
      const std::vector<uint8_t> pixels(b.image_pixels.begin() + int64_t(k * b.image_bytes()),
                                        b.image_pixels.begin() + int64_t((k + 1) * b.image_bytes()));
      CHECK(std::find(stored.begin(), stored.end(), pixels) != stored.end());
      // Never scored: the targets up to the run's last position predict placeholders.
      for (int t = -1; t < 15; ++t)
        if (b.image_starts[k] + t >= 0)
          CHECK(b.target(size_t(b.image_starts[k] + t)) == forge::MicroBatch::kIgnore);
    }
    for (size_t k = 0; k < b.images(); ++k) delivered += b.epochs[size_t(b.image_starts[k] / 48)] == 0;
  }
  // Every conversation is read once per epoch with its pictures (each fits a 48-token window whole), but
  // the stream's last (cap5's second caption), whose window would run past the end: it is left out as the
  // last partial window of a text stream is.
  CHECK(delivered == stored.size() - 1);

  // A reader resumed at the third batch reads the same rows and the same pictures.
  Reader resumed(r.dataset_dir, ro);
  forge::data::Cursor at = resumed.cursor();
  at.samples = 2 * ro.global_batch;
  resumed.seek(at);
  const forge::MicroBatch again = resumed.next();
  CHECK(again.inputs == epoch[2].inputs);
  CHECK(again.image_starts == epoch[2].image_starts);
  CHECK(again.image_pixels == epoch[2].image_pixels);
  // The batch bytes a checkpoint keeps carry the pictures.
  const forge::MicroBatch copy = forge::MicroBatch::deserialize(epoch[2].serialize());
  CHECK(copy.image_starts == epoch[2].image_starts);
  CHECK(copy.image_pixels == epoch[2].image_pixels);
  // Random access puts a sample's pictures in its row.
  forge::MicroBatch one = epoch[2];
  reader.read_sample(epoch[2].sample_ids[1], one, 1);
  CHECK(one.image_starts == epoch[2].image_starts);
  CHECK(one.image_pixels == epoch[2].image_pixels);

  ro.loss_mask = false;
  expect_error(forge::ExitCode::kUsage, [&] { Reader(r.dataset_dir, ro); }, {"image-text", "loss_mask"});
}
