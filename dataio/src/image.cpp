// Decoding through the reference libraries, resampling, the hashes and the PNG encoder (image.h).
//
// libpng and libjpeg report errors by longjmp. Each call into them that can fail runs in a small phase
// function of its own whose frame holds only trivial locals, with the setjmp at its top, so a jump skips no
// destructor; the C++ objects (the picture, the row table, the output buffer) live in the callers.
#include "forge/dataio/image.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"

#include <png.h>

// jpeglib.h needs FILE and size_t declared before it, jerror.h (the message codes) its types.
#include <cstdio>

#include <jpeglib.h>

#include <jerror.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace forge::data {
namespace {

constexpr uint8_t kPngSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
constexpr uint8_t kJpegSignature[] = {0xFF, 0xD8, 0xFF};  // SOI and the first marker's 0xFF

bool starts_with(std::span<const uint8_t> bytes, std::span<const uint8_t> prefix) {
  return bytes.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), bytes.begin());
}

DecodeResult refused(std::string reason, std::string detail) {
  DecodeResult r;
  r.reason = std::move(reason);
  r.detail = std::move(detail);
  return r;
}

// Dimensions are checked as soon as the library has read them, also when the data ends or breaks right
// after: a bomb is refused for its size whatever follows its header.
bool too_large(uint64_t width, uint64_t height, uint64_t max_pixels) {
  return width * height > max_pixels;
}

DecodeResult too_large_result(uint64_t width, uint64_t height, uint64_t max_pixels) {
  return refused("too_large", fmt::format("{} x {} pixels, more than {}", width, height, max_pixels));
}

Image blank(uint32_t width, uint32_t height) {
  Image image;
  image.width = width;
  image.height = height;
  image.rgb.resize(size_t{3} * width * height);
  return image;
}

void check_picture(const Image& image, const char* what) {
  if (image.width == 0 || image.height == 0 || image.rgb.size() != size_t{3} * image.width * image.height)
    fail(ExitCode::kUsage, "{}: a picture of {} x {} with {} bytes of RGB", what, image.width, image.height,
         image.rgb.size());
}

// --- PNG

// The reader's input and the message of the error that ended it (error and io pointer of libpng).
struct PngIo {
  std::span<const uint8_t> bytes;
  size_t pos = 0;
  char message[256] = {};
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
  auto* io = static_cast<PngIo*>(png_get_error_ptr(png));
  std::snprintf(io->message, sizeof io->message, "%s", message);
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* io = static_cast<PngIo*>(png_get_io_ptr(png));
  if (io->bytes.size() - io->pos < n) png_error(png, "unexpected end of data");
  std::memcpy(out, io->bytes.data() + io->pos, n);
  io->pos += n;
}

// Reads the chunks before the image data and sets the transforms to 8-bit RGB (image.h's rules); false on
// a libpng error.
bool png_read_header(png_structp png, png_infop info) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  const int type = png_get_color_type(png, info);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) png_set_expand_gray_1_2_4_to_8(png);
  png_set_strip_16(png);     // the high byte (png_set_scale_16 would round)
  png_set_strip_alpha(png);  // also the alpha that palette expansion makes of tRNS; no compositing
  if (!(type & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  return true;
}

bool png_read_pixels(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  return true;
}

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  explicit PngReader(PngIo* io) {
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, io, png_fail, png_ignore_warning);
    if (png) info = png_create_info_struct(png);
    if (!info) {
      png_destroy_read_struct(&png, nullptr, nullptr);
      throw std::bad_alloc();
    }
    png_set_read_fn(png, io, png_read_bytes);
  }
  ~PngReader() { png_destroy_read_struct(&png, &info, nullptr); }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;
};

DecodeResult decode_png(std::span<const uint8_t> bytes, uint64_t max_pixels) {
  PngIo io{bytes};
  PngReader reader(&io);
  const bool header = png_read_header(reader.png, reader.info);
  const uint32_t width = png_get_image_width(reader.png, reader.info);
  const uint32_t height = png_get_image_height(reader.png, reader.info);
  if (too_large(width, height, max_pixels)) return too_large_result(width, height, max_pixels);
  if (!header) return refused("undecodable", io.message);
  DecodeResult r;
  r.stored_width = width;
  r.stored_height = height;
  r.image = blank(width, height);
  std::vector<png_bytep> rows(height);
  for (uint32_t y = 0; y < height; ++y) rows[y] = r.image.rgb.data() + size_t{3} * width * y;
  if (!png_read_pixels(reader.png, rows.data())) return refused("undecodable", io.message);
  return r;
}

// --- JPEG

struct JpegError {
  jpeg_error_mgr mgr;  // first: libjpeg's cinfo->err points here
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are not printed, and a picture with corrupt entropy data still decodes (as in PIL), except at
// the end of the data: libjpeg would fill the missing rows with grey, where PIL refuses a truncated file.
void jpeg_warning(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(cinfo);
}

bool jpeg_read_header_phase(jpeg_decompress_struct* cinfo, JpegError* err, std::span<const uint8_t> bytes) {
  if (setjmp(err->jump)) return false;
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, bytes.data(), bytes.size());
  jpeg_read_header(cinfo, TRUE);
  return true;
}

