// Images of image-text datasets on one core: photo-like pictures (smooth shading, edges, texture and sensor
// grain, so JPEG and PNG are not trivially small) encoded as JPEG (libjpeg-turbo, quality 90, 4:2:0) and as
// PNG (encode_png), then, per format and in images per CPU-second (this thread's CPU time):
//   (a) the library's own decode straight into a buffer (libjpeg-turbo / libpng called here directly),
//   (b) decode_image, (c) decode_image for the fit (a JPEG reduced by DCT scaling where large enough, else
//   as its YCbCr planes: what prepare does) + fit_image to 224 and 336 (pad, the default; crop at 224), and
//   at pad 224 and 336 decoded whole to RGB (the previous rules), (d) perceptual_hash of a decoded picture,
//   alone, (e) prepare's whole work on a picture at pad 336: decode for the fit, both hashes, the fit.
// Each figure is the best of PASSES passes over all files (the machine is shared). bench/image_decode.sh
// runs it.
//
// usage: bench_image_decode [IMAGES] [WIDTH] [HEIGHT] [PASSES]   (default 200 images, half JPEG and half PNG,
//                                                               of 640 x 480, 3 passes)
#include "forge/dataio/image.h"

#include <fmt/format.h>
#include <png.h>
#include <time.h>

// jpeglib.h needs FILE and size_t declared before it.
#include <cstdio>

#include <jpeglib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace forge::data;
using Bytes = std::vector<uint8_t>;

namespace {

double thread_cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Smooth shading (a few random waves per channel), soft-edged discs, a fine texture and grain.
Image photo(uint32_t width, uint32_t height, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  std::normal_distribution<float> grain(0, 4);
  struct Wave {
    float fx, fy, phase, amp;
  };
  std::vector<Wave> waves[3];
  for (auto& w : waves)
    for (int i = 0; i < 4; ++i)
      w.push_back({u(rng) * 0.03f, u(rng) * 0.03f, u(rng) * 6.28f, 20 + u(rng) * 30});
  struct Disc {
    float x, y, r, rgb[3];
  };
  std::vector<Disc> discs(6);
  for (auto& d : discs)
    d = {u(rng) * width, u(rng) * height, 20 + u(rng) * 120, {255 * u(rng), 255 * u(rng), 255 * u(rng)}};
  const float texture = 0.3f + u(rng);
  Image image{width, height, std::vector<uint8_t>(size_t{3} * width * height)};
  for (uint32_t y = 0; y < height; ++y)
    for (uint32_t x = 0; x < width; ++x) {
      float v[3];
      for (int c = 0; c < 3; ++c) {
        v[c] = 128;
        for (const Wave& w : waves[c]) v[c] += w.amp * std::sin(w.fx * x + w.fy * y + w.phase);
      }
      for (const Disc& d : discs) {
        const float a = std::clamp((d.r - std::hypot(x - d.x, y - d.y)) / 3, 0.0f, 1.0f);
        for (int c = 0; c < 3; ++c) v[c] = v[c] * (1 - a) + d.rgb[c] * a;
      }
      const float fine = 12 * std::sin(texture * x) * std::sin(texture * 1.3f * y);
      for (int c = 0; c < 3; ++c)
        image.rgb[3 * (size_t{y} * width + x) + c] =
            static_cast<uint8_t>(std::clamp(v[c] + fine + grain(rng), 0.0f, 255.0f));
    }
  return image;
}

Bytes encode_jpeg(const Image& image, int quality) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);  // the default handler exits: acceptable in a benchmark
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &out, &size);
  cinfo.image_width = image.width;
  cinfo.image_height = image.height;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&image.rgb[size_t{3} * image.width * cinfo.next_scanline]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  Bytes bytes(out, out + size);
  std::free(out);
  return bytes;
}

// (a), JPEG: what a caller of libjpeg-turbo writes at least (RGB out, accurate IDCT as decode_image).
size_t raw_jpeg(const Bytes& file) {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, file.data(), file.size());
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo);
  const size_t stride = size_t{3} * cinfo.output_width;
  std::unique_ptr<uint8_t[]> pixels(new uint8_t[stride * cinfo.output_height]);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels.get() + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return pixels[stride / 2];
}

struct MemoryReader {
  const Bytes* file;
  size_t pos = 0;
};

void read_memory(png_structp png, png_bytep out, size_t n) {
  auto* in = static_cast<MemoryReader*>(png_get_io_ptr(png));
  if (in->file->size() - in->pos < n) png_error(png, "end of data");
  std::memcpy(out, in->file->data() + in->pos, n);
  in->pos += n;
}

// (a), PNG: libpng's default error handling (abort on error) suffices for files made just before.
size_t raw_png(const Bytes& file) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  MemoryReader in{&file};
  png_set_read_fn(png, &in, read_memory);
  png_read_info(png, info);
  png_read_update_info(png, info);
  const size_t stride = png_get_rowbytes(png, info);
  const uint32_t height = png_get_image_height(png, info);
  std::unique_ptr<uint8_t[]> pixels(new uint8_t[stride * height]);
  for (uint32_t y = 0; y < height; ++y) png_read_row(png, pixels.get() + stride * y, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return pixels[stride / 2];
}

// Images per CPU-second of `work` over every file, best of `passes`.
double rate(const std::vector<Bytes>& files, int passes, const std::function<size_t(const Bytes&)>& work) {
  double best = 1e300;
  size_t sink = 0;
  for (int p = 0; p < passes; ++p) {
    const double t0 = thread_cpu_s();
    for (const Bytes& f : files) sink += work(f);
    best = std::min(best, thread_cpu_s() - t0);
  }
  if (sink == 42) std::puts("");  // keeps the work from being optimised away
  return double(files.size()) / best;
}

