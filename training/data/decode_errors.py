"""The error every image decoder raises, in a module of its own so decoders (DICOM, raster) need not import each
other: :mod:`training.data.images` dispatches to :mod:`training.data.dicom`, and both raise this."""


class ImageDecodeError(OSError):
    """An image file exists but cannot be decoded; the message names the file and the reason."""
