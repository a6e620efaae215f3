#include "forge/common/image.h"

#include "forge/common/error.h"
#include "forge/common/json.h"

#include <cstdlib>
#include <filesystem>

namespace forge {

std::string running_image_digest(const std::string& identity_path) {
  std::error_code ec;
  if (!std::filesystem::exists(identity_path, ec)) return "";
  const Json identity = read_json(identity_path);
  const Json* field = identity.is_object() && identity.contains("digest") ? &identity["digest"] : nullptr;
  const std::string digest = field != nullptr && field->is_string() ? field->get<std::string>() : "";
  if (digest.rfind("sha256:", 0) != 0)
    fail(ExitCode::kData,
         "{} has no image digest (\"digest\": \"sha256:...\"): the image is damaged; rebuild it "
         "with forge-image build",
         identity_path);
  return digest;
}

std::string check_running_image(const std::string& run_image, const std::string& identity_path) {
  const std::string running = running_image_digest(identity_path);
  const char* env = std::getenv("FORGE_IMAGE_DIGEST");
  const std::string wanted = env != nullptr ? env : "";
  if (run_image.empty() && wanted.empty()) return running;
  if (running.empty())
    fail(ExitCode::kUsage,
         "run.image = {} but this rank runs outside any image: start the job with the batch scripts "
         "(scripts/sbatch), which run every rank through the OCI runtime of the node's oci.conf "
         "(docs/IMAGES.md)",
         run_image.empty() ? std::string("(from FORGE_IMAGE_DIGEST)") : run_image);
  if (!wanted.empty() && wanted != running)
    fail(ExitCode::kUsage, "the job asked for image {} ({}) but this rank runs in {}",
         run_image.empty() ? std::string("FORGE_IMAGE_DIGEST") : run_image, wanted, running);
  return running;
}

}  // namespace forge
