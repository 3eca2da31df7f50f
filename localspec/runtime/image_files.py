"""An image's bytes checked before llama.cpp decodes them: their size, their pixels, their format.

libmtmd decodes images with stb_image, which reads PNG, JPEG, GIF, BMP and a few rarer formats, and decodes
whatever it is given in full: a small file can hold a huge image (a few hundred KB of PNG can be 12000 x 12000
pixels, most of a gigabyte once decoded). So Pillow reads each image's header first (it decodes nothing
there): the pixel count is checked against a limit, and a format stb_image cannot read (WebP, which browsers
and phones send, TIFF, ICO) is converted to PNG.
"""

from __future__ import annotations

import io

from ..errors import ConfigError

#: The most bytes one image may have (encoded, as sent).
MAX_IMAGE_BYTES = 20 << 20
#: The most pixels one image may have (an 8K screenshot has 33.2 million).
MAX_PIXELS = 7680 * 4320
#: The most pixels the images of one prompt may have in all.
MAX_PROMPT_PIXELS = 4 * MAX_PIXELS
#: Pillow's names of the formats stb_image reads itself.
STB_FORMATS = frozenset({"PNG", "JPEG", "GIF", "BMP", "TGA", "PSD", "PPM"})


class ImageError(ConfigError):
    """An image that cannot be read, or one too many, too large, or sent to a model that cannot see."""


def readable(i: int, data: bytes) -> tuple[bytes, int]:
    """Image ``i`` (counted from 0) as bytes stb_image reads, and its pixel count.

    Raises:
        ImageError: the image is empty, larger than ``MAX_IMAGE_BYTES`` or ``MAX_PIXELS``, or not an image.
    """
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, (bytes, bytearray)) or not data:
        raise ImageError(f"Image {i + 1} is empty.")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"Image {i + 1} is {len(data) / 1e6:.1f} MB; the limit is {MAX_IMAGE_BYTES >> 20} MiB: "
                         "send it smaller (a PNG or JPEG of the screen or the part that matters).")
    try:
        with Image.open(io.BytesIO(data)) as im:  # the header only
            width, height = im.size
            pixels = width * height
            if pixels > MAX_PIXELS:
                raise ImageError(f"Image {i + 1} is {width} x {height} pixels, more than the {MAX_PIXELS / 1e6:.1f} "
                                 "million an image may have; scale it down (the model sees it smaller anyway).")
            if im.format in STB_FORMATS:
                return bytes(data), pixels
            out = io.BytesIO()  # WebP and the rest: decoded here (its size is checked), passed on as PNG
            im.convert("RGBA" if "A" in im.getbands() else "RGB").save(out, format="PNG")
            return out.getvalue(), pixels
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError, SyntaxError) as exc:
        raise ImageError(f"Image {i + 1} could not be read as an image ({type(exc).__name__}: corrupt, cut short "
                         "or not an image); send a PNG or JPEG file's bytes.") from None
