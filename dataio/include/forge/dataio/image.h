// Images of image-text datasets (docs/DATA.md, "Image-text data"): decoding PNG and JPEG with the
// reference libraries (libpng, libjpeg-turbo), fitting a picture to the vision encoder's square input,
// and the hashes of exact and near-duplicate detection.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace forge::data {

// The decoding, fitting and hashing rules below, by name: part of an image-text dataset's settings, so that
// a change to them (under a new name) changes the version of every dataset they made.
inline constexpr const char* kImageDecoder =
    "forge-image-4: libpng, libjpeg-turbo (islow, DCT-scaled or planar for the fit), triangle resize (no "
    "FMA)";

// 8-bit RGB, row-major, interleaved: pixel (x, y) is rgb[3 * (y * width + x) + c].
struct Image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// The encoder's input is size x size. How a picture that is not square gets there:
//   kPad:     centred on a square of side max(w, h) filled with `fill` (at offsets floor((side - w) / 2),
//             floor((side - h) / 2)), then resized; nothing is lost (LLaVA's expand-to-square).
//   kCrop:    the centred square of side min(w, h) (same offset rule), then resized (CLIP's centre crop).
//   kStretch: resized as is; the aspect ratio is lost.
enum class ImageFit { kPad, kCrop, kStretch };
ImageFit parse_image_fit(const std::string& name);  // "pad" | "crop" | "stretch"; forge::Error(kUsage) else
const char* image_fit_name(ImageFit fit);

// What decode_image makes of every kind of file, in one place (docs/DATA.md lists it):
//   PNG: grey, grey+alpha, palette (with or without tRNS), RGB, RGBA at 1-16 bits, interlaced or not.
//        Grey is replicated to R=G=B; alpha is dropped (the stored colour is kept, as PIL's
//        convert("RGB")); 16-bit samples keep their high byte (v >> 8).
//   JPEG: baseline and progressive, grey or YCbCr (or Adobe RGB), decoded by libjpeg-turbo with its
//        accurate integer IDCT and default (fancy) upsampling. CMYK/YCCK JPEGs are refused as
//        unsupported_color; one that ends early is undecodable (as in PIL; libjpeg would pad it with grey).
//   EXIF orientation is ignored: pixels are taken as stored (as PIL's Image.open does).
// A YCbCr JPEG as stored (decode_image for a fit, below): luma at the picture's size, chroma at its
// subsampled size, neither upsampled nor converted to RGB. Plane 0 is Y, 1 Cb, 2 Cr; chroma_step is the luma
// pixels per chroma sample across and down (1 or 2; a chroma sample's centre is the centre of the luma
// pixels it covers, as JFIF places it).
struct YCbCrPlanes {
  struct Plane {
    uint32_t width = 0, height = 0, stride = 0;  // stride >= width: libjpeg writes whole blocks
    std::vector<uint8_t> bytes;
    const uint8_t* row(uint32_t r) const { return bytes.data() + size_t{stride} * r; }
  };
  uint32_t width = 0, height = 0;
  std::array<uint32_t, 2> chroma_step{1, 1};
  std::array<Plane, 3> plane;
};

struct DecodeResult {
  Image image;         // empty when the picture came back as planes
  YCbCrPlanes planes;  // set instead of image by the planar route of a decode for a fit (Reduce)
  uint32_t stored_width = 0, stored_height = 0;  // the file's own size: image's, unless decoded reduced
  // "" on success, else the reason prepare counts it under: "unsupported_format" (neither PNG nor JPEG by
  // its signature), "undecodable" (the library refused the data: corrupt or truncated), "unsupported_color"
  // (a colour model decode_image does not convert), "too_large" (more than max_pixels pixels).
  std::string reason;
  std::string detail;  // the library's message, for the bad-line report
};

