// The image module (forge/dataio/image.h) against an independent reference: reference/image_reference.py
// wrote PNG and JPEG files of every kind, each decodable one's pixels as PIL decodes them under the header's
// rules, PIL's BILINEAR resizes and its pad, crop and stretch, and the hash sets, into the directory named by
// FORGE_IMAGE_REFERENCE (a ctest fixture runs it first). Decoding must equal PIL exactly (the same libpng and
// libjpeg-turbo, the same accurate integer IDCT and fancy upsampling); resampling within 1 of PIL, which
// rounds to 8 bits between its two passes where resize_image stays in float.
#include "forge/dataio/image.h"
#include "forge/common/error.h"
#include "forge/common/json.h"
#include "support/errors.h"
#include "support/paths.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>

using namespace forge::data;

namespace {

std::string reference(const std::string& name) {
  return forge::test::env_path("FORGE_IMAGE_REFERENCE") + "/" + name;
}

const forge::Json& manifest() {
  static const forge::Json doc = forge::read_json(reference("manifest.json"));
  return doc;
}

std::vector<uint8_t> bytes_of(const std::string& name) {
  const std::string s = forge::read_file(reference(name));
  return {s.begin(), s.end()};
}

DecodeResult decode(const std::string& name, uint64_t max_pixels = kMaxPixels) {
  return decode_image(bytes_of(name), max_pixels);
}

Image raw(const std::string& name, uint32_t width, uint32_t height) {
  Image image{width, height, bytes_of(name)};
  REQUIRE(image.rgb.size() == size_t{3} * width * height);
  return image;
}

const forge::Json& reference_case(const std::string& name) {
  for (const forge::Json& c : manifest()["cases"])
    if (c["name"] == name) return c;
  FAIL("no reference case " << name);
  return manifest();
}

Image expected(const forge::Json& c) {
  return raw(c["pixels"], c["width"], c["height"]);
}

// Sample-wise |a - b| over two pictures of one size.
struct Diff {
  int max = 0;
  uint64_t sum = 0, samples = 0, off = 0, far = 0;  // off: samples that differ at all; far: by more than 2
  void add(const Image& got, const Image& want) {
    REQUIRE(got.width == want.width);
    REQUIRE(got.height == want.height);
    for (size_t i = 0; i < got.rgb.size(); ++i) {
      const int d = std::abs(int(got.rgb[i]) - int(want.rgb[i]));
      max = std::max(max, d);
      sum += d;
      off += d != 0;
      far += d > 2;
    }
    samples += got.rgb.size();
  }
  double mean() const { return samples ? double(sum) / double(samples) : 0.0; }
};

bool is_jpeg(const std::string& name) {
  return name.ends_with(".jpg");
}

uint64_t hex_hash(const forge::Json& v) {
  return std::stoull(v.get<std::string>(), nullptr, 16);
}

void print_histogram(const std::string& what, const std::vector<int>& distances) {
  std::map<int, int> counts;
  for (int d : distances) ++counts[d];
  std::string line;
  for (const auto& [d, n] : counts) line += fmt::format(" {}:{}", d, n);
  fmt::print("{} (distance:count):{}\n", what, line);
}

Image solid(uint32_t width, uint32_t height, std::array<uint8_t, 3> rgb) {
  Image image{width, height, std::vector<uint8_t>(size_t{3} * width * height)};
  for (size_t p = 0; p < image.rgb.size(); p += 3) std::copy(rgb.begin(), rgb.end(), &image.rgb[p]);
  return image;
}

std::array<uint8_t, 3> pixel(const Image& image, uint32_t x, uint32_t y) {
  const size_t p = 3 * (size_t{y} * image.width + x);
  return {image.rgb[p], image.rgb[p + 1], image.rgb[p + 2]};
}

constexpr std::array<uint8_t, 3> kRed = {255, 0, 0}, kBlue = {0, 0, 255}, kFill = {122, 116, 104};

// A blue picture with a 3-pixel red border.
Image bordered(uint32_t width, uint32_t height) {
  Image image = solid(width, height, kRed);
  for (uint32_t y = 3; y + 3 < height; ++y)
    for (uint32_t x = 3; x + 3 < width; ++x)
      std::copy(kBlue.begin(), kBlue.end(), &image.rgb[3 * (y * width + x)]);
  return image;
}

// A JPEG's planes against PIL's YCbCr decode of it: the luma is the stored one in both, exactly; so is
// chroma where it is not subsampled (PIL upsamples it otherwise).
void check_planes(const YCbCrPlanes& planes, const forge::Json& c) {
  const uint32_t width = c["width"], height = c["height"];
  const auto step = c["planes"]["chroma_step"].get<std::array<uint32_t, 2>>();
  REQUIRE(planes.width == width);
  REQUIRE(planes.height == height);
  CHECK(planes.chroma_step == step);
  const Image ycc = raw(c["planes"]["ycbcr"], width, height);
  const int compared = step == std::array<uint32_t, 2>{1, 1} ? 3 : 1;
  for (int p = 0; p < 3; ++p) {
    const YCbCrPlanes::Plane& plane = planes.plane[p];
    const uint32_t sx = p == 0 ? 1 : step[0], sy = p == 0 ? 1 : step[1];
    CHECK(plane.width == (width + sx - 1) / sx);
    CHECK(plane.height == (height + sy - 1) / sy);
    CHECK(plane.stride >= plane.width);
    if (p >= compared) continue;
    int off = 0;
    for (uint32_t y = 0; y < height; ++y)
      for (uint32_t x = 0; x < width; ++x) off += plane.row(y)[x] != ycc.rgb[3 * (size_t{y} * width + x) + p];
    INFO("plane " << p);
    CHECK(off == 0);
  }
}

}  // namespace