DecodeResult decoded(const Bytes& file, Reduce reduce = {}) {
  DecodeResult r = decode_image(file, kMaxPixels, reduce);
  if (!r.reason.empty()) {
    fmt::print(stderr, "bench_image_decode: {}: {}\n", r.reason, r.detail);
    std::exit(1);
  }
  return r;
}

void report(const std::string& format, const std::vector<Bytes>& files, int passes) {
  size_t bytes = 0;
  uint64_t sink = 0;
  for (const Bytes& f : files) bytes += f.size();
  const double lib = rate(files, passes, format == "JPEG" ? raw_jpeg : raw_png);
  const double dec = rate(files, passes, [](const Bytes& f) { return decoded(f).image.rgb[7]; });
  // As prepare decodes for the fit (a JPEG reduced by DCT scaling where it is large enough), and whole.
  auto fitted = [&](uint32_t size, ImageFit fit, bool reduce = true) {
    return rate(files, passes, [&](const Bytes& f) {
      return fit_image(decoded(f, reduce ? Reduce{size, fit} : Reduce{}), size, fit).rgb[7];
    });
  };
  const double pad224 = fitted(224, ImageFit::kPad), pad336 = fitted(336, ImageFit::kPad);
  const double crop224 = fitted(224, ImageFit::kCrop), whole224 = fitted(224, ImageFit::kPad, false);
  const double whole336 = fitted(336, ImageFit::kPad, false);
  const double prepare336 = rate(files, passes, [](const Bytes& f) {
    const DecodeResult d = decoded(f, Reduce{336, ImageFit::kPad});
    return pixel_hash(d) ^ perceptual_hash(d) ^ fit_image(d, 336, ImageFit::kPad).rgb[7];
  });
  std::vector<Image> pictures;
  for (const Bytes& f : files) pictures.push_back(decoded(f).image);
  auto on_pictures = [&](const std::function<uint64_t(const Image&)>& work) {
    double best = 1e300;
    for (int p = 0; p < passes; ++p) {
      const double t0 = thread_cpu_s();
      for (const Image& im : pictures) sink ^= work(im);
      best = std::min(best, thread_cpu_s() - t0);
    }
    return double(pictures.size()) / best;
  };
  auto fit_alone = [&](uint32_t size, ImageFit fit) {
    return on_pictures([&](const Image& im) { return fit_image(im, size, fit).rgb[7]; });
  };
  const double alone_pad224 = fit_alone(224, ImageFit::kPad), alone_pad336 = fit_alone(336, ImageFit::kPad);
  const double alone_crop224 = fit_alone(224, ImageFit::kCrop);
  const double phash = on_pictures([](const Image& im) { return perceptual_hash(im); });
  const double ms = 1e3;
  fmt::print("{}: {} files, {:.1f} KiB each on average\n", format, files.size(),
             bytes / 1024.0 / files.size());
  fmt::print("  (a) library decode          {:8.1f} images/s  ({:.2f} ms)\n", lib, ms / lib);
  fmt::print("  (b) decode_image            {:8.1f} images/s  ({:.2f} ms)  (b)/(a) time {:.3f}\n", dec,
             ms / dec, lib / dec);
  for (const auto& [name, r] : {std::pair{"pad 224", pad224},
                                {"pad 336", pad336},
                                {"crop 224", crop224},
                                {"pad 224, decoded whole", whole224},
                                {"pad 336, decoded whole", whole336}})
    fmt::print("  (c) decode + fit {:<22}   {:8.1f} images/s  ({:.2f} ms)  (c)/(a) time {:.3f}\n", name, r,
               ms / r, lib / r);
  for (const auto& [name, r] :
       {std::pair{"pad 224", alone_pad224}, {"pad 336", alone_pad336}, {"crop 224", alone_crop224}})
    fmt::print("      fit_image {:<9} alone {:8.1f} images/s  ({:.2f} ms)\n", name, r, ms / r);
  fmt::print("  (d) perceptual_hash         {:8.1f} images/s  ({:.2f} ms)\n", phash, ms / phash);
  fmt::print("  (e) prepare's work, pad 336  {:8.1f} images/s  ({:.2f} ms)  (e)/(a) time {:.3f}\n",
             prepare336, ms / prepare336, lib / prepare336);
  if (sink == 42) std::puts("");  // keeps the work from being optimised away
}

}  // namespace

int main(int argc, char** argv) {
  const int images = argc > 1 ? std::atoi(argv[1]) : 200;
  const auto width = static_cast<uint32_t>(argc > 2 ? std::atoi(argv[2]) : 640);
  const auto height = static_cast<uint32_t>(argc > 3 ? std::atoi(argv[3]) : 480);
  const int passes = argc > 4 ? std::atoi(argv[4]) : 3;
  std::vector<Bytes> jpegs, pngs;
  const double t0 = thread_cpu_s();
  for (int i = 0; i < images; ++i) {
    const Image p = photo(width, height, 1000 + i);
    if (i % 2 == 0) {
      jpegs.push_back(encode_jpeg(p, 90));
    } else {
      pngs.push_back(encode_png(p));
    }
  }
  fmt::print("{} pictures of {} x {} generated and encoded in {:.1f} s; one core, best of {} passes\n",
             images, width, height, thread_cpu_s() - t0, passes);
  report("JPEG", jpegs, passes);
  report("PNG", pngs, passes);
  return 0;
}