// A picture decoded for fit_image(..., size, fit) (decode_image's `reduce`): a JPEG is decoded reduced by
// libjpeg's DCT scaling, to 1/k of its size (k = 8, 4 or 2, rounded up: libjpeg's output size), for the
// largest k that leaves the side the fit resizes from at least `size` (pad: the longer, crop and stretch:
// the shorter), as PIL's draft mode does. The IDCT then does most of a large downscale, at a fraction of a
// whole decode's cost, and fit_image the rest; the scaled IDCT's pixels are libjpeg's (tested against PIL's
// draft). PNG has no such scaling and decodes whole; size 0: every file whole.
// A YCbCr JPEG that no reduction serves (between one and two times the fit's side) comes back as its
// planes, with chroma subsampled by 1 or 2 each way (4:4:4, 4:2:2, 4:2:0, 4:4:0), other ones as RGB: the
// fit then resamples each plane as stored and converts only the fitted pixels to RGB, skipping the chroma
// upsampling and colour conversion of every source pixel (fit_image of a DecodeResult, below). Its pixels
// are within a few levels of fitting the RGB decode, not equal: chroma is resampled once, from the stored
// samples, where the RGB route upsamples it first (libjpeg's fancy upsampling), and converted in float.
struct Reduce {
  uint32_t size = 0;
  ImageFit fit = ImageFit::kPad;
};

// The default limit on a picture's pixels (image.max_pixels): a decompression bomb is refused from its
// header.
inline constexpr uint64_t kMaxPixels = 1ull << 27;

// Never throws on bad data; max_pixels guards against decompression bombs (checked from the header,
// before any pixel is allocated).
DecodeResult decode_image(std::span<const uint8_t> bytes, uint64_t max_pixels = kMaxPixels,
                          Reduce reduce = {});

// Resampling with a triangle (bilinear) kernel whose support widens by the scale factor when shrinking, so
// every source pixel contributes (antialiased, as PIL's Image.resize with BILINEAR), separably, in float
// between and within the two passes (the cheaper order first: in float the order changes only rounding
// error), each channel rounded to nearest and clamped to 0..255 at the end. Within 1 of PIL's values (PIL
// rounds to 8 bits between its passes); PIL's float (mode F) resize, rounded, except at exact .5 ties.
Image resize_image(const Image& source, uint32_t width, uint32_t height);

// The fitted size x size picture. source must be non-empty.
Image fit_image(const Image& source, uint32_t size, ImageFit fit,
                std::array<uint8_t, 3> fill = {122, 116, 104});
// The same of a decoded picture, RGB or planes. Planes: each is resampled over the fit's window (in its
// own samples: a fractional window where chroma is subsampled), the kernel clipped at the window's edges
// as the RGB route's at the square's; where the window reaches past the picture (pad) the fill, converted
// to YCbCr in float, takes the weight that fell outside it; then JFIF's YCbCr -> RGB in float, rounded.
Image fit_image(const DecodeResult& decoded, uint32_t size, ImageFit fit,
                std::array<uint8_t, 3> fill = {122, 116, 104});

// Exact duplicates: xxh3-64 of the dimensions and the decoded pixels (a PNG re-compressed or converted to
// another lossless file is the same picture).
uint64_t pixel_hash(const Image& image);
// A decoded picture's: planes hash as planes (a JPEG fitted from its planes and a PNG of its RGB decode
// differ here; the perceptual hash finds them).
uint64_t pixel_hash(const DecodeResult& decoded);

// Near duplicates: the 64-bit DCT perceptual hash. Luma (ITU-R 601: 0.299 R + 0.587 G + 0.114 B) resized
// to 32 x 32 with resize_image's kernel (in float, not rounded), its 2-D DCT-II (unnormalised: every
// frequency's basis is cos(pi k (2n + 1) / 64), no extra DC scale), the 8 x 8 lowest frequencies; bit
// i = 8u + v (row-major, u the vertical frequency) is set when coefficient (u, v) exceeds the median of
// those 64 without the DC term (the 32nd of the 63). A re-encoded, rescaled or
// lightly re-coloured copy differs in a few bits; unrelated pictures in about half.
uint64_t perceptual_hash(const Image& image);
// A decoded picture's: of planes, the stored luma (Y is the same 601 luma, before rounding to RGB).
uint64_t perceptual_hash(const DecodeResult& decoded);
int hamming_distance(uint64_t a, uint64_t b);

// A PNG of `image` (8-bit RGB, no interlace): the demo's rendered image sets and the tests' fixtures.
std::vector<uint8_t> encode_png(const Image& image);

}  // namespace forge::data
