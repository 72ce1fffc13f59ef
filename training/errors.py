"""Errors the user caused, reported as one clear message instead of a traceback, by every entry point alike.

A broken manifest or a mistyped override is fixed by reading the message; the stack only hides the one line
that matters. Genuine bugs keep their traceback, so only :class:`UserError` and the types an entry point declares
are shortened. ``HYDRA_FULL_ERROR=1`` (Hydra's own switch, so the project's errors behave like Hydra's) or
``--debug`` brings the traceback back. Hydra entry points use :func:`hydra_user_errors` and
:func:`run_hydra_entry`; argparse ones ``with user_errors(..., debug=args.debug)``.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hydra.errors import CompactHydraException, InstantiationException
from omegaconf.errors import MissingMandatoryValue

from training.config_files import CONFIGS
from training.interrupts import Interrupted, stop_on_signals
from training.tracking.terminal import redact_terminal

FULL_ERROR = "HYDRA_FULL_ERROR"
#: Numeric settings whose library also takes other types (Lightning's ``devices``: ``1``, ``auto``, ``[0, 1]``).
ANY_TYPE = frozenset({"trainer.devices"})


class UserError(Exception):
    """Base of the errors a user causes and fixes from the message alone (bad data, bad input, bad override).

    Exceptions of other modules that mean the same (``PredictionsError``, ``SubmissionError``, ``UnsafeConfig``,
    ``ModelNotFound``) are declared by the entry points that can meet them instead of subclassing this.
    """


class OverrideError(UserError):
    """A command-line override that names no setting of the chosen configs, or gives one a value of the wrong type."""


class ReportedError(CompactHydraException):
    """A user error handed to Hydra, which prints a compact exception's message without a traceback."""


def full_error_requested() -> bool:
    """Whether the user asked for tracebacks (``HYDRA_FULL_ERROR=1``), for Hydra's commands and ours alike."""
    return os.environ.get(FULL_ERROR, "") not in ("", "0")


