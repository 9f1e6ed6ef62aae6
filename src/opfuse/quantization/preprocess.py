"""The first-layer (AIPP) preprocessing of an image input, declared once: size, layout,
channel order, scale, mean and std, as seed 000's AIPP parameters (resize, channel swap,
``(pixel * scale - mean) / std``). ``--preprocess size=224,layout=NCHW,order=RGB,
scale=0.00392156862745098,mean=0.485:0.456:0.406,std=0.229:0.224:0.225``."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from opfuse.errors import OpfuseError

LAYOUTS = ("NCHW", "NHWC")
ORDERS = ("RGB", "BGR")


@dataclass(frozen=True)
class Preprocess:
    size: tuple[int, int] = (224, 224)  # height, width
    layout: str = "NCHW"
    order: str = "RGB"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)

    @classmethod
    def parse(cls, text: str) -> Preprocess:
        """``key=value`` pairs separated by commas; lists with ``:``; ``size=H`` or
        ``size=HxW``. A bad key or value is a one-line OpfuseError."""
        values: dict[str, Any] = {}  # field -> value, checked as each is parsed
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            where = f"--preprocess {item!r}"
            if not sep:
                raise OpfuseError(f"{where}: expected key=value")
            try:
                if key == "size":
                    dims = [int(v) for v in value.lower().split("x")]
                    values["size"] = (dims[0], dims[-1])
                elif key in ("layout", "order"):
                    allowed = LAYOUTS if key == "layout" else ORDERS
                    if value.upper() not in allowed:
                        raise ValueError(f"expected one of {', '.join(allowed)}")
                    values[key] = value.upper()
                elif key == "scale":
                    num, _, den = value.partition("/")
                    values["scale"] = float(num) / float(den or 1)
                elif key in ("mean", "std"):
                    values[key] = tuple(float(v) for v in value.split(":"))
                else:
                    raise ValueError("keys are size, layout, order, scale, mean, std")
            except (ValueError, IndexError, ZeroDivisionError) as exc:
                raise OpfuseError(f"{where}: {exc}") from None
        made = dataclasses.replace(cls(), **values)
        if len(made.mean) != len(made.std) or 0.0 in made.std:
            raise OpfuseError("--preprocess: mean and std need one value per channel, std not 0")
        return made

    def image(self, path: str | os.PathLike[str]) -> np.ndarray:
        """The image at ``path`` as a 1 x C x H x W (or 1 x H x W x C) float32 array."""
        try:
            from PIL import Image, UnidentifiedImageError
        except ImportError:
            raise OpfuseError(
                "--calibration with images needs Pillow: pip install 'opfuse[images]'"
            ) from None
        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize(
                    (self.size[1], self.size[0]), Image.Resampling.BILINEAR
                )
                pixels = np.asarray(rgb, dtype=np.float32)
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise OpfuseError(f"{path}: not a readable image ({exc})") from None
        return self.array(pixels)

    def array(self, pixels: np.ndarray) -> np.ndarray:
        """H x W x 3 RGB pixels (0..255) -> the model's input (batch of one)."""
        if self.order == "BGR":
            pixels = pixels[..., ::-1]
        channels = pixels.shape[-1]
        mean = np.resize(np.asarray(self.mean, np.float32), channels)
        std = np.resize(np.asarray(self.std, np.float32), channels)
        out = (pixels * np.float32(self.scale) - mean) / std
        if self.layout == "NCHW":
            out = out.transpose(2, 0, 1)
        return np.ascontiguousarray(out[None], dtype=np.float32)
