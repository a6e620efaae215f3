// Export of a checkpoint to one self-describing HDF5 file, for users outside this platform (PyTorch
// with h5py). Layout in docs/CHECKPOINTS.md: one dataset per logical tensor at /<kind>/<name> (e.g.
// /param/blocks.0.attn.qkv.weight) with its logical shape, and the manifest's fields as root attributes.
#pragma once

#include "forge/ckpt/checkpoint.h"

#include <string>

namespace forge::ckpt {

// Writes `out` through a temporary file and a rename, so a failed export leaves no partial file.
// `with_optimizer`: also the optimizer states (adam_m/, adam_v/, ...), not only param/.
void export_hdf5(const Checkpoint& ckpt, const std::string& out, bool with_optimizer);

}  // namespace forge::ckpt