TEST_CASE("decode_image: every PNG and JPEG equals PIL's pixels under the header's rules") {
  int png = 0, jpeg = 0;
  for (const forge::Json& c : manifest()["cases"]) {
    if (c["reason"] != "") continue;
    const std::string name = c["name"];
    INFO(name);
    const DecodeResult r = decode(name);
    INFO(r.detail);
    REQUIRE(r.reason.empty());
    // Both sides run the same libjpeg-turbo with the accurate integer IDCT and fancy upsampling, so JPEG
    // pixels are exact too, not merely close.
    Diff diff;
    diff.add(r.image, expected(c));
    CHECK(diff.max == 0);
    ++(is_jpeg(name) ? jpeg : png);
  }
  fmt::print("decode_image: {} PNG and {} JPEG files equal PIL's pixels exactly\n", png, jpeg);
  CHECK(png >= 25);
  CHECK(jpeg >= 12);
}

TEST_CASE(
    "decode_image for a fit: a JPEG reduced by DCT scaling equals PIL's draft, one it cannot reduce "
    "comes back as its planes; a PNG decodes whole") {
  int reduced = 0, planar = 0;
  for (const forge::Json& c : manifest()["cases"]) {
    if (c["reason"] != "") continue;
    const std::string name = c["name"];
    const uint32_t width = c["width"], height = c["height"];
    INFO(name);
    for (const ImageFit fit : {ImageFit::kPad, ImageFit::kCrop, ImageFit::kStretch})
      for (const uint32_t k : {1u, 2u, 4u, 8u}) {
        // The size that makes 1/k the largest reduction whose side the fit resizes from stays >= size.
        const uint32_t from = fit == ImageFit::kPad ? std::max(width, height) : std::min(width, height);
        // (PIL's draft cannot reduce a side below 1 pixel: no reference for a JPEG that thin)
        if (from / k == 0 || (k > 1 && is_jpeg(name) && std::min(width, height) < k)) continue;
        const uint32_t size = from / k;
        INFO(image_fit_name(fit) << " " << size << ", 1/" << k);
        const DecodeResult r = decode_image(bytes_of(name), kMaxPixels, {size, fit});
        REQUIRE(r.reason.empty());
        CHECK(r.stored_width == width);
        CHECK(r.stored_height == height);
        Diff diff;
        if (k == 1 && c.contains("planes")) {
          CHECK(r.image.rgb.empty());
          ++planar;
          check_planes(r.planes, c);
          continue;
        }
        if (k == 1 || !is_jpeg(name)) {
          diff.add(r.image, expected(c));  // whole
        } else {
          const forge::Json* want = nullptr;
          for (const forge::Json& at : c["reduced"])
            if (at["k"] == k) want = &at;
          REQUIRE(want != nullptr);
          diff.add(r.image, raw((*want)["pixels"], (width + k - 1) / k, (height + k - 1) / k));
          ++reduced;
        }
        CHECK(diff.max == 0);
      }
  }
  fmt::print(
      "decode_image for a fit: {} reduced JPEG decodes equal PIL's draft exactly; {} came back as planes\n",
      reduced, planar);
  CHECK(reduced >= 60);
  CHECK(planar >= 30);
}

