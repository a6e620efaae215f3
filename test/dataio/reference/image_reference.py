#!/usr/bin/python3
"""Reference pictures for forge's image module (dataio/include/forge/dataio/image.h), from PIL and numpy.

  generate DIR                      writes DIR/manifest.json and the files it names: PNG and JPEG files of
                                    every kind decode_image accepts and refuses, all drawn here from fixed
                                    seeds; for each decodable one the RGB pixels the header's rules give
                                    (raw, row-major), PIL's Image.resize(..., BILINEAR) of them to a few
                                    sizes, and PIL's pad, crop and stretch to a square, each also with the
                                    same kernel on float channels (mode F: no rounding between the passes,
                                    float32, not rounded at the end either);
                                    the perceptual-hash and pixel-hash sets. Byte-identical on every run.
  check-png PNG RAW WIDTH HEIGHT    exit 0 when PIL decodes PNG to exactly the RGB bytes of RAW (the test's
                                    check of encode_png against another decoder).

The expected pixels do not come from PIL's mode conversions alone: every file is decoded by PIL, turned into
RGB by the header's rules in numpy (grey replicated, alpha dropped, palette looked up, 16-bit samples >> 8;
PIL's own convert("L") clips 16-bit grey instead), and, where this script wrote the samples itself, checked
against those samples. JPEG pixels are PIL's decode, which runs the same libjpeg-turbo (accurate integer
IDCT, fancy upsampling) as decode_image.
"""
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

FILL = (122, 116, 104)  # fit_image's default fill
FIT_SIZE = 24

# Adam7: (x start, y start, x step, y step) of the seven passes.
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def natural(seed, width, height):
    """A photo-like RGB picture: 1/f noise (the spectrum of natural images) in a luma and two chroma planes,
    a few soft-edged ellipses, and fine sensor-like noise."""
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    f = np.hypot(fx, fy)
    f[0, 0] = 1.0
    planes = []
    for _ in range(3):
        spectrum = (rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f ** 1.2
        spectrum[0, 0] = 0
        p = np.fft.irfft2(spectrum, s=(height, width))
        planes.append((p - p.mean()) / (p.std() + 1e-12))
    luma, cb, cr = planes[0], 0.35 * planes[1], 0.35 * planes[2]
    rgb = np.stack([luma + 1.4 * cr, luma - 0.34 * cb - 0.71 * cr, luma + 1.77 * cb], axis=-1)
    rgb = 128 + 45 * rgb + rng.uniform(-40, 40, size=3)
    yy, xx = np.mgrid[0:height, 0:width]
    for _ in range(int(rng.integers(2, 6))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(0.05, 0.3) * width, rng.uniform(0.05, 0.3) * height
        d = ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2
        a = np.clip(1.5 - d, 0, 1)[..., None]
        rgb = rgb * (1 - a) + rng.uniform(0, 255, size=3) * a
    rgb += rng.normal(0, 3, size=rgb.shape)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def gradient(width, height):
    """Smooth ramps in every channel, so resampling errors show as steps."""
    x = np.linspace(0, 255, width)[None, :]
    y = np.linspace(0, 255, height)[:, None]
    return np.clip(np.rint(np.stack([x + 0 * y, y + 0 * x, (x + y) / 2], axis=-1)), 0, 255).astype(np.uint8)


def noise(seed, shape, high=256, dtype=np.uint8):
    return np.random.default_rng(seed).integers(0, high, size=shape).astype(dtype)


# --- a PNG writer for what PIL cannot write: 16-bit colour, 2-bit grey, palettes at 1 and 4 bits, Adam7


def chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def scanlines(samples, bit_depth):
    """Filter type 0 rows of `samples` (height x width x channels)."""
    out = bytearray()
    for row in samples:
        flat = row.reshape(-1)
        if bit_depth == 16:
            data = flat.astype(">u2").tobytes()
        elif bit_depth == 8:
            data = flat.astype(np.uint8).tobytes()
        else:
            bits = (flat[:, None].astype(np.uint8) >> np.arange(bit_depth - 1, -1, -1, dtype=np.uint8)) & 1
            data = np.packbits(bits.reshape(-1)).tobytes()
        out += b"\0" + data
    return bytes(out)


def png_bytes(samples, color_type, bit_depth, interlace=False, palette=None, trns=None):
    if samples.ndim == 2:
        samples = samples[..., None]
    assert samples.shape[2] == CHANNELS[color_type]
    height, width = samples.shape[:2]
    if interlace:
        # An empty pass (no column or no row of this picture) has no scanlines at all.
        raw = b"".join(scanlines(samples[y0::dy, x0::dx], bit_depth) for x0, y0, dx, dy in ADAM7
                       if x0 < width and y0 < height)
    else:
        raw = scanlines(samples, bit_depth)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color_type,
                                                          0, 0, int(interlace)))
    if palette is not None:
        out += chunk(b"PLTE", np.asarray(palette, dtype=np.uint8).tobytes())
    if trns is not None:
        out += chunk(b"tRNS", trns)
    return out + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def pil_bytes(image, fmt, **options):
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


