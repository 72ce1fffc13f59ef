"""Initialise a backbone from a local weights file: ``model.weights=<path>`` (docs/recipes.md, "Starting from other weights").

Published chest X-ray weights come in many wrappings (bare state dict, timm or Lightning checkpoint, prefixed
DataParallel/compile keys, whole pickled models) with heads that never fit ours. Everything here maps them onto
the backbone's own keys and refuses loudly a file for another architecture: a silently half-loaded backbone
trains, but from a random start nobody asked for. Unpickling runs code from the file, so whole pickled objects
are only read behind ``model.weights_trust_pickle``.
"""

from __future__ import annotations

import logging
import pickle
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from timm.models import adapt_input_conv
from torch import nn

from training.errors import UserError

log = logging.getLogger(__name__)

FORMATS = ("auto", "state_dict", "timm", "lightning", "torchxrayvision")
#: Below this share of the backbone's tensors found in the file, the file is taken to be another architecture.
MIN_MATCHED = 0.9
#: Keys that hold a state dict inside a checkpoint, outermost first (Lightning, timm's train.py, common scripts).
CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module", "network", "net")
#: Prefixes added by wrappers: DataParallel/DDP, torch.compile, Lightning modules, encoder-decoder scripts.
PREFIXES = ("module.", "_orig_mod.", "backbone.", "model.", "encoder.", "net.", "network.")
#: Classification heads and their companions: ours is new, so these are expected to go unused.
HEAD_KEY = re.compile(r"^(classifier|fc|last_linear|head\.fc|head_dist)\.|^head\.(weight|bias)$|^op_threshs$")
#: torchvision's DenseNet checkpoints before 0.3 (and copies of them) spell ``norm1`` as ``norm.1``; the pattern
#: is torchvision's own (torchvision.models.densenet._load_state_dict).
OLD_DENSENET_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$"
)


class WeightsError(UserError):
    """A weights file that cannot initialise the chosen backbone; the message names the file and the fix."""