TEST_CASE("decode_image: EXIF orientation is ignored (pixels as stored)") {
  const DecodeResult r = decode("exif_orientation6.jpg");
  REQUIRE(r.reason.empty());
  CHECK(r.image.width == 48);  // displayed rotated it would be 32 x 48
  CHECK(r.image.height == 32);
}

TEST_CASE("decode_image: refused files get their reason and never throw") {
  int refused = 0;
  for (const forge::Json& c : manifest()["cases"]) {
    if (c["reason"] == "") continue;
    const std::string name = c["name"];
    INFO(name);
    DecodeResult r;
    REQUIRE_NOTHROW(r = decode(name));
    INFO(r.detail);
    CHECK(r.reason == c["reason"].get<std::string>());
    CHECK(!r.detail.empty());
    CHECK(r.image.rgb.empty());
    // Decoded for a fit of its own size: a YCbCr JPEG takes the planar route, and is refused alike.
    const DecodeResult fitted = decode_image(bytes_of(c["file"]), kMaxPixels, {64, ImageFit::kPad});
    CHECK(fitted.reason == r.reason);
    CHECK(fitted.planes.plane[0].bytes.empty());
    ++refused;
  }
  CHECK(refused >= 12);
}

TEST_CASE("decode_image: max_pixels is checked from the header") {
  for (const std::string name : {"rgb8.png", "interlaced_rgb8.png", "baseline.jpg", "progressive.jpg"}) {
    INFO(name);
    const forge::Json& c = reference_case(name);
    const uint64_t pixels = c["width"].get<uint64_t>() * c["height"].get<uint64_t>();
    CHECK(decode(name, pixels).reason.empty());
    const DecodeResult r = decode(name, pixels - 1);
    CHECK(r.reason == "too_large");
    CHECK(r.image.rgb.empty());
  }
  // The bombs end right after their header: without the limit they are merely truncated, so too_large came
  // from the dimensions alone.
  for (const std::string name : {"huge_header.png", "huge_header.jpg"}) {
    INFO(name);
    CHECK(decode(name).reason == "too_large");
    CHECK(decode(name, UINT64_MAX).reason == "undecodable");
  }
}