# --- the header's rules, applied to what PIL decoded


def expected_rgb(path):
    """The RGB pixels decode_image must produce for `path` (height x width x 3, uint8)."""
    with Image.open(path) as im:
        im.load()
        return rules_rgb(im, path)


def drafted_rgb(path, k):
    """A JPEG as PIL's draft mode decodes it at 1/k (libjpeg's DCT scaling; k = 2, 4, 8), under the header's
    rules: what decode_image makes of it reduced for a fit."""
    with Image.open(path) as im:
        w, h = im.size
        im.draft("RGB", (w // k, h // k))
        if im.size != (-(-w // k), -(-h // k)):
            raise SystemExit(f"{path}: PIL's draft at 1/{k} gives {im.size}")
        im.load()
        return rules_rgb(im, path)


def ycbcr_planes(path):
    """For a JPEG decode_image may return as planes (three components, YCbCr, chroma subsampled by 1 or 2
    each way): ((luma pixels per chroma sample across, down), PIL's YCbCr decode, height x width x 3). Its Y
    is the stored luma (libjpeg converts no colour for YCbCr output); its chroma is upsampled unless 4:4:4."""
    with Image.open(path) as im:
        if im.mode != "RGB" or len(im.layer) != 3:
            return None
        (_, h, v, _), *chroma = im.layer
        if h > 2 or v > 2 or any((ch, cv) != (1, 1) for _, ch, cv, _ in chroma):
            return None
        im.draft("YCbCr", im.size)
        im.load()
        assert im.mode == "YCbCr"
        return (h, v), np.array(im)


def to_ycbcr(rgb):
    """JFIF's RGB -> YCbCr in float (the fill's)."""
    r, g, b = (float(v) for v in rgb)
    return (0.299 * r + 0.587 * g + 0.114 * b, 128 - 0.168736 * r - 0.331264 * g + 0.5 * b,
            128 + 0.5 * r - 0.418688 * g - 0.081312 * b)


def planar_fitted(ycc, size, fit, fill):
    """fit_image of a 4:4:4 JPEG's planes, in float: each plane fitted as a float picture (mode F) on the
    fill's own YCbCr value, then JFIF's YCbCr -> RGB; not rounded (float32)."""
    planes = []
    for c, fill_value in enumerate(to_ycbcr(fill)):
        plane = Image.fromarray(ycc[..., c].astype(np.float32), "F")
        w, h = plane.size
        if fit == "pad":
            side = max(w, h)
            square = Image.new("F", (side, side), fill_value)
            square.paste(plane, ((side - w) // 2, (side - h) // 2))
            plane = square
        elif fit == "crop":
            side = min(w, h)
            left, top = (w - side) // 2, (h - side) // 2
            plane = plane.crop((left, top, left + side, top + side))
        planes.append(np.array(plane.resize((size, size), Image.BILINEAR), dtype=np.float64))
    y, cb, cr = planes[0], planes[1] - 128, planes[2] - 128
    rgb = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], axis=-1)
    return rgb.astype("<f4")


def rules_rgb(im, path):
    """The header's rules on a loaded PIL picture."""
    mode, fmt = im.mode, im.format
    a = np.array(im)
    palette = im.getpalette()
    if mode == "RGB":
        return a
    if mode in ("RGBA", "RGBX"):
        return np.ascontiguousarray(a[..., :3])
    if mode == "1":
        return np.repeat((a.astype(np.uint8) * 255)[..., None], 3, axis=2)
    if mode == "L":
        return np.repeat(a[..., None], 3, axis=2)
    if mode == "LA":
        return np.repeat(a[..., :1], 3, axis=2)
    if mode.startswith("I"):  # 16-bit grey: the high byte
        assert fmt == "PNG" and a.max() <= 0xFFFF
        return np.repeat((a.astype(np.uint32) >> 8).astype(np.uint8)[..., None], 3, axis=2)
    if mode == "P":
        table = np.array(palette, dtype=np.uint8).reshape(-1, 3)
        return table[a]
    raise ValueError(f"{path}: no rule for PIL mode {mode}")


def high_byte_rgb(samples, color_type, bit_depth, palette=None):
    """The header's rules applied to the samples this script wrote (the second, PIL-free derivation)."""
    if samples.ndim == 2:
        samples = samples[..., None]
    if color_type == 3:
        return np.asarray(palette, dtype=np.uint8).reshape(-1, 3)[samples[..., 0]]
    if bit_depth == 16:
        v = (samples.astype(np.uint32) >> 8).astype(np.uint8)
    else:
        v = (samples.astype(np.uint32) * 255 // ((1 << bit_depth) - 1)).astype(np.uint8)
    colour = v[..., :3] if color_type in (2, 6) else np.repeat(v[..., :1], 3, axis=2)
    return np.ascontiguousarray(colour)


def phash(rgb):
    """The header's perceptual hash: 601 luma, PIL's BILINEAR (float) resize to 32 x 32, DCT-II, the 8 x 8
    lowest frequencies (u vertical, v horizontal, bit 8u + v), set above the median of the 63 without DC."""
    rgb = rgb.astype(np.float32)
    luma = np.float32(0.299) * rgb[..., 0] + np.float32(0.587) * rgb[..., 1] + np.float32(0.114) * rgb[..., 2]
    small = np.array(Image.fromarray(luma, mode="F").resize((32, 32), Image.BILINEAR), dtype=np.float64)
    n = np.arange(32)
    d = np.cos(np.pi * np.outer(np.arange(8), 2 * n + 1) / 64)
    coeff = (d @ small @ d.T).reshape(-1)
    median = np.sort(coeff[1:])[31]
    return sum(1 << i for i in range(64) if coeff[i] > median)


# --- the manifest


class Writer:
    def __init__(self, root):
        self.root = root
        self.cases = []

    def path(self, name):
        return os.path.join(self.root, name)

    def write(self, name, data):
        with open(self.path(name), "wb") as f:
            f.write(data)

    def raw(self, name, rgb):
        assert rgb.dtype in (np.uint8, np.dtype("<f4")) and rgb.ndim == 3 and rgb.shape[2] == 3
        self.write(name, np.ascontiguousarray(rgb).tobytes())
        return name

    def refused(self, name, data, reason):
        self.write(name, data)
        self.cases.append({"name": name, "file": name, "reason": reason})

    def decodable(self, name, data, source_rgb=None, fill=FILL):
        """`source_rgb`: what the header's rules make of the samples written, when this script wrote them."""
        self.write(name, data)
        rgb = expected_rgb(self.path(name))
        if source_rgb is not None and not np.array_equal(rgb, source_rgb):
            raise SystemExit(f"{name}: PIL's decode differs from the samples written")
        height, width = rgb.shape[:2]
        im = Image.fromarray(rgb, "RGB")
        resizes = [self.resize(name, im, w, h) for w, h in resize_targets(width, height)]
        fits = [self.fit(name, im, fit, FIT_SIZE, fill) for fit in ("pad", "crop", "stretch")]
        case = {"name": name, "file": name, "reason": "", "width": width, "height": height,
                "pixels": self.raw(f"{name}.rgb", rgb), "resize": resizes, "fit": fits}
        if name.endswith(".jpg"):  # decoded reduced, at every scale the picture allows
            case["reduced"] = [{"k": k, "pixels": self.raw(f"{name}.reduced_{k}.rgb", drafted_rgb(self.path(name), k))}
                               for k in (2, 4, 8) if min(width, height) >= k]
            planes = ycbcr_planes(self.path(name))
            if planes is not None:
                step, ycc = planes
                case["planes"] = {"chroma_step": list(step), "ycbcr": self.raw(f"{name}.ycbcr", ycc)}
                if step == (1, 1):  # chroma as stored is PIL's YCbCr: the planar fit computed here too
                    case["planes"]["fit"] = [
                        {"fit": fit, "size": FIT_SIZE, "fill": list(fill),
                         "floats": self.raw(f"{name}.planar_{fit}_{FIT_SIZE}.f32",
                                            planar_fitted(ycc, FIT_SIZE, fit, fill))}
                        for fit in ("pad", "crop", "stretch")]
        self.cases.append(case)
        return rgb

    # Each resize and fit as PIL's BILINEAR on RGB ("pixels") and on float channels ("floats": float32).
    def resize(self, name, im, w, h):
        stem = f"{name}.resize_{w}x{h}"
        return {"width": w, "height": h, "pixels": self.raw(stem + ".rgb", resized(im, w, h)),
                "floats": self.raw(stem + ".f32", resized_float(im, w, h))}

    def fit(self, name, im, fit, size, fill):
        stem = f"{name}.{fit}_{size}"
        return {"fit": fit, "size": size, "fill": list(fill),
                "pixels": self.raw(stem + ".rgb", fitted(im, size, fit, fill)),
                "floats": self.raw(stem + ".f32", fitted(im, size, fit, fill, resized_float))}


def resize_targets(width, height):
    """A downscale in x and upscale in y, the reverse, and a small square (non-uniform scales throughout)."""
    return [(max(1, width // 3), 2 * height + 1), (2 * width + 3, max(1, height // 2)), (7, 5)]


def resized(im, width, height):
    return np.array(im.resize((width, height), Image.BILINEAR))


def resized_float(im, width, height):
    """The same kernel on each channel as a float picture (PIL's mode F: no rounding between the passes, as
    resize_image), not rounded (float32)."""
    channels = [np.array(Image.fromarray(np.array(im)[..., c].astype(np.float32), "F").resize(
        (width, height), Image.BILINEAR)) for c in range(3)]
    return np.stack(channels, axis=-1).astype("<f4")


def fitted(im, size, fit, fill, resample=resized):
    w, h = im.size
    if fit == "pad":
        side = max(w, h)
        square = Image.new("RGB", (side, side), tuple(fill))
        square.paste(im, ((side - w) // 2, (side - h) // 2))
        return resample(square, size, size)
    if fit == "crop":
        side = min(w, h)
        left, top = (w - side) // 2, (h - side) // 2
        return resample(im.crop((left, top, left + side, top + side)), size, size)
    return resample(im, size, size)


def png_cases(out):
    photo = natural(1, 61, 47)
    out.decodable("rgb8.png", pil_bytes(Image.fromarray(photo), "PNG"), photo)
    rgba = np.concatenate([natural(2, 45, 38), noise(3, (38, 45, 1))], axis=2)
    rgba[::5, ::3, 3] = 0  # fully transparent pixels keep their stored colour
    out.decodable("rgba8.png", pil_bytes(Image.fromarray(rgba, "RGBA"), "PNG"), rgba[..., :3])
    grey = gradient(50, 33)[..., 0]
    out.decodable("grey8.png", pil_bytes(Image.fromarray(grey, "L"), "PNG"), np.repeat(grey[..., None], 3, 2))
    la = np.stack([natural(4, 40, 31)[..., 1], noise(5, (31, 40))], axis=-1)
    out.decodable("grey_alpha8.png", pil_bytes(Image.fromarray(la, "LA"), "PNG"),
                  np.repeat(la[..., :1], 3, 2))
    bits = noise(6, (29, 43), high=2)
    out.decodable("grey1.png", pil_bytes(Image.fromarray(bits.astype(bool)), "PNG"),
                  np.repeat((bits * 255)[..., None], 3, 2))
    g2 = noise(7, (21, 34), high=4)
    out.decodable("grey2.png", png_bytes(g2, 0, 2), high_byte_rgb(g2, 0, 2))
    g8 = noise(8, (19, 23))
    out.decodable("grey8_trns.png", png_bytes(g8, 0, 8, trns=struct.pack(">H", int(g8[0, 0]))),
                  high_byte_rgb(g8, 0, 8))
    for depth in (1, 4):
        colours = 1 << depth
        palette = noise(10 + depth, (colours, 3))
        index = noise(20 + depth, (27, 41), high=colours)
        rule = high_byte_rgb(index, 3, depth, palette)
        out.decodable(f"palette{depth}.png", png_bytes(index, 3, depth, palette=palette), rule)
        alpha = noise(30 + depth, colours).tobytes()
        out.decodable(f"palette{depth}_trns.png", png_bytes(index, 3, depth, palette=palette, trns=alpha), rule)
    # An 8-bit palette as PIL writes it (quantized photo, one transparent index).
    quantized = Image.fromarray(natural(9, 52, 36)).quantize(colors=200)
    out.decodable("palette8_trns.png", pil_bytes(quantized, "PNG", transparency=3))
    for name, color_type, shape in (("grey16.png", 0, (33, 47)), ("grey_alpha16.png", 4, (25, 31, 2)),
                                    ("rgb16.png", 2, (30, 37, 3)), ("rgba16.png", 6, (26, 35, 4))):
        samples = noise(40 + color_type, shape, high=1 << 16, dtype=np.uint16)
        out.decodable(name, png_bytes(samples, color_type, 16), high_byte_rgb(samples, color_type, 16))
    interlaced = natural(50, 37, 29)
    out.decodable("interlaced_rgb8.png", png_bytes(interlaced, 2, 8, interlace=True), interlaced)
    tiny = noise(51, (2, 3, 3))  # passes 2, 3, 5 and 7 of Adam7 are empty or partial
    out.decodable("interlaced_3x2.png", png_bytes(tiny, 2, 8, interlace=True), tiny)
    g16 = noise(52, (23, 19), high=1 << 16, dtype=np.uint16)
    out.decodable("interlaced_grey16.png", png_bytes(g16, 0, 16, interlace=True), high_byte_rgb(g16, 0, 16))
    p4 = noise(53, (17, 26), high=16)
    pal = noise(54, (16, 3))
    out.decodable("interlaced_palette4_trns.png",
                  png_bytes(p4, 3, 4, interlace=True, palette=pal, trns=noise(55, 16).tobytes()),
                  high_byte_rgb(p4, 3, 4, pal))
    for name, (w, h) in (("column_1x37.png", (1, 37)), ("row_53x1.png", (53, 1)), ("prime_101x67.png", (101, 67)),
                         ("wide_997x5.png", (997, 5))):
        rgb = natural(60 + w, w, h)
        out.decodable(name, pil_bytes(Image.fromarray(rgb), "PNG"), rgb)


def jpeg_cases(out):
    photo = Image.fromarray(natural(70, 64, 48))
    out.decodable("baseline.jpg", pil_bytes(photo, "JPEG", quality=90))
    out.decodable("progressive.jpg", pil_bytes(photo, "JPEG", quality=85, progressive=True))
    out.decodable("optimized.jpg", pil_bytes(photo, "JPEG", quality=75, optimize=True))
    out.decodable("grey.jpg", pil_bytes(photo.convert("L"), "JPEG", quality=90))
    out.decodable("grey_progressive.jpg", pil_bytes(photo.convert("L"), "JPEG", progressive=True))
    odd = Image.fromarray(natural(71, 37, 23))
    out.decodable("s420_37x23.jpg", pil_bytes(odd, "JPEG", quality=92, subsampling=2))
    out.decodable("s422_37x23.jpg", pil_bytes(odd, "JPEG", quality=92, subsampling=1))
    out.decodable("s444_37x23.jpg", pil_bytes(odd, "JPEG", quality=92, subsampling=0))
    portrait = Image.fromarray(natural(77, 29, 41))  # pad's fill left and right, at an odd offset
    out.decodable("s444_29x41.jpg", pil_bytes(portrait, "JPEG", quality=92, subsampling=0))
    out.decodable("s420_29x41.jpg", pil_bytes(portrait, "JPEG", quality=92, subsampling=2))
    out.decodable("progressive_s420_37x23.jpg", pil_bytes(odd, "JPEG", subsampling=2, progressive=True))
    # Orientation 6 ("rotate 90 CW to display"): decode_image keeps the stored 48 x 32.
    exif = Image.Exif()
    exif[0x0112] = 6
    stored = Image.fromarray(natural(72, 48, 32))
    out.decodable("exif_orientation6.jpg", pil_bytes(stored, "JPEG", quality=90, exif=exif.tobytes()))
    for name, (w, h) in (("column_1x37.jpg", (1, 37)), ("wide_1001x7.jpg", (1001, 7)),
                         ("prime_53x89.jpg", (53, 89))):
        out.decodable(name, pil_bytes(Image.fromarray(natural(80 + w, w, h)), "JPEG", quality=88))


def refusal_cases(out):
    cmyk = Image.fromarray(noise(90, (24, 32, 4)), "CMYK")
    out.refused("cmyk.jpg", pil_bytes(cmyk, "JPEG"), "unsupported_color")
    png = pil_bytes(Image.fromarray(natural(91, 96, 64)), "PNG")
    out.refused("truncated.png", png[: len(png) * 6 // 10], "undecodable")
    jpg = pil_bytes(Image.fromarray(natural(92, 96, 64)), "JPEG", quality=90)
    out.refused("truncated.jpg", jpg[: len(jpg) * 6 // 10], "undecodable")
    out.refused("truncated_progressive.jpg",
                pil_bytes(Image.fromarray(natural(93, 96, 64)), "JPEG", progressive=True)[:1500], "undecodable")
    bad_crc = bytearray(png)
    bad_crc[png.index(b"IDAT") + 40] ^= 0x55
    out.refused("bad_crc.png", bytes(bad_crc), "undecodable")
    out.refused("garbage.bin", noise(94, 3000).tobytes(), "unsupported_format")
    out.refused("empty.bin", b"", "unsupported_format")
    out.refused("gif.gif", pil_bytes(Image.fromarray(natural(95, 20, 20)).convert("P"), "GIF"),
                "unsupported_format")
    out.refused("png_signature_garbage.png", b"\x89PNG\r\n\x1a\n" + noise(96, 500).tobytes(), "undecodable")
    out.refused("jpeg_soi_garbage.jpg", b"\xff\xd8\xff" + noise(97, 500).tobytes(), "undecodable")
    # Decompression bombs that end right after their header: refused for the size, not the truncation.
    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0))
    out.refused("huge_header.png", b"\x89PNG\r\n\x1a\n" + ihdr, "too_large")
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, 60000, 60000, 3) + bytes([1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1])
    out.refused("huge_header.jpg", b"\xff\xd8" + sof, "too_large")


def phash_set(out):
    """A natural picture and three near copies (JPEG quality 60, half size, +10 brightness), unrelated
    pictures of several sizes, and small ones; with this script's hash of each, for the test to compare its
    own with."""
    base = natural(100, 256, 192)
    variants = {
        "base": pil_bytes(Image.fromarray(base), "PNG"),
        "jpeg_q60": pil_bytes(Image.fromarray(base), "JPEG", quality=60),
        "half": pil_bytes(Image.fromarray(base).resize((128, 96), Image.LANCZOS), "PNG"),
        "brighter": pil_bytes(Image.fromarray(np.clip(base.astype(int) + 10, 0, 255).astype(np.uint8)), "PNG"),
    }
    near = {}
    for key, data in variants.items():
        name = f"phash_{key}" + (".jpg" if key.startswith("jpeg") else ".png")
        out.write(name, data)
        near[key] = {"file": name, "hash": f"{phash(expected_rgb(out.path(name))):016x}"}
    sizes = [(160, 120), (120, 160), (200, 200), (96, 64), (300, 180)]
    unrelated = []
    for i in range(20):
        w, h = sizes[i % len(sizes)]
        name = f"phash_unrelated{i:02d}.png"
        out.write(name, pil_bytes(Image.fromarray(natural(200 + i, w, h)), "PNG"))
        unrelated.append({"file": name, "hash": f"{phash(expected_rgb(out.path(name))):016x}"})
    # Pictures smaller than 32 x 32 on a side (upscaled there), as decoded for the cases above.
    small = [{"file": name, "hash": f"{phash(expected_rgb(out.path(name))):016x}"}
             for name in ("s420_37x23.jpg", "interlaced_rgb8.png", "exif_orientation6.jpg", "rgb8.png")]
    return {"near": near, "unrelated": unrelated, "small": small}


def pixel_hash_set(out):
    """One picture in several lossless files: all must hash alike."""
    rgb = natural(300, 45, 31)
    files = {
        "same_level1.png": pil_bytes(Image.fromarray(rgb), "PNG", compress_level=1),
        "same_level9.png": pil_bytes(Image.fromarray(rgb), "PNG", compress_level=9),
        "same_rgba.png": pil_bytes(Image.fromarray(np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])), "PNG"),
        "same_rgb16.png": png_bytes(rgb.astype(np.uint16) * 257, 2, 16),
        "same_interlaced.png": png_bytes(rgb, 2, 8, interlace=True),
    }
    for name, data in files.items():
        out.write(name, data)
        assert np.array_equal(expected_rgb(out.path(name)), rgb), name
    return {"files": sorted(files), "pixels": out.raw("same.rgb", rgb), "width": rgb.shape[1],
            "height": rgb.shape[0]}


def generate(root):
    os.makedirs(root, exist_ok=True)
    out = Writer(root)
    png_cases(out)
    jpeg_cases(out)
    refusal_cases(out)
    # A larger photo fitted to an encoder's 224 from both sides (upscale one way, downscale the other).
    photo = natural(400, 300, 200)
    rgb = out.decodable("photo_300x200.png", pil_bytes(Image.fromarray(photo), "PNG"), photo, fill=(0, 255, 0))
    out.cases[-1]["fit"] += [out.fit("photo_300x200.png", Image.fromarray(rgb), fit, 224, (0, 255, 0))
                             for fit in ("pad", "crop", "stretch")]
    manifest = {"cases": out.cases, "phash": phash_set(out), "pixel_hash": pixel_hash_set(out)}
    with open(out.path("manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


def check_png(png, raw, width, height):
    with Image.open(png) as im:
        if im.format != "PNG" or im.mode != "RGB" or im.size != (width, height):
            print(f"{png}: PIL reads {im.format} {im.mode} {im.size}, expected PNG RGB {(width, height)}")
            return 1
        got = np.array(im)
    with open(raw, "rb") as f:
        want = np.frombuffer(f.read(), dtype=np.uint8).reshape(height, width, 3)
    if not np.array_equal(got, want):
        print(f"{png}: {int(np.count_nonzero(got != want))} samples differ from {raw}")
        return 1
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "generate":
        generate(argv[2])
        return 0
    if len(argv) == 6 and argv[1] == "check-png":
        return check_png(argv[2], argv[3], int(argv[4]), int(argv[5]))
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
