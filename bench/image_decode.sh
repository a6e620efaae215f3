#!/usr/bin/env bash
# Image decoding for image-text datasets on one core (bench_image_decode): 200 photo-like 640 x 480 pictures,
# half JPEG (libjpeg-turbo, quality 90) and half PNG, decoded by the libraries directly, by decode_image, by
# decode_image + fit_image to 224 and 336, and hashed by perceptual_hash; images per CPU-second, and the
# pipeline's time over the library's (prepare's path decodes a large JPEG reduced for the fit, one between one
# and two times the fit's side as its YCbCr planes; also shown decoded whole to RGB), and prepare's whole work.
#
# usage: bench/image_decode.sh [BUILD_DIR] [IMAGES] [WIDTH] [HEIGHT] [PASSES]
#   (default build/release, 200, 640, 480, 3; bench_image_decode is built if needed). JOBS=N sets the build
#   parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
# shellcheck source=lib.sh
source "$root/bench/lib.sh"
run_bench image_decode.sh "$build" bench_image_decode "${2:-200}" "${3:-640}" "${4:-480}" "${5:-3}"