// Each resize and fit is compared with two of PIL's: BILINEAR on the RGB picture, which rounds to 8 bits
// between its horizontal and vertical passes (the ±0.5 it carries into the second pass moves about one
// sample in seven by 1), and the same kernel on float channels (mode F, not rounded at all), which does
// the arithmetic of resize_image: every sample must be that value rounded to nearest, give or take float
// error at an exact tie (.5), which the rules of image.h make common (upscaling by 2 weighs 1/4 and 3/4).
struct VersusPil {
  Diff rgb;
  double beyond_rounding = 0;  // the most any sample is off PIL's float value beyond 0.5
  void add(const Image& got, const forge::Json& want) {
    Diff d;
    d.add(got, raw(want["pixels"], got.width, got.height));
    CHECK(d.max <= 1);
    rgb.add(got, raw(want["pixels"], got.width, got.height));
    const std::string floats = forge::read_file(reference(want["floats"]));
    REQUIRE(floats.size() == sizeof(float) * got.rgb.size());
    double worst = 0;
    for (size_t i = 0; i < got.rgb.size(); ++i) {
      float v;
      std::memcpy(&v, floats.data() + sizeof v * i, sizeof v);
      worst = std::max(worst, std::abs(double(got.rgb[i]) - v) - 0.5);
    }
    CHECK(worst < 1e-3);
    beyond_rounding = std::max(beyond_rounding, worst);
  }
  void print(const std::string& what) const {
    fmt::print(
        "{:<17} vs PIL BILINEAR: {:>6} samples, max |diff| {}, mean |diff| {:.5f} ({:.3f}% differ); "
        "vs PIL on floats: at most {:.2g} beyond rounding\n",
        what, rgb.samples, rgb.max, rgb.mean(), 100.0 * rgb.off / rgb.samples, beyond_rounding);
  }
};

TEST_CASE("resize_image and fit_image: within 1 of PIL's BILINEAR on every sample") {
  VersusPil resized;
  std::map<std::string, VersusPil> by_fit;
  for (const forge::Json& c : manifest()["cases"]) {
    if (c["reason"] != "") continue;
    INFO(c["name"].get<std::string>());
    const Image source = expected(c);
    for (const forge::Json& t : c["resize"]) {
      INFO("resize to " << t["width"] << " x " << t["height"]);
      resized.add(resize_image(source, t["width"], t["height"]), t);
    }
    for (const forge::Json& f : c["fit"]) {
      const std::string fit = f["fit"];
      INFO(fit << " to " << f["size"]);
      const auto fill = f["fill"].get<std::array<uint8_t, 3>>();
      by_fit[fit].add(fit_image(source, f["size"], parse_image_fit(fit), fill), f);
    }
  }
  resized.print("resize_image");
  CHECK(resized.rgb.mean() < 0.25);
  for (const auto& [fit, v] : by_fit) {
    v.print("fit_image " + fit);
    CHECK(v.rgb.mean() < 0.25);
  }
}

// A JPEG fitted from its planes: where chroma is stored whole (4:4:4) the fit is the reference's float one
// (PIL's mode F on each plane, the fill in YCbCr, JFIF's conversion) rounded, as for RGB; where it is
// subsampled, only luma has a reference, and the picture is compared with PIL's fit of the RGB decode.
TEST_CASE("fit_image of a JPEG's planes: PIL's float fit of the planes rounded; near PIL's fit of its RGB") {
  Diff whole, subsampled;  // against PIL's BILINEAR fit of the RGB decode
  int exact = 0;
  for (const forge::Json& c : manifest()["cases"]) {
    if (!c.contains("planes")) continue;
    const std::string name = c["name"];
    INFO(name);
    const bool chroma_whole = c["planes"]["chroma_step"] == forge::Json::array({1, 1});
    for (const forge::Json& f : c["fit"]) {
      const ImageFit fit = parse_image_fit(f["fit"]);
      const uint32_t size = f["size"];
      INFO(f["fit"].get<std::string>() << " " << size);
      const DecodeResult r = decode_image(bytes_of(name), kMaxPixels, {size, fit});
      REQUIRE(r.reason.empty());
      if (r.planes.plane[0].bytes.empty()) continue;  // reduced by the DCT instead
      const auto fill = f["fill"].get<std::array<uint8_t, 3>>();
      const Image got = fit_image(r, size, fit, fill);
      (chroma_whole ? whole : subsampled).add(got, raw(f["pixels"], size, size));
      if (!chroma_whole) continue;
      for (const forge::Json& want : c["planes"]["fit"]) {
        if (want["fit"] != f["fit"] || want["size"] != size || want["fill"] != f["fill"]) continue;
        const std::string floats = forge::read_file(reference(want["floats"]));
        REQUIRE(floats.size() == sizeof(float) * got.rgb.size());
        double worst = 0;
        for (size_t i = 0; i < got.rgb.size(); ++i) {
          float v;
          std::memcpy(&v, floats.data() + sizeof v * i, sizeof v);
          const double clamped = std::clamp<double>(v, 0, 255);
          worst = std::max(worst, std::abs(double(got.rgb[i]) - clamped) - 0.5);
        }
        CHECK(worst < 1e-3);
        ++exact;
      }
    }
  }
  fmt::print(
      "fit_image of planes vs PIL's fit of the RGB decode: 4:4:4 max |diff| {} mean {:.4f} ({} of {} "
      "beyond 2); subsampled max |diff| {} mean {:.4f} ({} of {} beyond 2)\n",
      whole.max, whole.mean(), whole.far, whole.samples, subsampled.max, subsampled.mean(), subsampled.far,
      subsampled.samples);
  CHECK(exact == 6);
  // Against the RGB route the fit differs where libjpeg clipped a converted pixel to 0..255 before the
  // resampling (here it clips after), which these saturated test pictures do often, and, with subsampled
  // chroma, by the filter: the RGB route upsamples chroma (libjpeg's triangle) before resampling it again.
  // (On bench/image_decode's photo-like 640 x 480 pictures: mean 0.16, max 3.)
  CHECK(whole.mean() < 0.3);
  CHECK(subsampled.mean() < 1.5);
}

