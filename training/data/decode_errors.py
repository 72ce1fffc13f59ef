"""The error every image decoder raises and the canvas limit every decoder applies, in a module of their own so
decoders (DICOM, raster) need not import each other: :mod:`training.data.images` dispatches to
:mod:`training.data.dicom`, and both use these."""

from pathlib import Path

from training.errors import UserError

#: How PyTorch re-raises an exception of a loader worker: the same type, built from one string that holds the
#: worker's whole traceback (``torch.utils._utils.ExceptionWrapper.reraise``).
WORKER_PREFIX = "Caught ImageDecodeError in DataLoader worker process"


class ImageDecodeError(UserError, OSError):
    """An image file exists but cannot be decoded; the message names the file and the reason.

    A :class:`~training.errors.UserError`, so every entry point ends it as one line; an ``OSError`` too, so code
    that treats missing and undecodable files alike catches both with one clause. From a loader worker PyTorch
    rebuilds it with the worker's traceback as message; that is cut back to the worker's own.
    """

    def __init__(self, message: str = ""):
        if message.startswith(WORKER_PREFIX):
            message = message.rstrip().rpartition(f"{__name__}.{type(self).__qualname__}: ")[2]
        super().__init__(message)


def check_canvas(path: Path, size: tuple[int, int], max_pixels: int | None) -> None:
    """Refuse a declared ``(width, height)`` canvas above ``max_pixels`` (None: no limit), before anything is
    decoded (see :mod:`training.data.images`, "Canvas limit")."""
    width, height = size
    if max_pixels is not None and width * height > max_pixels:
        raise ImageDecodeError(f"declares a {width} x {height} canvas ({width * height:,} pixels), above the limit of "
                               f"{max_pixels:,} (data.max_pixels); not decoded: {path}")  # fmt: skip
