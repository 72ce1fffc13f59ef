"""Secrets never leave the process: config values under secret-looking keys and credentials inside any text are blanked.

:func:`redact` blanks values under secret-looking keys (the word anywhere in the key); :func:`redact_text` blanks
credentials inside any string, secret environment variables' values, and every value seen under a secret key
(:func:`remember_secrets`, so a library that prints overrides back, like Hydra, shows ``***``). The one list of
key words: docs/development.md, "Secrets". Over-redacting a harmless value is preferred to leaking a secret;
``tests/unit/test_tracking_faults.py`` checks that none of the platform's own config keys is blanked.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping, Sequence

#: Word stems that make a key name secret wherever they appear in it (``db_password``, ``clientSecret``,
#: ``aws_secret_access_key``, ``Proxy-Authorization``). No ordinary word contains them, so they match inside words.
SECRET_STEMS = ("password", "passwd", "passphrase", "secret", "credential", "authoriz", "cookie", "apikey",
                "accesskey", "privatekey")  # fmt: skip


#: Secret only as a whole word of the key (split at ``_ . -``, spaces and camelCase): ``tokenizer``, ``author``,
#: ``bypass`` and ``sessionless`` are ordinary. A word ending in ``token`` (``accesstoken``) is secret as well.
SECRET_WORDS = frozenset({"pw", "pwd", "pass", "auth", "cred", "creds", "token", "tokens", "session", "sessionid",
                          "jwt", "sig", "signature"})  # fmt: skip


#: ``key`` as a word is secret (``key``, ``api_key``, ``hub.key``, ``ssh.private.key``) except after one of these words,
#: where it names a lookup rather than a credential (``cache_key``, ``sort_key``); ``keypoints`` is another word.
ORDINARY_KEY_PREFIXES = frozenset({"cache", "sort", "primary", "foreign", "group", "join", "lookup", "partition",
                                   "index", "dict", "hash", "metric", "run", "row", "column", "split", "label"})  # fmt: skip


#: A number under a key that also names a quantity counts or times secrets rather than being one
#: (``max_tokens``, ``num_reg_tokens``, ``session_timeout``, ``token_ttl``); a string there is still blanked.
QUANTITY_WORDS = frozenset({"max", "min", "num", "n", "count", "len", "length", "size", "limit", "timeout", "ttl",
                            "expiry", "expires", "lifetime", "interval", "dim", "retries", "tokens"})  # fmt: skip


#: Environment variables whose values are secrets (``MLFLOW_TRACKING_PASSWORD``, ``PGPASSWORD``, ``HF_TOKEN``,
#: ``AWS_SECRET_ACCESS_KEY``). Narrower than config keys on purpose: a value found here is blanked in *all* text,
#: so ``DESKTOP_SESSION=ubuntu`` or ``PWD`` (the working directory) must not count.
SECRET_ENV = re.compile(
    r"(PASSWORD|PASSWD|PASSPHRASE|TOKEN|SECRET|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?|AUTHORIZATION)(_|$)"
    r"|(^|_)(PW|PASS|CREDS?|KEY|AUTH)(_|$)",  # whole words only: ``PWD`` (the working directory) is none
    re.I,
)


#: ``scheme://user:password@host`` -> ``scheme://user:***@host``.
URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^@\s/]+(@)")


#: ``scheme://token@host`` (a token as the whole userinfo, as git and hub URLs carry them) -> ``scheme://***@host``.
URL_TOKEN = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s:@*]{8,}(@)")


#: HTTP credentials in free text: ``Bearer <token>`` (any token) and ``Basic <base64 of user:password>``.
BEARER = re.compile(r"\b(bearer\s+)[A-Za-z0-9\-._~+/]+=*", re.I)


BASIC = re.compile(r"\b(basic\s+)([A-Za-z0-9+/]{4,}={0,2})(?![\w+/=])", re.I)


#: A credential header written out (``Authorization: Token abc``, ``Cookie: sid=...``): its whole value.
HEADER = re.compile(r"\b((?:proxy-)?authorization|(?:set-)?cookie)(\s*:\s*)[^\r\n'\"]+", re.I)


#: ``name=value`` (query strings, command lines, connection strings), ``"name": "value"`` (JSON) and
#: ``name: value`` (YAML): the value is blanked when the name is secret by :func:`is_secret_key`.
PAIR = re.compile(r"""(?<![\w.\-])([A-Za-z_][\w.\-]*)(\s*=\s*|"\s*:\s*"?|:\s+)([^\s"'&;,)\]}]+)""")


REDACTED = "***"


#: Values seen under secret keys in this process (:func:`remember_secrets`), blanked wherever they appear in text.
_REMEMBERED: set[str] = set()


def _secret_env_values() -> list[str]:
    """Values of secret-looking environment variables (``MLFLOW_TRACKING_PASSWORD``, ``PGPASSWORD``, ...)."""
    names = (name for name in os.environ if SECRET_ENV.search(name))
    # Very short values ("1", "true") would blank unrelated text and are no secret anyway.
    return sorted({os.environ[n] for n in names if len(os.environ[n]) >= 6}, key=len, reverse=True)


def remember_secrets(node, key: str = "") -> None:
    """Note every value :func:`redact` would blank by its key in ``node`` (a config tree, or ``{override: value}``),
    so :func:`redact_text` blanks it in any text later, whatever a library makes of it there."""
    if isinstance(node, dict):
        for k, v in node.items():
            remember_secrets(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for v in node:
            remember_secrets(v, key)
    elif is_secret_key(key, node) and len(str(node)) >= 4:  # "1234" is a PIN; "ab" would blank half the output
        _REMEMBERED.add(str(node))


def remember_overrides(argv) -> None:
    """:func:`remember_secrets` of a command line's ``key=value`` overrides (``+model.hub_token=...``)."""
    pairs = (arg.split("=", 1) for arg in argv if "=" in arg and not arg.startswith("-"))
    remember_secrets({key.lstrip("+~"): value.strip("'\"") for key, value in pairs})


def _words(name: str) -> list[str]:
    """``"db.apiKey"`` -> ``["db", "api", "key"]``: how a person reads the name, whatever its spelling style."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return [word for word in re.split(r"[^a-z0-9]+", name.lower()) if word]


def is_secret_key(path: str, value=None) -> bool:
    """Whether ``value``, found under the key ``path`` (dotted, parents included), must be blanked.

    Matched anywhere in the path, so a secret's children are secret too (``credentials.user``); a secret is never
    shown because of how its key is spelled. Only values that cannot carry a secret stay: ``None``, ``""``, a
    boolean, and a number under a quantity word (``QUANTITY_WORDS``).
    """
    words = _words(path)
    secret = (
        any(word in SECRET_WORDS or word.endswith(("token", "tokens")) for word in words)
        or any(stem in word for word in words for stem in SECRET_STEMS)
        or any(
            word in ("key", "keys") and prev not in ORDINARY_KEY_PREFIXES
            for prev, word in zip(["", *words], words, strict=False)
        )  # fmt: skip
    )
    if not secret or value is None or value == "" or isinstance(value, bool):
        return False
    return not (_is_number(value) and QUANTITY_WORDS.intersection(words))


def _is_number(value) -> bool:
    if isinstance(value, int | float):
        return True
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _basic(match: re.Match) -> str:
    """``Basic <b64>`` blanked only when the base64 is ``user:password``, so "Basic augmentation" stays."""
    try:
        decoded = base64.b64decode(match.group(2), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return match.group(0)
    return match.group(1) + REDACTED if ":" in decoded else match.group(0)


def _pair(match: re.Match) -> str:
    key, sep, value = match.groups()
    return key + sep + REDACTED if is_secret_key(key, value) else match.group(0)


def redact_text(text: str) -> str:
    """``text`` with every credential it shows replaced by ``***``.

    Covers URL passwords, ``Bearer``/``Basic`` credentials, header values, secret-named ``name=value`` pairs and
    secret environment variables' values, so tags and messages built from commands, URLs or errors leak nothing.
    """
    text = URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<2>", text)
    text = URL_TOKEN.sub(rf"\g<1>{REDACTED}\g<2>", text)
    text = BEARER.sub(rf"\g<1>{REDACTED}", text)
    text = BASIC.sub(_basic, text)
    text = HEADER.sub(rf"\g<1>\g<2>{REDACTED}", text)
    text = PAIR.sub(_pair, text)
    for value in sorted({*_secret_env_values(), *_REMEMBERED}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def redact(node, key: str = ""):
    """A plain config tree with every secret blanked: values under secret keys (:func:`is_secret_key`, given the
    dotted path so a secret node's children count too) and credentials inside any string (:func:`redact_text`)."""
    if isinstance(node, Mapping):  # DictConfig and Lightning's AttributeDict too
        return {k: redact(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()}
    if isinstance(node, Sequence) and not isinstance(node, str | bytes):
        return [redact(v, key) for v in node]
    if is_secret_key(key, node):
        return REDACTED
    return redact_text(node) if isinstance(node, str) else node


def redact_tags(tags: dict) -> dict[str, str]:
    """Run tags as they may be sent: the value of a secret-named tag (``+tags.hub_token=...``) blanked like a
    config value, and credentials inside any value (:func:`redact_text`), since tags are as public as params."""
    return {str(k): REDACTED if is_secret_key(str(k), v) else redact_text(str(v)) for k, v in tags.items()}