namespace {

// Planes sampled from functions of the luma coordinates (u, v) at each sample's centre (a chroma sample's
// is the centre of the luma pixels it covers).
template <typename F>
YCbCrPlanes sampled_planes(uint32_t width, uint32_t height, std::array<uint32_t, 2> step,
                           const std::array<F, 3>& value) {
  YCbCrPlanes planes;
  planes.width = width;
  planes.height = height;
  planes.chroma_step = step;
  for (int p = 0; p < 3; ++p) {
    const uint32_t sx = p == 0 ? 1 : step[0], sy = p == 0 ? 1 : step[1];
    YCbCrPlanes::Plane& plane = planes.plane[p];
    plane.width = (width + sx - 1) / sx;
    plane.height = (height + sy - 1) / sy;
    plane.stride = plane.width + 5;  // as libjpeg's padded rows
    plane.bytes.assign(size_t{plane.stride} * plane.height, 0xEE);
    for (uint32_t j = 0; j < plane.height; ++j)
      for (uint32_t i = 0; i < plane.width; ++i)
        plane.bytes[size_t{plane.stride} * j + i] = value[p](sx * (i + 0.5), sy * (j + 0.5));
  }
  return planes;
}

Image fit_planes(const YCbCrPlanes& planes, uint32_t size, ImageFit fit) {
  DecodeResult r;
  r.planes = planes;
  return fit_image(r, size, fit);
}

}  // namespace