def load_weights(
    model: nn.Module, path: str | Path, weights_format: str = "auto", trust_pickle: bool = False
) -> dict[str, list[str]]:
    """Copy the backbone tensors of ``path`` into ``model`` (in place) and report what matched.

    ``weights_format``: ``auto`` reads every known wrapping; naming one makes any other an error, not a guess.
    ``trust_pickle`` allows a file that only loads by unpickling (it can run code). Returns ``loaded``, ``missing``
    (left as initialised) and ``unused`` (file keys not loaded).

    Raises:
        WeightsError: unreadable file, pickle without trust, or a file for another architecture (fewer than
            :data:`MIN_MATCHED` of the model's tensors found, or a tensor of the wrong shape).
    """
    path = Path(path).expanduser()
    if weights_format not in FORMATS:
        raise WeightsError(f"model.weights_format={weights_format!r}: expected one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise WeightsError(f"model.weights={str(path)!r}: no such file")
    raw = _read(path, trust_pickle)
    state = _unwrap(raw, path, weights_format)
    target = model.state_dict()
    state = _remap(state, model, target, weights_format, path)
    loaded, unused, mismatched = {}, [], []
    first_conv = _first_conv_key(model, target)
    for key, tensor in state.items():
        if key not in target:
            unused.append(key)
            continue
        expected = target[key]
        if tensor.shape != expected.shape and key == first_conv:
            tensor = _adapt_stem(tensor, expected)
        if tensor is None or tensor.shape != expected.shape:
            mismatched.append(f"{key}: file {tuple(state[key].shape)}, model {tuple(expected.shape)}")
            continue
        loaded[key] = tensor.to(dtype=expected.dtype)
    missing = [key for key in target if key not in loaded]
    share = len(loaded) / max(len(target), 1)
    if mismatched or share < MIN_MATCHED:
        raise WeightsError(
            f"{path} does not fit backbone {_arch(model)!r}: {len(loaded)} of its {len(target)} tensors found "
            f"({share:.0%}, at least {MIN_MATCHED:.0%} needed)"
            + (f"; wrong shapes: {_summary(mismatched)}" if mismatched else "")
            + (f"; missing, e.g.: {_summary(missing)}" if missing else "")
            + (f"; unused file keys, e.g.: {_summary(unused)}" if unused else "")
            + ". Check model.backbone against the architecture the file was trained with"
            + (f" (model.weights_format={weights_format})" if weights_format != "auto" else "")
        )
    model.load_state_dict(loaded, strict=False)
    heads = [key for key in unused if HEAD_KEY.search(key)]
    others = [key for key in unused if not HEAD_KEY.search(key)]
    log.info(
        "model.weights: loaded %d of %d backbone tensors from %s; model keys left as initialised: %s; "
        "file head keys dropped: %d; other unused file keys: %s",
        len(loaded), len(target), path, _summary(missing) or "none", len(heads), _summary(others) or "none",
    )  # fmt: skip
    return {"loaded": list(loaded), "missing": missing, "unused": unused}


def _read(path: Path, trust_pickle: bool):
    """The file's object. ``weights_only`` first, because unpickling a shared file runs whoever wrote it."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as error:  # safetensors raises its own SafetensorError for a damaged header
            raise WeightsError(f"{path}: not a readable safetensors file ({error})") from error
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if not trust_pickle:
            raise WeightsError(
                f"{path} holds pickled Python objects (a whole saved model, or custom classes), not only tensors; "
                "unpickling it runs code from the file. If you trust its origin, set model.weights_trust_pickle=true "
                "(or re-save it as a state dict: torch.save(model.state_dict(), ...))"
            ) from error
    except (OSError, RuntimeError, EOFError, ValueError) as error:
        raise WeightsError(f"{path}: not a readable torch file ({error})") from error
    log.warning("model.weights: unpickling %s because model.weights_trust_pickle=true", path)
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a missing class, module or dependency: report it against the file
        raise WeightsError(f"{path}: could not unpickle ({type(error).__name__}: {error})") from error


def _unwrap(raw, path: Path, weights_format: str) -> dict[str, torch.Tensor]:
    """The innermost ``{name: tensor}`` mapping inside a checkpoint, module or nesting of dicts."""
    if weights_format == "lightning" and not (isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping)):
        raise WeightsError(f"{path}: model.weights_format=lightning, but the file has no 'state_dict'")
    obj = raw
    for _ in range(4):  # nested wrappers (a dict holding a module holding ...), never unbounded
        if isinstance(obj, nn.Module):
            obj = obj.state_dict()
        if not isinstance(obj, Mapping):
            break
        if all(isinstance(value, torch.Tensor) for value in obj.values()) and obj:
            break
        inner = next((obj[key] for key in CONTAINER_KEYS if isinstance(obj.get(key), Mapping | nn.Module)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping):
        raise WeightsError(f"{path}: expected a state dict or a checkpoint holding one, found {type(obj).__name__}")
    state = {str(key): value for key, value in obj.items() if isinstance(value, torch.Tensor)}
    if not state:
        raise WeightsError(
            f"{path}: no tensors found (top-level keys: {_summary([str(key) for key in obj])}); expected a state "
            f"dict or a checkpoint with one of the keys {', '.join(CONTAINER_KEYS)}"
        )
    return state


def _remap(state: dict, model: nn.Module, target: dict, weights_format: str, path: Path) -> dict[str, torch.Tensor]:
    """Rename the file's keys to the model's: wrapper prefixes, old torchvision DenseNet names, timm's filter."""
    keys = set(target)
    if weights_format == "lightning":
        if not any(key.startswith("backbone.") for key in state):
            raise WeightsError(f"{path}: model.weights_format=lightning, but no key starts with 'backbone.'")
        state = {key.removeprefix("backbone."): value for key, value in state.items() if key.startswith("backbone.")}
    changed = True
    while changed:  # strip a prefix only when that makes more keys match: `model.` may be a real submodule name
        changed = False
        for prefix in PREFIXES:
            inside = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
            if len(inside.keys() & keys) > len(state.keys() & keys):
                state = {**{k: v for k, v in state.items() if not k.startswith(prefix)}, **inside}
                changed = True
    # TorchXRayVision's DenseNet is torchvision's, key for key, which is timm's densenet: only the old spelling
    # (and the thresholds and classifier, dropped as head keys) differ.
    state = {OLD_DENSENET_KEY.sub(r"\1\2", key): value for key, value in state.items()}
    if weights_format == "torchxrayvision" and not any(key.startswith("features.denseblock") for key in state):
        raise WeightsError(f"{path}: model.weights_format=torchxrayvision, but the file holds no DenseNet features")
    if weights_format in ("auto", "timm") and len(state.keys() & keys) < MIN_MATCHED * len(keys):
        state = _timm_filter(state, model)
    return state


def _timm_filter(state: dict, model: nn.Module) -> dict:
    """The model module's own ``checkpoint_filter_fn``: timm's converter from the original authors' layouts
    (a facebookresearch ConvNeXt, a Google ViT), the same one its hub weights go through."""
    filter_fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if filter_fn is None:
        return state
    try:
        return dict(filter_fn(dict(state), model))
    except Exception as error:  # a filter for other layouts may trip on this one: then the keys stay as they are
        log.debug("timm's checkpoint_filter_fn did not apply (%s); keys kept as in the file", error)
        return state


def _first_conv_key(model: nn.Module, target: dict) -> str | None:
    """The stem convolution's weight: timm names it in ``pretrained_cfg``, else the first 4-D weight."""
    first = (getattr(model, "pretrained_cfg", None) or {}).get("first_conv")
    first = first[0] if isinstance(first, list | tuple) else first
    if first and f"{first}.weight" in target:
        return f"{first}.weight"
    return next((key for key, value in target.items() if value.ndim == 4), None)


def _adapt_stem(tensor: torch.Tensor, expected: torch.Tensor) -> torch.Tensor | None:
    """A stem for other input channels, folded as timm folds its RGB weights (``adapt_input_conv``: summed for
    one channel, so a gray image repeated three times gives the RGB network's response); ``None`` if impossible."""
    if tensor.ndim != 4 or tensor.shape[0] != expected.shape[0] or tensor.shape[2:] != expected.shape[2:]:
        return None
    try:
        adapted = adapt_input_conv(expected.shape[1], tensor, base_chans=tensor.shape[1])
    except (NotImplementedError, ValueError, AssertionError):
        return None
    return adapted.to(expected.dtype)


def _arch(model: nn.Module) -> str:
    return (getattr(model, "pretrained_cfg", None) or {}).get("architecture") or type(model).__name__


def _summary(keys: list[str], shown: int = 5) -> str:
    if len(keys) <= shown:
        return ", ".join(keys)
    return ", ".join(keys[:shown]) + f" (and {len(keys) - shown} more)"
