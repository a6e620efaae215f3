// The container image a program runs in (docs/IMAGES.md). `forge-image build` writes the image's identity
// into it as /etc/forge-image.json; a process outside any image finds no such file.
#pragma once

#include <string>

namespace forge {

inline constexpr const char* kImageIdentityPath = "/etc/forge-image.json";

// The digest ("sha256:<hex>") of the image this process runs in; "" outside an image. kData naming the
// file when it is there but damaged.
std::string running_image_digest(const std::string& identity_path = kImageIdentityPath);

// A rank of a job that asked for an image (run.image; the batch scripts export FORGE_IMAGE_DIGEST) checks
// that it runs in that image: kUsage (the launch is wrong; running it again would not help) naming both
// when it runs in another image or in none (a launch that bypassed the batch scripts). `run_image` is
// run.image ("" when the spec names none). Returns the digest the rank runs in ("" for none).
std::string check_running_image(const std::string& run_image,
                                const std::string& identity_path = kImageIdentityPath);

}  // namespace forge