// Subsampled chroma has no outside reference (PIL upsamples it), so its geometry is checked against
// chroma stored whole: a linear ramp is reproduced by the triangle filter away from the edges whatever
// the sampling; a constant one everywhere, also where pad's fill blends with the picture's odd edges.
TEST_CASE("fit_image of planes: subsampled chroma lies where chroma stored whole does") {
  using Fn = std::function<uint8_t(double, double)>;
  const Fn luma_ramp = [](double u, double v) { return uint8_t(20 + 2 * u + 2 * v); };
  const std::array<Fn, 3> ramps = {luma_ramp, [](double u, double) { return uint8_t(60 + 2 * u); },
                                   [](double, double v) { return uint8_t(200 - 2 * v); }};
  std::mt19937 random(11);
  std::vector<uint8_t> noise(64 * 64);
  for (uint8_t& v : noise) v = static_cast<uint8_t>(random());
  const std::array<Fn, 3> flat_chroma = {
      [&](double u, double v) { return noise[size_t(v) * 64 + size_t(u)]; },
      [](double, double) { return uint8_t(90); }, [](double, double) { return uint8_t(170); }};
  for (const auto& [w, h] : {std::pair{37u, 23u}, {23u, 37u}, {40u, 30u}, {29u, 41u}})
    for (const std::array<uint32_t, 2> step : {std::array<uint32_t, 2>{2, 2}, {2, 1}, {1, 2}}) {
      INFO(w << " x " << h << ", chroma every " << step[0] << " x " << step[1]);
      for (const uint32_t size : {16u, 24u, 48u}) {
        INFO("stretch to " << size);
        const Image sub = fit_planes(sampled_planes(w, h, step, ramps), size, ImageFit::kStretch);
        const Image whole = fit_planes(sampled_planes(w, h, {1, 1}, ramps), size, ImageFit::kStretch);
        // Inside: outputs whose kernels reach no edge (support at most 2 chroma samples of 2 pixels).
        const double scale = std::max(double(w), double(h)) / size;
        const auto margin = static_cast<uint32_t>(std::ceil(5 / std::min(1.0, 1 / scale) / scale)) + 1;
        int worst = 0;
        for (uint32_t y = margin; y + margin < size; ++y)
          for (uint32_t x = margin; x + margin < size; ++x)
            for (int c = 0; c < 3; ++c)
              worst = std::max(worst, std::abs(int(pixel(sub, x, y)[c]) - int(pixel(whole, x, y)[c])));
        CHECK(worst <= 1);
      }
      for (const ImageFit fit : {ImageFit::kPad, ImageFit::kCrop, ImageFit::kStretch}) {
        INFO(image_fit_name(fit));
        Diff d;
        d.add(fit_planes(sampled_planes(w, h, step, flat_chroma), 24, fit),
              fit_planes(sampled_planes(w, h, {1, 1}, flat_chroma), 24, fit));
        CHECK(d.max <= 1);
      }
    }
  // A pad's pixels all fill are the fill exactly.
  const Image pad = fit_planes(sampled_planes(40, 20, {2, 2}, flat_chroma), 20, ImageFit::kPad);
  CHECK(pixel(pad, 10, 0) == kFill);
  CHECK(pixel(pad, 10, 19) == kFill);
}

TEST_CASE("pixel_hash and perceptual_hash of a JPEG's planes") {
  const std::string base = manifest()["phash"]["near"]["base"]["file"];
  const std::string q60 = manifest()["phash"]["near"]["jpeg_q60"]["file"];
  const std::vector<uint8_t> bytes = bytes_of(q60);
  const DecodeResult whole = decode_image(bytes);
  REQUIRE(whole.reason.empty());
  const uint32_t side = std::max(whole.image.width, whole.image.height);
  const DecodeResult planes = decode_image(bytes, kMaxPixels, {side, ImageFit::kPad});
  REQUIRE(!planes.planes.plane[0].bytes.empty());
  // The stored luma hashes as the RGB decode's luma does, give or take rounding near the median.
  const int d = hamming_distance(perceptual_hash(planes), perceptual_hash(whole.image));
  fmt::print("perceptual_hash: a JPEG's planes and its RGB decode differ in {} bits\n", d);
  CHECK(d <= 2);
  CHECK(hamming_distance(perceptual_hash(planes), perceptual_hash(decode(base).image)) <= 8);
  // A DecodeResult holding RGB hashes as its picture.
  CHECK(perceptual_hash(whole) == perceptual_hash(whole.image));
  CHECK(pixel_hash(whole) == pixel_hash(whole.image));
  // Planes hash as planes: the same file alike, another file or the RGB decode not.
  CHECK(pixel_hash(planes) == pixel_hash(decode_image(bytes, kMaxPixels, {side, ImageFit::kPad})));
  CHECK(pixel_hash(planes) != pixel_hash(whole.image));
  const std::vector<uint8_t> other = bytes_of("baseline.jpg");
  CHECK(pixel_hash(planes) != pixel_hash(decode_image(other, kMaxPixels, {64, ImageFit::kPad})));
}

