"""Image bytes -> the model's input, reproducing torchvision's evaluation transform with PIL and NumPy.

Resize(shorter side) -> CenterCrop -> ToTensor -> Normalize, computed the way torchvision computes it on
a PIL image, so a served model sees what validation saw (tests compare the two on the same images).
No torch here: the service decodes every upload with it, and export measures its fast JPEG path
(export/decode_check.py), so it lives beside contract/preprocessing.py, the description it implements.

Fast decoding (`decode(..., fast=True)`): a JPEG at least twice the resize target on its shorter side is
decoded at 1/2, 1/4 or 1/8 of its size by Pillow's draft mode (the JPEG's own DCT scaling), never below the
resize target: a 12-megapixel photo in ~18 ms instead of ~190 ms, with pixels that differ slightly from the
exact path. The service uses it only where the export's check of it passed.
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from contract.errors import ClientError
from contract.preprocessing import Preprocessing

# MPO: a JPEG with a multi-picture segment (many phone and stereo-camera photos); frame 0 is the primary image.
ACCEPTED_FORMATS = {"JPEG", "MPO", "PNG", "WEBP", "BMP", "GIF"}
# The only plugins Image.open tries (its JPEG plugin also opens MPO): by default it tries every format Pillow
# knows, and a 19 MB EPS held a decoder for 13 s before it was refused (security round 3, item 15).
OPEN_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF")
# Formats a client may send thinking they are served, told apart by their first bytes so that the answer names
# them (415) without any of their decoders running.
OTHER_FORMATS = {
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
    b"%!PS": "EPS",
    b"\xc5\xd0\xd3\xc6": "EPS",
    b"8BPS": "PSD",
    b"\x00\x00\x01\x00": "ICO",
    b"\x00\x00\x00\x0cjP  ": "JPEG 2000",
    b"%PDF": "PDF",
}
# A progressive JPEG is sent in scans, and the decoder passes over the whole image for each: Pillow and mozjpeg
# write about 10, and a photo's thumbnail adds its own. A file of thousands of tiny scans (234 KB) held a decoder
# 19 s, past the request's deadline, which cannot stop a decode (security round 3, item 5).
MAX_JPEG_SCANS = 100
# An animated image's first frame is decoded onto a full RGBA canvas, with copies: a 6000 x 6000 animated WebP
# (190 KB) took +549 MB to load against ~110 MB for a still image of that size (a 136-byte one, +0.7 GB, security
# round 3, item 8). Its canvas may hold this share of HANDOFF_MAX_PIXELS (5 MP of the default 40).
ANIMATED_PIXEL_SHARE = 8
# The longest side may be at most this many times the shortest (a wide panorama is about 10): the resize scales
# the shorter side up or down to `resize`, so a 1 x 40,000 strip would become 256 x 10,240,000 pixels.
MAX_ASPECT_RATIO = 50
_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}


@dataclass(frozen=True)
class Preprocessor:
    resize: int
    crop: int
    mean: np.ndarray  # shape (C, 1, 1), float32
    std: np.ndarray
    interpolation: str
    max_pixels: int
    resize_mode: str = "shorter"  # contract/preprocessing.py's RESIZE_MODES and CROP_OFFSETS
    crop_offset: str = "round"

    @classmethod
    def from_manifest(cls, preprocess: dict[str, Any], max_pixels: int) -> Preprocessor:
        spec, shape = Preprocessing.from_manifest(preprocess), (-1, 1, 1)
        return cls(
            spec.resize,
            spec.crop,
            np.asarray(spec.mean, dtype=np.float32).reshape(shape),
            np.asarray(spec.std, dtype=np.float32).reshape(shape),
            spec.interpolation,
            max_pixels,
            spec.resize_mode,
            spec.crop_offset,
        )

    def decode(self, data: bytes, fast: bool = False) -> Image.Image:
        """Open, check and normalise an upload to an 8-bit RGB image, upright per its EXIF orientation; `fast`:
        a large JPEG is decoded at a reduced scale (see the module's docstring)."""
        if not data:
            raise ClientError("the image is empty (0 bytes)")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data), formats=OPEN_FORMATS)  # reads the header only
        except UnidentifiedImageError:
            other = next((name for magic, name in OTHER_FORMATS.items() if data.startswith(magic)), None)
            if other is not None or data[4:8] == b"ftyp":  # HEIC, AVIF: an ISO media file
                raise ClientError(
                    f"unsupported image format {other or 'HEIC/AVIF'}; send JPEG, PNG, WebP, BMP or GIF", status=415
                ) from None
            raise ClientError("not an image PIL can identify (expected JPEG, PNG, WebP, BMP or GIF)") from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ClientError("image dimensions exceed the pixel limit", status=413) from None
        except (OSError, SyntaxError, ValueError) as err:
            raise ClientError(f"the image data is damaged or truncated ({err})") from None
        if image.format not in ACCEPTED_FORMATS:
            raise ClientError(f"unsupported image format {image.format}; send JPEG, PNG, WebP, BMP or GIF", status=415)
        width, height = image.size
        if width * height > self.max_pixels:  # checked before any pixel is decoded
            raise ClientError(
                f"image is {width}x{height} = {width * height} pixels, above the limit of {self.max_pixels}", status=413
            )
        if getattr(image, "is_animated", False) and width * height > self.max_pixels // ANIMATED_PIXEL_SHARE:
            raise ClientError(
                f"the animated image is {width}x{height} = {width * height} pixels, above the limit of "
                f"{self.max_pixels // ANIMATED_PIXEL_SHARE} for an animation (1/{ANIMATED_PIXEL_SHARE} of a still's)",
                status=413,
            )
        self.resized_size(width, height)  # and what the resize would make of it, before any pixel is decoded
        if image.format in ("JPEG", "MPO"):
            _check_scans(data)
        if fast and image.format in ("JPEG", "MPO"):
            self._draft(image)
        try:
            image.seek(0)  # animated GIF/WebP: the first frame
            image.load()
            return _to_8_bit(ImageOps.exif_transpose(image))
        except (OSError, SyntaxError, ValueError) as err:
            raise ClientError(f"the image data is damaged or truncated ({err})") from None

    def _draft(self, image: Image.Image) -> None:
        """Ask the JPEG decoder for the smallest DCT scale whose shorter side still reaches `resize` (Pillow picks
        1/2, 1/4 or 1/8 only where the whole image stays at least that size, so a smaller photo is decoded whole)."""
        width, height = image.size
        short = min(width, height)
        if short >= 2 * self.resize:
            image.draft(image.mode, (math.ceil(width * self.resize / short), math.ceil(height * self.resize / short)))

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """The size the resize gives (shorter side -> `resize`, as torchvision computes it, or `resize` x `resize`);
        ClientError (413) for an image so elongated that the result would pass the pixel limit or MAX_ASPECT_RATIO."""
        short, long = (width, height) if width <= height else (height, width)
        if self.resize_mode == "exact" and short >= 1:
            return self.resize, self.resize  # any aspect: the whole image is squeezed to the square
        if short < 1 or long > MAX_ASPECT_RATIO * short:
            raise ClientError(
                f"image is {width}x{height}, more than {MAX_ASPECT_RATIO} times longer than it is wide", status=413
            )
        new_short, new_long = self.resize, int(self.resize * long / short)
        if new_short * new_long > self.max_pixels:
            raise ClientError(
                f"image is {width}x{height}: resized to {new_short} on its shorter side it would be "
                f"{new_short * new_long} pixels, above the limit of {self.max_pixels}",
                status=413,
            )
        return (new_short, new_long) if width <= height else (new_long, new_short)

    def __call__(self, image: Image.Image) -> np.ndarray:
        """An 8-bit PIL image (RGB, or L: grayscale stays one channel until after the resize, which gives the
        same pixels as resizing three equal channels at a third of the memory) -> float32 (C, crop, crop)."""
        size = self.resized_size(*image.size)
        if size != image.size:
            image = image.resize(size, _RESAMPLE[self.interpolation])
        image = _center_crop(image, self.crop, self.crop_offset).convert("RGB")
        array = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)
        return (array - self.mean) / self.std