def user_cause(error: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The user error behind ``error``: itself, or the cause Hydra wrapped when a constructor raised it."""
    if isinstance(error, kinds):
        return error
    if isinstance(error, InstantiationException) and isinstance(error.__cause__, kinds):
        return error.__cause__
    return None


def hydra_user_errors(*kinds: type[BaseException]) -> Callable:
    """Decorate a Hydra task function so that user errors (``UserError`` and ``kinds``) end as Hydra's own config
    errors do: the message, the hint about ``HYDRA_FULL_ERROR=1``, exit code 1, no traceback.

    Apply it under ``@hydra.main`` (Hydra unwraps the function to find its module and config path).
    """
    handled = (UserError, *kinds)

    def decorate(task: Callable) -> Callable:
        @functools.wraps(task)
        def run(cfg):
            try:
                return task(cfg)
            # Raised while handling, not ``from`` the error: Hydra would print a chained OmegaConf cause a
            # second time, while HYDRA_FULL_ERROR=1 still shows the original traceback as the context.
            except MissingMandatoryValue as error:  # a ``???`` the user was meant to fill in
                raise ReportedError(missing_value_message(cfg, error))  # noqa: B904
            except Exception as error:
                cause = user_cause(error, handled)
                if cause is None:
                    raise
                raise ReportedError(str(cause))  # noqa: B904

        return run

    return decorate


def missing_value_message(cfg, error) -> str:
    """Which setting to give on the command line for a ``???`` value, following an interpolation to its source
    (``data.source.root: ${data.root}`` asks for ``data.root``, the key the data configs document)."""
    from omegaconf import OmegaConf

    key = str(getattr(error, "full_key", "") or "")
    parent_key, _, leaf = key.rpartition(".")
    try:
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        raw = OmegaConf.to_container(parent, resolve=False).get(leaf)
    except Exception:  # the message is still right without the interpolation followed
        raw = None
    match = re.fullmatch(r"\$\{([\w.]+)\}", raw) if isinstance(raw, str) else None
    wanted = match.group(1) if match else key or "a setting"
    return f"missing value: {wanted} is ??? in the config and must be given, e.g. {wanted}=<value>"


@contextmanager
def user_errors(*kinds: type[BaseException], debug: bool = False) -> Iterator[None]:
    """Body of an argparse entry point: a user error (``UserError`` or ``kinds``) prints ``error: <message>`` on
    stderr and exits 1; with ``debug`` (``--debug``) or ``HYDRA_FULL_ERROR=1`` it propagates with its traceback.
    Everything printed from here on is redacted (:func:`training.tracking.terminal.redact_terminal`)."""
    redact_terminal()
    try:
        with stopped_by_signals():
            yield
    except (UserError, *kinds) as error:
        if debug or full_error_requested():
            raise
        sys.stderr.write(f"error: {error}\n(run with --debug for the full traceback)\n")
        raise SystemExit(1) from None


def run_hydra_entry(main: Callable[[], None], config_name: str, argv: Sequence[str] | None = None) -> None:
    """Start a Hydra entry point after :func:`check_overrides`, whose errors are reported like Hydra's own; every
    line printed from here on is redacted, Hydra's repetition of the overrides on failure included."""
    redact_terminal(sys.argv[1:] if argv is None else argv)
    try:
        check_overrides(config_name, sys.argv[1:] if argv is None else argv)
    except OverrideError as error:
        if full_error_requested():
            raise
        sys.stderr.write(f"{error}\n\nSet the environment variable {FULL_ERROR}=1 for a complete stack trace.\n")
        raise SystemExit(1) from None
    with stopped_by_signals():
        main()


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM/SIGINT inside the block end the command with one line and status 128 + signal
    (:mod:`training.interrupts`); the run owner has already marked its run KILLED on the way out."""
    stop_on_signals()
    try:
        yield
    except Interrupted as stop:
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        sys.stderr.write(stop.message(spec.name if spec else os.path.basename(sys.argv[0])) + "\n")
        raise SystemExit(stop.exit_status) from None


def check_overrides(config_name: str, argv: Sequence[str], configs: Path = CONFIGS) -> None:
    """Refuse, before anything runs, an override Hydra would take but the run would fail on much later.

    Caught: a setting the chosen config lacks where another choice of its group has it (``loss.gamma_neg=4`` with
    ``loss=bce``: Hydra would only suggest ``+loss.gamma_neg``, which BCE then rejects), and a value of the wrong type
    (``data.image_size=abc`` would surface as a ``TypeError`` deep inside image generation). What this cannot judge
    (sweeps, Hydra's own settings, ``+`` additions) is left to Hydra.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    if any(a.startswith(("--config", "-cn", "-cp", "-cd")) for a in argv):
        return  # another primary config than ``config_name``: only Hydra knows what it composes
    texts = [a for a in argv if not a.startswith("-") and "=" in a and not a.lstrip("+~").startswith("hydra")]
    try:
        overrides = OverridesParser.create().parse_overrides(texts)
    except Exception:  # Hydra reports its own parse errors, with the position
        return
    groups = {o.key_or_group for o in overrides if (configs / o.key_or_group.replace(".", "/")).is_dir()}
    choices = [o for o in overrides if o.key_or_group in groups and not o.is_sweep_override()]
    for override in choices:
        problem = unknown_choice(override.key_or_group, override.value(), configs)
        if problem:
            raise OverrideError(f"{override.input_line}: {problem}")
    choices = [o.input_line for o in choices]
    try:
        with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
            base = compose(config_name, overrides=choices, return_hydra_config=True)
    except Exception:  # a composition error (unknown choice...) is Hydra's to report
        return
    chosen = dict(base.hydra.runtime.choices)
    base = OmegaConf.masked_copy(base, [k for k in base if k != "hydra"])
    swept = {o.key_or_group for o in overrides if o.key_or_group in groups and o.is_sweep_override()}
    for override in overrides:
        key = override.key_or_group
        if key in groups or override.is_add() or override.is_delete() or override.is_force_add():
            continue
        if override.is_sweep_override() or any(key.startswith(f"{g}.") for g in swept):
            continue
        if not _exists(base, key):
            problem = _unknown_key(key, base, chosen, configs)
            if problem:
                raise OverrideError(f"{override.input_line}: {problem}")
            continue
        problem = _type_mismatch(key, _select(base, key), override.value())
        if problem:
            raise OverrideError(f"{override.input_line}: {problem}")


def unknown_choice(group: str, value, configs: Path = CONFIGS) -> str | None:
    """Why ``value`` names no option of the config group (Hydra would print its whole search path), or None."""
    folder = configs / group.replace(".", "/")
    if not isinstance(value, str) or (folder / f"{value}.yaml").is_file():
        return None
    names = sorted(p.stem for p in folder.glob("*.yaml"))
    close = difflib.get_close_matches(value, names, n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"no {group} called {value!r} (configs/{group.replace('.', '/')}/); {guess}choices: {', '.join(names)}"


def _select(cfg, key: str):
    """The value at ``key``, or None where it is ``???`` or an interpolation that cannot be resolved here (an option
    file read on its own refers to keys of the whole config)."""
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, throw_on_missing=False, throw_on_resolution_failure=False)


def _group_of(key: str, configs: Path) -> tuple[str, str] | None:
    """``(group, key inside the group)`` of a dotted key whose leading parts name a config group folder."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        if (configs.joinpath(*parts[:cut])).is_dir():
            return "/".join(parts[:cut]), ".".join(parts[cut:])
    return None


def _defines(path: Path, key: str, group: str) -> bool:
    """Whether one option file of a group sets ``key``, wherever its ``@package`` header puts its content."""
    from omegaconf import OmegaConf

    text = path.read_text()
    package = group.replace("/", ".")
    for line in text.splitlines()[:3]:
        if line.startswith("# @package "):
            package = line.removeprefix("# @package ").strip().removeprefix("_global_").lstrip(".")
    if package and not key.startswith(f"{package}."):
        return False
    tree = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    return _exists(tree, key.removeprefix(f"{package}.") if package else key)


def _exists(cfg, key: str) -> bool:
    """Whether ``key`` is a setting of ``cfg``, also when its value is ``???`` (which ``select`` treats as absent)."""
    from omegaconf import OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = _select(cfg, parent_key) if parent_key else cfg
    if OmegaConf.is_dict(parent):
        return leaf in list(parent.keys())
    if OmegaConf.is_list(parent):
        return leaf.isdigit() and int(leaf) < len(parent)
    return False


def _unknown_key(key: str, base, chosen: dict, configs: Path) -> str | None:
    """What to say about a key the composed config lacks, or None to leave the message to Hydra."""
    from omegaconf import OmegaConf

    found = _group_of(key, configs)
    if found is not None:
        group, inner = found
        options = sorted(p.stem for p in (configs / group).glob("*.yaml") if _defines(p, key, group))
        if options:
            current = chosen.get(group)
            alternatives = " or ".join(f"{group.replace('/', '.')}={name}" for name in options)
            where = f" (configs/{group}/{options[0]}.yaml)" if len(options) == 1 else ""
            return (f"{group.replace('/', '.')}={current} has no setting {inner!r}; it is a setting of {alternatives}"
                    f"{where}: choose it on the command line, or drop the override")  # fmt: skip
    prefix, _, leaf = key.rpartition(".")
    parent = _select(base, prefix) if prefix else base
    if OmegaConf.is_dict(parent):
        close = difflib.get_close_matches(leaf, [str(k) for k in parent], n=1, cutoff=0.75)
        if close:
            return f"no setting {key!r}; did you mean {(prefix + '.' if prefix else '') + close[0]!r}?"
    return None


def _type_mismatch(key: str, default, value) -> str | None:
    """Why ``value`` cannot replace ``default`` (the config's number), or None when it can.

    Only numbers are judged: booleans and text settings legitimately take other forms (``resume`` is ``true`` or a
    run id). ``null`` and the settings in :data:`ANY_TYPE` are always allowed.
    """
    if value is None or key in ANY_TYPE or isinstance(default, bool) or (isinstance(value, str) and "${" in value):
        return None
    if isinstance(default, int) and (not isinstance(value, int) or isinstance(value, bool)):
        expected = "an integer"
    elif isinstance(default, float) and (not isinstance(value, int | float) or isinstance(value, bool)):
        expected = "a number"
    else:
        return None
    return f"expected {expected} (the config's value is {default!r}), got {value!r}"