TEST_CASE("resize_image: the same size is the identity; constant pictures stay constant") {
  const Image source = expected(reference_case("prime_101x67.png"));
  CHECK(resize_image(source, source.width, source.height).rgb == source.rgb);
  const Image grey = solid(37, 23, {200, 17, 99});
  for (const auto& [w, h] : {std::pair{5u, 90u}, {100u, 3u}, {1u, 1u}})
    CHECK(resize_image(grey, w, h).rgb == solid(w, h, {200, 17, 99}).rgb);
}

TEST_CASE("fit_image: pad keeps the border, crop cuts it, offsets floor((side - w) / 2)") {
  const Image landscape = bordered(91, 60);  // side - h = 31: offset 15
  const Image pad = fit_image(landscape, 91, ImageFit::kPad);
  CHECK(pixel(pad, 45, 14) == kFill);
  CHECK(pixel(pad, 45, 15) == kRed);  // the top border, kept
  CHECK(pixel(pad, 0, 45) == kRed);   // the left border, kept
  CHECK(pixel(pad, 45, 45) == kBlue);
  CHECK(pixel(pad, 45, 74) == kRed);  // the bottom border's last row
  CHECK(pixel(pad, 45, 75) == kFill);
  const Image crop = fit_image(landscape, 60, ImageFit::kCrop);  // columns 15..74
  CHECK(pixel(crop, 0, 30) == kBlue);                            // the left border, cut
  CHECK(pixel(crop, 59, 30) == kBlue);
  CHECK(pixel(crop, 30, 0) == kRed);  // the top border, kept
  CHECK(pixel(crop, 30, 59) == kRed);
  const Image portrait = bordered(60, 91);
  const Image pad_portrait = fit_image(portrait, 91, ImageFit::kPad, {1, 2, 3});
  CHECK(pixel(pad_portrait, 14, 45) == std::array<uint8_t, 3>{1, 2, 3});
  CHECK(pixel(pad_portrait, 15, 45) == kRed);
  CHECK(pixel(fit_image(portrait, 60, ImageFit::kCrop), 30, 0) == kBlue);  // the top border, cut
  const Image stretch = fit_image(landscape, 91, ImageFit::kStretch);
  CHECK(pixel(stretch, 0, 45) == kRed);
  CHECK(pixel(stretch, 45, 0) == kRed);
  // Downscaled: pad's bands of fill stay, crop has no red at its left and right edges.
  const Image small_pad = fit_image(landscape, 30, ImageFit::kPad);
  CHECK(pixel(small_pad, 15, 0) == kFill);
  CHECK(pixel(small_pad, 15, 29) == kFill);
  const Image small_crop = fit_image(landscape, 30, ImageFit::kCrop);
  CHECK(pixel(small_crop, 0, 15) == kBlue);
}

TEST_CASE("resize_image and fit_image refuse empty pictures and sizes") {
  const Image empty;
  CHECK(forge::test::error_of([&] { resize_image(empty, 4, 4); }).code() == forge::ExitCode::kUsage);
  CHECK(forge::test::error_of([&] { fit_image(empty, 4, ImageFit::kPad); }).code() ==
        forge::ExitCode::kUsage);
  const Image one = solid(3, 2, kRed);
  CHECK(forge::test::error_of([&] { resize_image(one, 0, 4); }).code() == forge::ExitCode::kUsage);
  CHECK(forge::test::error_of([&] { fit_image(one, 0, ImageFit::kCrop); }).code() == forge::ExitCode::kUsage);
}

TEST_CASE("pixel_hash: one picture in any lossless file hashes alike; one changed sample does not") {
  const forge::Json& set = manifest()["pixel_hash"];
  const Image picture = raw(set["pixels"], set["width"], set["height"]);
  const uint64_t h = pixel_hash(picture);
  std::set<std::string> files;
  for (const forge::Json& name : set["files"]) {
    INFO(name.get<std::string>());
    files.insert(forge::read_file(reference(name)));
    const DecodeResult r = decode(name);
    REQUIRE(r.reason.empty());
    CHECK(pixel_hash(r.image) == h);
  }
  CHECK(files.size() == set["files"].size());  // the files differ, the pictures do not
  CHECK(pixel_hash(decode_image(encode_png(picture)).image) == h);
  Image changed = picture;
  changed.rgb[3 * (7 * changed.width + 11) + 1] ^= 1;
  CHECK(pixel_hash(changed) != h);
  Image transposed = picture;  // the same bytes as another shape
  std::swap(transposed.width, transposed.height);
  CHECK(pixel_hash(transposed) != h);
}

