"""Where the project's configuration files are: the one answer every entry point and reader of ``configs/`` uses.

A path worked out per module (``parents[2]`` here, ``parents[1]`` there) silently breaks when a module moves.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = PROJECT_ROOT / "configs"


def config_file(*parts: str) -> Path:
    """A file or folder under ``configs/`` (``config_file("benchmark")``, ``config_file("card.yaml")``)."""
    return CONFIGS.joinpath(*parts)


def project_file(path: str | Path) -> Path:
    """A user-given path as given, or read from the project root when it is relative and only exists there."""
    path = Path(path)
    if not path.is_file() and not path.is_absolute() and (PROJECT_ROOT / path).is_file():
        return PROJECT_ROOT / path
    return path


def option_names(*group: str) -> list[str]:
    """The choices of a config group (``option_names("ensemble")``): its YAML stems, one file per choice."""
    return sorted(path.stem for path in config_file(*group).glob("*.yaml"))