// Decodes into `out` (output_width x output_height x 3: RGB output at the scale set).
bool jpeg_read_pixels(jpeg_decompress_struct* cinfo, JpegError* err, uint8_t* out) {
  if (setjmp(err->jump)) return false;
  jpeg_start_decompress(cinfo);
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + size_t{3} * cinfo->output_width * cinfo->output_scanline;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

// Decodes the three components as stored (raw data: no upsampling, no colour conversion) into the row
// tables rows[c], each holding the component's rows of every iMCU row.
bool jpeg_read_planes(jpeg_decompress_struct* cinfo, JpegError* err, JSAMPARRAY const* rows) {
  if (setjmp(err->jump)) return false;
  jpeg_start_decompress(cinfo);
  for (JDIMENSION imcu = 0; cinfo->output_scanline < cinfo->output_height; ++imcu) {
    JSAMPARRAY at[3];
    for (int c = 0; c < 3; ++c) at[c] = rows[c] + size_t{imcu} * cinfo->comp_info[c].v_samp_factor * DCTSIZE;
    jpeg_read_raw_data(cinfo, at, cinfo->max_v_samp_factor * DCTSIZE);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

struct JpegReader {
  jpeg_decompress_struct cinfo{};  // zeroed: destroying it before jpeg_create_decompress ran is a no-op
  JpegError err{};
  JpegReader() {
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_fail;
    err.mgr.emit_message = jpeg_warning;
  }
  ~JpegReader() { jpeg_destroy_decompress(&cinfo); }
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;
};

const char* jpeg_color_name(J_COLOR_SPACE space) {
  switch (space) {
    case JCS_CMYK:
      return "CMYK";
    case JCS_YCCK:
      return "YCCK";
    default:
      return "unknown";
  }
}

// The DCT scaling denominator for `reduce` (Reduce): the largest of 8, 4, 2 that keeps the side the fit
// resizes from at least reduce.size, else 1.
unsigned jpeg_reduction(uint32_t width, uint32_t height, const Reduce& reduce) {
  if (reduce.size == 0) return 1;
  const uint64_t from = reduce.fit == ImageFit::kPad ? std::max(width, height) : std::min(width, height);
  for (const unsigned k : {8u, 4u, 2u})
    if (from >= uint64_t{k} * reduce.size) return k;
  return 1;
}

// The planar route's JPEGs: three components, YCbCr, chroma subsampled by 1 or 2 each way.
bool planar_jpeg(const jpeg_decompress_struct& cinfo) {
  if (cinfo.jpeg_color_space != JCS_YCbCr || cinfo.num_components != 3) return false;
  const jpeg_component_info* c = cinfo.comp_info;
  return c[0].h_samp_factor <= 2 && c[0].v_samp_factor <= 2 && c[1].h_samp_factor == 1 &&
         c[1].v_samp_factor == 1 && c[2].h_samp_factor == 1 && c[2].v_samp_factor == 1;
}

DecodeResult decode_jpeg_planes(JpegReader& reader) {
  jpeg_decompress_struct& cinfo = reader.cinfo;
  cinfo.raw_data_out = TRUE;
  DecodeResult r;
  YCbCrPlanes& p = r.planes;
  r.stored_width = p.width = cinfo.image_width;
  r.stored_height = p.height = cinfo.image_height;
  const uint32_t mcu_x = cinfo.comp_info[0].h_samp_factor, mcu_y = cinfo.comp_info[0].v_samp_factor;
  p.chroma_step = {mcu_x, mcu_y};
  // libjpeg writes whole blocks, of whole MCUs in an interleaved scan: the buffers are padded to those.
  const uint32_t mcus_across = (p.width + mcu_x * DCTSIZE - 1) / (mcu_x * DCTSIZE);
  const uint32_t imcu_rows = (p.height + mcu_y * DCTSIZE - 1) / (mcu_y * DCTSIZE);
  std::array<std::vector<JSAMPROW>, 3> rows;
  JSAMPARRAY tables[3];
  for (int c = 0; c < 3; ++c) {
    const uint32_t sx = c == 0 ? 1 : mcu_x, sy = c == 0 ? 1 : mcu_y;  // luma pixels per sample
    const uint32_t bx = c == 0 ? mcu_x : 1, by = c == 0 ? mcu_y : 1;  // blocks per MCU
    YCbCrPlanes::Plane& plane = p.plane[c];
    plane.width = (p.width + sx - 1) / sx;
    plane.height = (p.height + sy - 1) / sy;
    plane.stride = mcus_across * bx * DCTSIZE;
    rows[c].resize(size_t{imcu_rows} * by * DCTSIZE);
    plane.bytes.resize(size_t{plane.stride} * rows[c].size());
    for (size_t y = 0; y < rows[c].size(); ++y) rows[c][y] = plane.bytes.data() + plane.stride * y;
    tables[c] = rows[c].data();
  }
  if (!jpeg_read_planes(&cinfo, &reader.err, tables)) return refused("undecodable", reader.err.message);
  return r;
}

DecodeResult decode_jpeg(std::span<const uint8_t> bytes, uint64_t max_pixels, const Reduce& reduce) {
  JpegReader reader;
  jpeg_decompress_struct& cinfo = reader.cinfo;
  const bool header = jpeg_read_header_phase(&cinfo, &reader.err, bytes);
  if (too_large(cinfo.image_width, cinfo.image_height, max_pixels))
    return too_large_result(cinfo.image_width, cinfo.image_height, max_pixels);
  if (!header) return refused("undecodable", reader.err.message);
  // Grey and YCbCr, and the rare Adobe RGB JPEG, convert to RGB in libjpeg; CMYK and YCCK would need the
  // colour profile PIL ignores too (its inverted-CMYK guess is not a conversion).
  if (cinfo.jpeg_color_space != JCS_GRAYSCALE && cinfo.jpeg_color_space != JCS_YCbCr &&
      cinfo.jpeg_color_space != JCS_RGB)
    return refused("unsupported_color",
                   fmt::format("{} JPEG ({} components)", jpeg_color_name(cinfo.jpeg_color_space),
                               cinfo.num_components));
  cinfo.dct_method = JDCT_ISLOW;
  const unsigned k = jpeg_reduction(cinfo.image_width, cinfo.image_height, reduce);
  if (reduce.size > 0 && k == 1 && planar_jpeg(cinfo)) return decode_jpeg_planes(reader);
  cinfo.out_color_space = JCS_RGB;
  cinfo.do_fancy_upsampling = TRUE;
  cinfo.scale_num = 1;
  cinfo.scale_denom = k;
  DecodeResult r;
  r.stored_width = cinfo.image_width;
  r.stored_height = cinfo.image_height;
  r.image = blank((cinfo.image_width + k - 1) / k, (cinfo.image_height + k - 1) / k);  // libjpeg's rounding
  if (!jpeg_read_pixels(&cinfo, &reader.err, r.image.rgb.data()))
    return refused("undecodable", reader.err.message);
  return r;
}

// --- resampling

// One axis of the separable triangle filter, as PIL computes it (Resample.c, precompute_coeffs, with a box):
// output i reads count[i] inputs from first[i] with weights weight[i * taps ...]. The window [in0, in1) of
// the axis's n samples is what the output spans; the kernel is clipped at its edges (rounded outward to
// whole samples) and its weights normalised to sum 1 there. A window may reach past the picture (pad's
// fill, in plane coordinates): samples outside 0 .. n - 1 are then dropped without renormalising, and
// mass[i] is the weight left on the picture (1 inside it; the fill's share is 1 - mass[i]).
struct Taps {
  std::vector<uint32_t> first, count;
  std::vector<float> weight, mass;
  uint32_t taps = 0, in = 0;
};

Taps window_taps(double in0, double in1, uint32_t n, uint32_t out) {
  const double scale = (in1 - in0) / out;
  const double widen = std::max(1.0, scale);  // shrinking widens the kernel: every input contributes
  const double support = widen;               // the triangle's own support is 1
  const double lo_edge = std::floor(in0), hi_edge = std::ceil(in1);
  Taps t;
  t.in = n;
  t.taps = static_cast<uint32_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(out);
  t.count.resize(out);
  t.mass.resize(out);
  t.weight.assign(size_t{out} * t.taps, 0.0f);
  std::vector<double> w(t.taps);
  for (uint32_t i = 0; i < out; ++i) {
    const double centre = in0 + (i + 0.5) * scale;
    const auto lo = static_cast<int64_t>(std::max(lo_edge, std::floor(centre - support + 0.5)));
    const auto hi = static_cast<int64_t>(std::min(hi_edge, std::floor(centre + support + 0.5)));
    double sum = 0;
    uint32_t k = 0;
    int64_t start = -1;
    for (int64_t x = lo; x < hi; ++x) {
      const double v = std::max(0.0, 1.0 - std::abs((double(x) - centre + 0.5) / widen));
      sum += v;
      if (x < 0 || x >= int64_t{n} || (v == 0 && k == 0)) continue;  // off the picture; zeros before
      if (k == 0) start = x;
      w[k++] = v;
    }
    while (k > 0 && w[k - 1] == 0) --k;  // and after: read nothing
    // An output reading nothing (all fill) still gets a valid, non-decreasing first.
    t.first[i] = static_cast<uint32_t>(k ? start : std::clamp<int64_t>(lo, 0, n - 1));
    t.count[i] = k;
    double kept = 0;
    for (uint32_t j = 0; j < k; ++j) {
      t.weight[size_t{i} * t.taps + j] = static_cast<float>(w[j] / sum);
      kept += w[j];
    }
    t.mass[i] = static_cast<float>(kept / sum);
  }
  return t;
}

// The taps of the last few windows, per thread: a dataset's pictures mostly share a few sizes, and
// computing taps (in double, per output) cost a tenth of a fit.
std::shared_ptr<const Taps> cached_taps(double in0, double in1, uint32_t n, uint32_t out) {
  struct Entry {
    double in0 = 0, in1 = 0;
    uint32_t n = 0, out = 0;
    std::shared_ptr<const Taps> taps;
  };
  constexpr size_t kEntries = 8;
  thread_local std::array<Entry, kEntries> cache;
  thread_local size_t next = 0;
  for (const Entry& e : cache)
    if (e.taps && e.in0 == in0 && e.in1 == in1 && e.n == n && e.out == out) return e.taps;
  Entry& e = cache[next++ % kEntries];
  e = {in0, in1, n, out, std::make_shared<const Taps>(window_taps(in0, in1, n, out))};
  return e.taps;
}

std::shared_ptr<const Taps> triangle_taps(uint32_t in, uint32_t out) {
  return cached_taps(0, in, in, out);
}

// The passes run on blocks of kLanes output rows at once, one row per vector lane. The vertical pass is
// contiguous along a row whatever the layout; the horizontal one is not (an RGB pixel's taps are three
// floats apart, a few per output pixel), so the block is kept transposed (block[kLanes * e + r] is sample e
// of the block's row r) and every tap of the horizontal pass is then one whole-vector multiply-add for the
// eight rows. The file is built without contracting a * b + c into a fused multiply-add (CMakeLists.txt),
// so that every clone below gives the same bytes on every CPU.
//
// The functions marked so are compiled for AVX-512, AVX2 and plain x86-64, the CPU's clone picked at load
// time. test/dataio/image_isa_test.sh builds this file for each of them alone (the macro empty) and checks
// that their pictures are the same bytes.
#ifndef FORGE_IMAGE_CLONES
#define FORGE_IMAGE_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
// The helpers below pass 32-byte vectors by value, which GCC warns changes the ABI where AVX is off; they are
// always inlined into the clones, so no call passes one.
#pragma GCC diagnostic ignored "-Wpsabi"
constexpr int kLanes = 8;
using Float8 = float __attribute__((vector_size(kLanes * sizeof(float))));

[[gnu::always_inline]] inline Float8 load8(const float* p) {
  Float8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline void store8(float* p, Float8 v) {
  std::memcpy(p, &v, sizeof v);
}

// v[r][c] becomes v[c][r]: the off-diagonal blocks of side b swap between rows i and i + b, for b = 4, 2, 1
// (each step one two-vector shuffle per row). Sixteen lanes were no faster (AVX-512 runs as two halves here).
[[gnu::always_inline]] inline void transpose(Float8 (&v)[kLanes]) {
  using Index = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
  auto step = [&]<int b>() {
    Index lo, hi;
    for (int j = 0; j < kLanes; ++j) {
      lo[j] = (j & b) ? kLanes + j - b : j;
      hi[j] = (j & b) ? kLanes + j : j + b;
    }
    for (int i = 0; i < kLanes; ++i)
      if (!(i & b)) {
        const Float8 a = v[i], c = v[i + b];
        v[i] = __builtin_shuffle(a, c, lo);
        v[i + b] = __builtin_shuffle(a, c, hi);
      }
  };
  static_assert(kLanes == 8, "three steps");
  step.template operator()<4>();
  step.template operator()<2>();
  step.template operator()<1>();
}

// Samples a vertical step reads from each source row: the rows' chunks (converted to float once) stay in
// L1 while the block's eight rows read them.
constexpr size_t kChunk = 8 * kLanes;

// The vertical pass of output rows j0 .. j0 + kLanes - 1 (rows past the last repeat it) over the first n
// samples of rows[], into `block`, transposed (n rounded up to whole vectors). `staged` holds kChunk floats
// per source row the block reads.
template <typename T>
FORGE_IMAGE_CLONES void vertical_block(const T* const* rows, const Taps& y, uint32_t j0, size_t n,
                                       float* staged, float* block) {
  const auto out_height = static_cast<uint32_t>(y.first.size());
  uint32_t first[kLanes], count[kLanes];
  const float* weight[kLanes];
  for (int r = 0; r < kLanes; ++r) {
    const uint32_t j = std::min(j0 + r, out_height - 1);
    first[r] = y.first[j];
    count[r] = y.count[j];
    weight[r] = &y.weight[size_t{j} * y.taps];
  }
  uint32_t hi = 0;  // the source rows the block reads: lo .. hi - 1
  for (int r = 0; r < kLanes; ++r) hi = std::max(hi, first[r] + count[r]);
  const uint32_t lo = first[0];
  alignas(64) float lines[kLanes][kChunk];
  for (size_t e0 = 0; e0 < n; e0 += kChunk) {
    const size_t m = std::min(kChunk, n - e0);
    for (uint32_t s = lo; s < hi; ++s) {
      float* __restrict to = staged + kChunk * (s - lo);
      const T* __restrict from = rows[s] + e0;
      // The row's next chunks: the hardware prefetcher loses track of this many rows read at once.
      __builtin_prefetch(from + 2 * kChunk);
      // Past m the chunk keeps what it held (finite: zeros or samples): its sums land past the row's samples,
      // where only horizontal_block's zero-weighted taps read them. (Zeroing it there one float at a time
      // stalled the vector loads that follow, which wait for such stores.)
      if (m == kChunk) {
        for (size_t i = 0; i < kChunk; ++i) to[i] = static_cast<float>(from[i]);
      } else {
        for (size_t i = 0; i < m; ++i) to[i] = static_cast<float>(from[i]);
      }
    }
    // Eight independent sums per row, so that the additions' latency is hidden.
    for (int r = 0; r < kLanes; ++r) {
      Float8 a0 = {}, a1 = {}, a2 = {}, a3 = {}, a4 = {}, a5 = {}, a6 = {}, a7 = {};
      for (uint32_t k = 0; k < count[r]; ++k) {
        const float* p = staged + kChunk * (first[r] + k - lo);
        const float w = weight[r][k];
        a0 += w * load8(p);
        a1 += w * load8(p + kLanes);
        a2 += w * load8(p + 2 * kLanes);
        a3 += w * load8(p + 3 * kLanes);
        a4 += w * load8(p + 4 * kLanes);
        a5 += w * load8(p + 5 * kLanes);
        a6 += w * load8(p + 6 * kLanes);
        a7 += w * load8(p + 7 * kLanes);
      }
      const Float8 sums[] = {a0, a1, a2, a3, a4, a5, a6, a7};
      std::memcpy(lines[r], sums, sizeof sums);
    }
    for (size_t e = 0; e < m; e += kLanes) {
      Float8 v[kLanes];
      for (int r = 0; r < kLanes; ++r) v[r] = load8(lines[r] + e);
      transpose(v);
      for (int c = 0; c < kLanes; ++c) store8(block + kLanes * (e0 + e + c), v[c]);
    }
  }
}

// The horizontal pass over a transposed block of rows of C-channel pixels, into a transposed block. Even and
// odd taps in two sums: one chain of dependent additions would wait on each one's latency. With kTaps > 0
// (x.taps, known when compiled) every output runs all kTaps taps, the unused ones weighing 0 (the block is
// padded with zeros past its samples for them): no loop bounds to branch on, and x + 0 * s is x.
template <int C, int kTaps = 0>
FORGE_IMAGE_CLONES void horizontal_block(const float* block, const Taps& x, float* out) {
  const auto width = static_cast<uint32_t>(x.first.size());
  constexpr size_t kTap = size_t{kLanes} * C;  // from one tap's samples to the next one's
  for (uint32_t i = 0; i < width; ++i) {
    const float* w = &x.weight[size_t{i} * x.taps];
    const uint32_t n = kTaps > 0 ? kTaps : x.count[i];
    for (int c = 0; c < C; ++c) {
      const float* s = block + kLanes * (size_t{C} * x.first[i] + c);
      Float8 even = {}, odd = {};
      uint32_t k = 0;
      for (; k + 1 < n; k += 2) {
        even += w[k] * load8(s + kTap * k);
        odd += w[k + 1] * load8(s + kTap * (k + 1));
      }
      if (k < n) even += w[k] * load8(s + kTap * k);
      store8(out + kLanes * (size_t{C} * i + c), even + odd);
    }
  }
}

template <int C>
void horizontal_pass(const float* block, const Taps& x, float* out) {
  switch (x.taps) {
    case 3:
      return horizontal_block<C, 3>(block, x, out);
    case 5:
      return horizontal_block<C, 5>(block, x, out);
    case 7:
      return horizontal_block<C, 7>(block, x, out);
    default:
      return horizontal_block<C>(block, x, out);
  }
}

// Rounded half up and clamped; in integers, so that the loop over a row vectorizes (truncation is the floor
// wherever it matters: below 0 everything ends at 0).
uint8_t to_byte(float v) {
  return static_cast<uint8_t>(std::clamp(static_cast<int>(v + 0.5f), 0, 255));
}

// A transposed block of n samples a row (whole vectors) back to its first `rows` rows of out_n samples:
// rounded to nearest and clamped for bytes, as is for floats. `lines` holds kLanes rows of n floats.
template <typename Out>
FORGE_IMAGE_CLONES void unblock(const float* block, size_t n, float* lines, Out* const* out, int rows,
                                size_t out_n) {
  // Floats of a whole block of whole vectors go straight to their rows.
  const bool direct = std::is_same_v<Out, float> && rows == kLanes && out_n == n;
  for (size_t e = 0; e < n; e += kLanes) {
    Float8 v[kLanes];
    for (int c = 0; c < kLanes; ++c) v[c] = load8(block + kLanes * (e + c));
    transpose(v);
    for (int r = 0; r < kLanes; ++r)
      store8(direct ? reinterpret_cast<float*>(out[r]) + e : lines + n * r + e, v[r]);
  }
  if (direct) return;
  for (int r = 0; r < rows; ++r) {
    const float* __restrict line = lines + n * r;
    Out* __restrict row = out[r];  // a byte could alias anything: the loop vectorizes only with the promise
    if constexpr (std::is_same_v<Out, uint8_t>) {
      for (size_t i = 0; i < out_n; ++i) row[i] = to_byte(line[i]);
    } else {
      std::copy(line, line + out_n, row);
    }
  }
}

// The row every tap of output row j reads, when they all read one (a row table may repeat a pointer).
template <typename T>
const T* single_row(const std::vector<const T*>& rows, const Taps& y, size_t j) {
  if (y.count[j] == 0) return nullptr;
  const T* row = rows[y.first[j]];
  for (uint32_t k = 1; k < y.count[j]; ++k)
    if (rows[y.first[j] + k] != row) return nullptr;
  return row;
}

size_t whole_vectors(size_t n) {
  return (n + kLanes - 1) / kLanes * kLanes;
}

// Resamples the picture whose row r is rows[r] (x.in C-channel pixels) by the taps x and y: the vertical
// pass, then the horizontal one, a block of kLanes output rows at a time.
template <int C, typename T, typename Out>
void resample(const std::vector<const T*>& rows, const Taps& x, const Taps& y, Out* out) {
  const auto out_width = static_cast<uint32_t>(x.first.size()),
             out_height = static_cast<uint32_t>(y.first.size());
  const size_t in_n = size_t{C} * x.in, out_n = size_t{C} * out_width;
  uint32_t span = 0;  // the most source rows a block reads
  for (uint32_t j = 0; j < out_height; ++j)
    for (uint32_t r = j; r < std::min(j + kLanes, out_height); ++r)
      span = std::max(span, y.first[r] + y.count[r] - y.first[j]);
  // The block's zeros past its samples are what horizontal_block's unused taps read.
  std::vector<float> staged(kChunk * span), block(kLanes * (whole_vectors(in_n) + size_t{C} * x.taps)),
      done(kLanes * whole_vectors(out_n)), lines(kLanes * whole_vectors(out_n));
  Out* out_rows[kLanes];
  for (uint32_t j = 0; j < out_height;) {
    if (y.count[j] == 0) {  // all past the picture (fit_planes' pad)
      std::fill_n(out + out_n * j, out_n, Out{});
      ++j;
      continue;
    }
    // Output rows made of one shared source row alone (pad's fill) are alike: computed once.
    const T* only = single_row(rows, y, j);
    if (j > 0 && only && only == single_row(rows, y, j - 1)) {
      std::copy_n(out + out_n * (j - 1), out_n, out + out_n * j);
      ++j;
      continue;
    }
    const int n = static_cast<int>(std::min<uint32_t>(kLanes, out_height - j));
    vertical_block(rows.data(), y, j, in_n, staged.data(), block.data());
    horizontal_pass<C>(block.data(), x, done.data());
    for (int r = 0; r < n; ++r) out_rows[r] = out + out_n * (j + r);
    unblock(done.data(), whole_vectors(out_n), lines.data(), out_rows, n, out_n);
    j += n;
  }
}

// The same over whole axes: rows[] of width pixels to out_width x out_height.
template <int C, typename T, typename Out>
void resample(const std::vector<const T*>& rows, uint32_t width, uint32_t out_width, uint32_t out_height,
              Out* out) {
  resample<C>(rows, *triangle_taps(width, out_width),
              *triangle_taps(static_cast<uint32_t>(rows.size()), out_height), out);
}

// The rows, from column `left` on, of an RGB picture's `height` rows from `top`.
std::vector<const uint8_t*> window_rows(const Image& source, uint32_t left, uint32_t top, uint32_t height) {
  std::vector<const uint8_t*> rows(height);
  for (uint32_t r = 0; r < height; ++r) rows[r] = &source.rgb[3 * (size_t{source.width} * (top + r) + left)];
  return rows;
}

Image resample_rgb(const std::vector<const uint8_t*>& rows, uint32_t width, uint32_t out_width,
                   uint32_t out_height) {
  Image out = blank(out_width, out_height);
  resample<3>(rows, width, out_width, out_height, out.rgb.data());
  return out;
}

// The square of side max(w, h) with the picture centred on `fill`, as a row table: rows of fill are one
// shared row, and the picture's rows are used in place when it spans the width (else copied, padded, into
// `storage`).
std::vector<const uint8_t*> padded_rows(const Image& source, std::array<uint8_t, 3> fill,
                                        std::vector<uint8_t>& storage) {
  const uint32_t w = source.width, h = source.height, side = std::max(w, h);
  const uint32_t left = (side - w) / 2, top = (side - h) / 2;
  const size_t n = size_t{3} * side;
  storage.resize(left ? n * (h + 1) : n);
  for (size_t i = 0; i < storage.size(); i += 3) std::copy(fill.begin(), fill.end(), &storage[i]);
  std::vector<const uint8_t*> rows(side, storage.data());
  const std::vector<const uint8_t*> picture = window_rows(source, 0, 0, h);
  for (uint32_t r = 0; r < h; ++r) {
    if (left == 0) {
      rows[top + r] = picture[r];
      continue;
    }
    uint8_t* row = &storage[n * (r + 1)];
    std::copy_n(picture[r], size_t{3} * w, row + size_t{3} * left);
    rows[top + r] = row;
  }
  return rows;
}

// --- fitting a picture's YCbCr planes

// The region a fit resizes from, in luma pixels: [x0, x0 + side_x) x [y0, y0 + side_y), reaching past the
// picture for pad (fit_image's offsets).
struct FitWindow {
  double x0 = 0, y0 = 0, side_x = 0, side_y = 0;
};

FitWindow fit_window(uint32_t w, uint32_t h, ImageFit fit) {
  switch (fit) {
    case ImageFit::kPad: {
      const uint32_t side = std::max(w, h);
      return {-double((side - w) / 2), -double((side - h) / 2), double(side), double(side)};
    }
    case ImageFit::kCrop: {
      const uint32_t side = std::min(w, h);
      return {double((w - side) / 2), double((h - side) / 2), double(side), double(side)};
    }
    case ImageFit::kStretch:
      break;
  }
  return {0, 0, double(w), double(h)};
}

// A picture's planes fitted: Y and the chroma planes resampled over the window, each in its own samples,
// then converted. Where the window reaches past the picture (pad) the fill takes the weight off it; that
// share is the luma's (the picture's own edges: a chroma plane of an odd side has a last sample half past
// them), and chroma is renormalised over its samples on the picture: a pixel at the edge is the picture's
// colour blended with the fill's as the RGB route blends them.
struct PlaneFit {
  std::shared_ptr<const Taps> x, y;
};

PlaneFit plane_taps(const YCbCrPlanes& planes, int p, const FitWindow& window, uint32_t size) {
  const double sx = p == 0 ? 1 : planes.chroma_step[0], sy = p == 0 ? 1 : planes.chroma_step[1];
  const YCbCrPlanes::Plane& plane = planes.plane[p];
  return {cached_taps(window.x0 / sx, (window.x0 + window.side_x) / sx, plane.width, size),
          cached_taps(window.y0 / sy, (window.y0 + window.side_y) / sy, plane.height, size)};
}

void resample_plane(const YCbCrPlanes::Plane& plane, const PlaneFit& taps, float* out) {
  std::vector<const uint8_t*> rows(plane.height);
  for (uint32_t r = 0; r < plane.height; ++r) rows[r] = plane.row(r);
  resample<1>(rows, *taps.x, *taps.y, out);
}

// JFIF's YCbCr -> RGB (ITU-R 601, full range) of n pixels, rounded and clamped as the resampler's bytes.
FORGE_IMAGE_CLONES void ycbcr_to_rgb(const float* __restrict y, const float* __restrict cb,
                                     const float* __restrict cr, size_t n, uint8_t* __restrict rgb) {
  for (size_t i = 0; i < n; ++i) {
    const float b = cb[i] - 128, r = cr[i] - 128;
    rgb[3 * i] = to_byte(y[i] + 1.402f * r);
    rgb[3 * i + 1] = to_byte(y[i] - 0.344136f * b - 0.714136f * r);
    rgb[3 * i + 2] = to_byte(y[i] + 1.772f * b);
  }
}

// One row's share of the fill: y += fill * off, chroma = chroma * scale + fill * off, where off is the weight
// off the picture (1 - mass_y * mass_x[i]) and scale renormalises chroma's weight to the luma's.
struct Blend {
  float mass_y, scale_y;
  std::array<float, 3> fill;  // Y, Cb, Cr
};

FORGE_IMAGE_CLONES void blend_fill(const Blend& b, float* __restrict y, float* __restrict cb,
                                   float* __restrict cr, const float* mass_x, const float* scale_x,
                                   size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float off = 1 - b.mass_y * mass_x[i], scale = b.scale_y * scale_x[i];
    y[i] += b.fill[0] * off;
    cb[i] = cb[i] * scale + b.fill[1] * off;
    cr[i] = cr[i] * scale + b.fill[2] * off;
  }
}

Image fit_planes(const YCbCrPlanes& planes, uint32_t size, ImageFit fit, std::array<uint8_t, 3> fill) {
  const FitWindow window = fit_window(planes.width, planes.height, fit);
  const PlaneFit luma = plane_taps(planes, 0, window, size), chroma = plane_taps(planes, 1, window, size);
  const Taps &luma_x = *luma.x, &luma_y = *luma.y, &chroma_x = *chroma.x, &chroma_y = *chroma.y;
  const size_t n = size_t{size} * size;
  std::unique_ptr<float[]> fitted(new float[3 * n]);  // Y, Cb, Cr planes of the fitted picture
  float* const y = fitted.get();
  float* const cb = y + n;
  float* const cr = cb + n;
  resample_plane(planes.plane[0], luma, y);
  resample_plane(planes.plane[1], chroma, cb);
  resample_plane(planes.plane[2], chroma, cr);
  if (fit == ImageFit::kPad) {
    // The fill in YCbCr (JFIF's RGB -> YCbCr), not rounded: a pixel all fill converts back to it exactly.
    const double r = fill[0], g = fill[1], b = fill[2];
    const float fill_y = float(0.299 * r + 0.587 * g + 0.114 * b);
    const float fill_cb = float(128 - 0.168736 * r - 0.331264 * g + 0.5 * b);
    const float fill_cr = float(128 + 0.5 * r - 0.418688 * g - 0.081312 * b);
    // Per row and column: the luma's weight on the picture, and the factor renormalising chroma's to it.
    auto ratio = [](float l, float c) { return c > 0 ? l / c : 0.0f; };
    std::vector<float> scale_x(size), scale_y(size);
    std::vector<uint32_t> edge_columns;  // those whose weight is not all on the picture
    for (uint32_t i = 0; i < size; ++i) {
      scale_x[i] = ratio(luma_x.mass[i], chroma_x.mass[i]);
      scale_y[i] = ratio(luma_y.mass[i], chroma_y.mass[i]);
      if (luma_x.mass[i] != 1 || chroma_x.mass[i] != 1) edge_columns.push_back(i);
    }
    for (uint32_t j = 0; j < size; ++j) {
      const size_t row = size_t{j} * size;
      const bool whole_row = luma_y.mass[j] == 1 && chroma_y.mass[j] == 1;
      const Blend blend{luma_y.mass[j], scale_y[j], {fill_y, fill_cb, fill_cr}};
      if (whole_row) {
        for (const uint32_t i : edge_columns)
          blend_fill(blend, y + row + i, cb + row + i, cr + row + i, luma_x.mass.data() + i, &scale_x[i], 1);
      } else {
        blend_fill(blend, y + row, cb + row, cr + row, luma_x.mass.data(), scale_x.data(), size);
      }
    }
  }
  Image out = blank(size, size);
  ycbcr_to_rgb(y, cb, cr, n, out.rgb.data());
  return out;
}

// --- the perceptual hash

// ITU-R 601 luma of n RGB pixels, in float. A clone, like the resampler's: the stride-3 reads vectorize only
// with shuffles SSE2 lacks, and this loop is most of the hash's time.
FORGE_IMAGE_CLONES void to_luma(const uint8_t* __restrict rgb, size_t n, float* __restrict luma) {
  for (size_t p = 0; p < n; ++p)
    luma[p] = 0.299f * float(rgb[3 * p]) + 0.587f * float(rgb[3 * p + 1]) + 0.114f * float(rgb[3 * p + 2]);
}

constexpr int kHashSide = 32;  // the luma picture the DCT runs on
constexpr int kHashFreqs = 8;  // the lowest frequencies kept per axis

// cos(pi * u * (2n + 1) / 64): the unnormalised DCT-II basis; scaling a frequency would move it against
// the median.
const std::array<std::array<double, kHashSide>, kHashFreqs>& dct_basis() {
  static const auto basis = [] {
    std::array<std::array<double, kHashSide>, kHashFreqs> b{};
    for (int u = 0; u < kHashFreqs; ++u)
      for (int n = 0; n < kHashSide; ++n) b[u][n] = std::cos(M_PI * u * (2 * n + 1) / (2.0 * kHashSide));
    return b;
  }();
  return basis;
}

// The hash of the 32 x 32 luma picture: the 8 x 8 lowest frequencies of its 2-D DCT-II against their median.
uint64_t dct_hash(const std::array<float, kHashSide * kHashSide>& small) {
  // The 8 x 8 lowest frequencies of the 2-D DCT-II: coefficient (u, v) = sum over y, x of
  // basis[u][y] * small[y][x] * basis[v][x], u the vertical frequency; bit 8u + v.
  const auto& basis = dct_basis();
  std::array<std::array<double, kHashFreqs>, kHashSide> by_row{};  // [y][v]
  for (int y = 0; y < kHashSide; ++y)
    for (int v = 0; v < kHashFreqs; ++v)
      for (int x = 0; x < kHashSide; ++x) by_row[y][v] += small[y * kHashSide + x] * basis[v][x];
  std::array<double, kHashFreqs * kHashFreqs> coeff{};
  for (int u = 0; u < kHashFreqs; ++u)
    for (int v = 0; v < kHashFreqs; ++v)
      for (int y = 0; y < kHashSide; ++y) coeff[u * kHashFreqs + v] += basis[u][y] * by_row[y][v];
  std::array<double, kHashFreqs * kHashFreqs - 1> ac;
  std::copy(coeff.begin() + 1, coeff.end(), ac.begin());
  std::nth_element(ac.begin(), ac.begin() + ac.size() / 2, ac.end());
  const double median = ac[ac.size() / 2];
  uint64_t hash = 0;
  for (size_t i = 0; i < coeff.size(); ++i)
    if (coeff[i] > median) hash |= uint64_t{1} << i;
  return hash;
}

// --- PNG encoding

struct PngSink {
  std::vector<uint8_t> bytes;
  char message[256] = {};
};

[[noreturn]] void png_write_fail(png_structp png, png_const_charp message) {
  auto* sink = static_cast<PngSink*>(png_get_error_ptr(png));
  std::snprintf(sink->message, sizeof sink->message, "%s", message);
  png_longjmp(png, 1);
}

// The allocation's exception is caught here, not thrown through libpng's C frames, and reported as a
// libpng error once the handler is done.
void png_append(png_structp png, png_bytep data, size_t n) {
  auto* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  bool grown = true;
  try {
    sink->bytes.insert(sink->bytes.end(), data, data + n);
  } catch (const std::bad_alloc&) {
    grown = false;
  }
  if (!grown) png_error(png, "out of memory");
}

void png_flush_nothing(png_structp) {}

bool png_write_phase(png_structp png, png_infop info, const uint8_t* rgb, uint32_t width, uint32_t height) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (uint32_t y = 0; y < height; ++y) png_write_row(png, rgb + size_t{3} * width * y);
  png_write_end(png, nullptr);
  return true;
}

struct PngWriter {
  png_structp png = nullptr;
  png_infop info = nullptr;
  explicit PngWriter(PngSink* sink) {
    png = png_create_write_struct(PNG_LIBPNG_VER_STRING, sink, png_write_fail, png_ignore_warning);
    if (png) info = png_create_info_struct(png);
    if (!info) {
      png_destroy_write_struct(&png, nullptr);
      throw std::bad_alloc();
    }
    png_set_write_fn(png, sink, png_append, png_flush_nothing);
  }
  ~PngWriter() { png_destroy_write_struct(&png, &info); }
  PngWriter(const PngWriter&) = delete;
  PngWriter& operator=(const PngWriter&) = delete;
};

}  // namespace

DecodeResult decode_image(std::span<const uint8_t> bytes, uint64_t max_pixels, Reduce reduce) {
  if (starts_with(bytes, kPngSignature)) return decode_png(bytes, max_pixels);
  if (starts_with(bytes, kJpegSignature)) return decode_jpeg(bytes, max_pixels, reduce);
  return refused("unsupported_format", "neither a PNG nor a JPEG signature");
}

ImageFit parse_image_fit(const std::string& name) {
  if (name == "pad") return ImageFit::kPad;
  if (name == "crop") return ImageFit::kCrop;
  if (name == "stretch") return ImageFit::kStretch;
  fail(ExitCode::kUsage, "unknown image fit '{}'; use pad, crop or stretch", name);
}

const char* image_fit_name(ImageFit fit) {
  switch (fit) {
    case ImageFit::kPad:
      return "pad";
    case ImageFit::kCrop:
      return "crop";
    case ImageFit::kStretch:
      return "stretch";
  }
  return "?";
}

Image resize_image(const Image& source, uint32_t width, uint32_t height) {
  check_picture(source, "resize_image");
  if (width == 0 || height == 0) fail(ExitCode::kUsage, "resize_image: target size {} x {}", width, height);
  return resample_rgb(window_rows(source, 0, 0, source.height), source.width, width, height);
}

Image fit_image(const Image& source, uint32_t size, ImageFit fit, std::array<uint8_t, 3> fill) {
  check_picture(source, "fit_image");
  if (size == 0) fail(ExitCode::kUsage, "fit_image: size 0");
  const uint32_t w = source.width, h = source.height;
  switch (fit) {
    case ImageFit::kCrop: {
      const uint32_t side = std::min(w, h);
      return resample_rgb(window_rows(source, (w - side) / 2, (h - side) / 2, side), side, size, size);
    }
    case ImageFit::kPad: {
      std::vector<uint8_t> storage;
      return resample_rgb(padded_rows(source, fill, storage), std::max(w, h), size, size);
    }
    case ImageFit::kStretch:
      break;
  }
  return resample_rgb(window_rows(source, 0, 0, h), w, size, size);
}

uint64_t pixel_hash(const Image& image) {
  Xxh3Stream h;
  const uint32_t dims[2] = {image.width, image.height};
  h.update(dims, sizeof dims);
  h.update(image.rgb.data(), image.rgb.size());
  return h.digest();
}

Image fit_image(const DecodeResult& decoded, uint32_t size, ImageFit fit, std::array<uint8_t, 3> fill) {
  if (decoded.planes.plane[0].bytes.empty()) return fit_image(decoded.image, size, fit, fill);
  if (size == 0) fail(ExitCode::kUsage, "fit_image: size 0");
  return fit_planes(decoded.planes, size, fit, fill);
}

uint64_t pixel_hash(const DecodeResult& decoded) {
  const YCbCrPlanes& p = decoded.planes;
  if (p.plane[0].bytes.empty()) return pixel_hash(decoded.image);
  Xxh3Stream h;
  const uint32_t dims[4] = {p.width, p.height, p.chroma_step[0], p.chroma_step[1]};
  h.update(dims, sizeof dims);
  for (const YCbCrPlanes::Plane& plane : p.plane)
    for (uint32_t r = 0; r < plane.height; ++r) h.update(plane.row(r), plane.width);
  return h.digest();
}

uint64_t perceptual_hash(const Image& image) {
  check_picture(image, "perceptual_hash");
  std::vector<float> luma(size_t{image.width} * image.height);
  to_luma(image.rgb.data(), luma.size(), luma.data());
  std::vector<const float*> rows(image.height);
  for (uint32_t r = 0; r < image.height; ++r) rows[r] = &luma[size_t{image.width} * r];
  std::array<float, kHashSide * kHashSide> small{};
  resample<1>(rows, image.width, kHashSide, kHashSide, small.data());
  return dct_hash(small);
}

uint64_t perceptual_hash(const DecodeResult& decoded) {
  const YCbCrPlanes::Plane& luma = decoded.planes.plane[0];
  if (luma.bytes.empty()) return perceptual_hash(decoded.image);
  std::vector<const uint8_t*> rows(luma.height);
  for (uint32_t r = 0; r < luma.height; ++r) rows[r] = luma.row(r);
  std::array<float, kHashSide * kHashSide> small{};
  resample<1>(rows, luma.width, kHashSide, kHashSide, small.data());
  return dct_hash(small);
}
int hamming_distance(uint64_t a, uint64_t b) {
  return std::popcount(a ^ b);
}

std::vector<uint8_t> encode_png(const Image& image) {
  check_picture(image, "encode_png");
  PngSink sink;
  sink.bytes.reserve(image.rgb.size() / 2);
  PngWriter writer(&sink);
  if (!png_write_phase(writer.png, writer.info, image.rgb.data(), image.width, image.height))
    fail(ExitCode::kData, "encode_png: {}", sink.message);
  return std::move(sink.bytes);
}

}  // namespace forge::data