TEST_CASE("perceptual_hash: near copies within 8 bits, unrelated pictures more than 16 apart") {
  const forge::Json& set = manifest()["phash"];
  std::vector<int> to_reference;
  auto hash_of = [&](const forge::Json& entry) {
    const DecodeResult r = decode(entry["file"]);
    REQUIRE(r.reason.empty());
    const uint64_t h = perceptual_hash(r.image);
    // The reference's hash (PIL's float resize, numpy's DCT) may differ only where a coefficient is within
    // rounding of the median.
    to_reference.push_back(hamming_distance(h, hex_hash(entry["hash"])));
    return h;
  };
  const uint64_t base = hash_of(set["near"]["base"]);
  for (const std::string variant : {"jpeg_q60", "half", "brighter"}) {
    const int d = hamming_distance(base, hash_of(set["near"][variant]));
    fmt::print("perceptual_hash: {} of the base picture differs in {} bits\n", variant, d);
    CHECK(d <= 8);
  }
  for (const forge::Json& entry : set["small"]) hash_of(entry);
  std::vector<uint64_t> unrelated;
  for (const forge::Json& entry : set["unrelated"]) unrelated.push_back(hash_of(entry));
  std::vector<int> pairs;
  for (size_t i = 0; i < unrelated.size(); ++i)
    for (size_t j = i + 1; j < unrelated.size(); ++j)
      pairs.push_back(hamming_distance(unrelated[i], unrelated[j]));
  REQUIRE(pairs.size() == 190);
  print_histogram("perceptual_hash: 190 pairs of unrelated pictures", pairs);
  print_histogram("perceptual_hash: against the reference's hash of the same file", to_reference);
  CHECK(*std::min_element(pairs.begin(), pairs.end()) > 16);
  CHECK(*std::max_element(to_reference.begin(), to_reference.end()) <= 2);
}

TEST_CASE("encode_png: round trips through decode_image and PIL bit-exactly") {
  forge::test::TempDir dir;
  for (const std::string name : {"rgb8.png", "column_1x37.png", "row_53x1.png", "wide_997x5.png",
                                 "photo_300x200.png", "interlaced_3x2.png"}) {
    INFO(name);
    const Image picture = expected(reference_case(name));
    const std::vector<uint8_t> png = encode_png(picture);
    const DecodeResult r = decode_image(png);
    REQUIRE(r.reason.empty());
    CHECK(r.image.width == picture.width);
    CHECK(r.image.height == picture.height);
    CHECK(r.image.rgb == picture.rgb);
    const std::string file = dir / (name + ".encoded.png");
    std::ofstream(file, std::ios::binary)
        .write(reinterpret_cast<const char*>(png.data()), std::streamsize(png.size()));
    const auto check = forge::test::run_command(
        fmt::format("/usr/bin/python3 {} check-png {} {} {} {}",
                    forge::test::source_path("test/dataio/reference/image_reference.py"), file,
                    reference(reference_case(name)["pixels"]), picture.width, picture.height));
    INFO(check.output);
    CHECK(check.code == 0);
  }
}

TEST_CASE("parse_image_fit: the three names, and a usage error naming the bad one and the choices") {
  for (const ImageFit fit : {ImageFit::kPad, ImageFit::kCrop, ImageFit::kStretch})
    CHECK(parse_image_fit(image_fit_name(fit)) == fit);
  const forge::Error e = forge::test::error_of([] { parse_image_fit("letterbox"); });
  CHECK(e.code() == forge::ExitCode::kUsage);
  CHECK(forge::test::mentions(e, "letterbox"));
  for (const char* name : {"pad", "crop", "stretch"}) CHECK(forge::test::mentions(e, name));
}