def _check_scans(data: bytes) -> None:
    """Refuse a JPEG of more than MAX_JPEG_SCANS scans. Each scan starts with the marker FF DA, which cannot occur
    inside entropy-coded data (an FF there is followed by 00 or a restart marker), so counting it in C bounds the
    scans from above (a byte pair in an EXIF or ICC segment may add to the count, never take from it)."""
    scans = data.count(b"\xff\xda")
    if scans > MAX_JPEG_SCANS:
        raise ClientError(f"the JPEG has {scans} scans, more than the {MAX_JPEG_SCANS} a photo needs", status=413)


def _to_8_bit(image: Image.Image) -> Image.Image:
    """RGB, or L for grayscale; 16- and 32-bit grayscale scaled to 8 bits (not clipped at 255), in place."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        array = np.array(image)  # the one copy: uint16 (or int32), scaled in place below
        if array.max(initial=0) > 255:
            np.floor_divide(array, 257, out=array)  # 65535 -> 255
        np.clip(array, 0, 255, out=array)
        return Image.fromarray(array.astype(np.uint8), mode="L")
    if image.mode == "L":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert("RGB")


def _center_crop(image: Image.Image, size: int, offset: str) -> Image.Image:
    """torchvision's center_crop offsets (`round`) or transformers' (`floor`); the resize before it (resize >= crop)
    leaves no padding to do."""
    width, height = image.size
    if (width, height) == (size, size):
        return image
    start = (lambda margin: int(round(margin / 2.0))) if offset == "round" else (lambda margin: margin // 2)
    top, left = start(height - size), start(width - size)
    return image.crop((left, top, left + size, top + size))
