// Prints one digest of fit_image's pictures (every fit, shrinking and growing, odd widths; of RGB and of a
// JPEG's planes) and of the perceptual hash, over fixed pseudo-random pictures. image_isa_test.sh builds it
// with image.cpp for each instruction set the library has a clone for, and compares the digests.
#include "forge/common/hash.h"
#include "forge/dataio/image.h"

#include <cstdio>
#include <random>

using namespace forge::data;

int main() {
  struct Case {
    uint32_t width, height, size;
  };
  std::mt19937 random(3);
  forge::Xxh3Stream digest;
  for (const Case c :
       {Case{640, 480, 336}, {640, 480, 224}, {333, 517, 224}, {97, 61, 224}, {1001, 999, 336}}) {
    Image picture;
    picture.width = c.width;
    picture.height = c.height;
    picture.rgb.resize(size_t{3} * c.width * c.height);
    for (uint8_t& v : picture.rgb) v = static_cast<uint8_t>(random());
    for (const ImageFit fit : {ImageFit::kPad, ImageFit::kCrop, ImageFit::kStretch}) {
      const uint64_t h = pixel_hash(fit_image(picture, c.size, fit));
      digest.update(&h, sizeof h);
    }
    const uint64_t p = perceptual_hash(picture);
    digest.update(&p, sizeof p);
    // A JPEG's planes, chroma subsampled both ways and across only.
    for (const std::array<uint32_t, 2> step : {std::array<uint32_t, 2>{2, 2}, {2, 1}}) {
      DecodeResult planes;
      planes.planes.width = c.width;
      planes.planes.height = c.height;
      planes.planes.chroma_step = step;
      for (int k = 0; k < 3; ++k) {
        YCbCrPlanes::Plane& plane = planes.planes.plane[k];
        plane.width = k == 0 ? c.width : (c.width + step[0] - 1) / step[0];
        plane.height = k == 0 ? c.height : (c.height + step[1] - 1) / step[1];
        plane.stride = plane.width;
        plane.bytes.resize(size_t{plane.width} * plane.height);
        for (uint8_t& v : plane.bytes) v = static_cast<uint8_t>(random());
      }
      for (const ImageFit fit : {ImageFit::kPad, ImageFit::kCrop, ImageFit::kStretch}) {
        const uint64_t h = pixel_hash(fit_image(planes, c.size, fit));
        digest.update(&h, sizeof h);
      }
      const uint64_t q = perceptual_hash(planes);
      digest.update(&q, sizeof q);
    }
  }
  std::printf("%016llx\n", static_cast<unsigned long long>(digest.digest()));
}
