"""No credentials in curated units (spec §5.4, "assenza di credenziali").

Two sets of rules, both plain regular expressions run offline:

- detect-secrets' plugins (Yelp's maintained detector) for the token shapes of providers
  (GitLab, SendGrid, Azure, npm, Telegram, …): only their patterns (``analyze_string``), never
  ``verify()``, which would call the provider. The plugins that flag ordinary text are left out
  (:data:`_NOISY_PLUGINS`).
- our own rules for what it does not know: connection strings, password assignments, PostgreSQL
  (``PGPASSWORD``, ``CREATE/ALTER ROLE … PASSWORD '…'``, ``.pgpass`` lines, libpq keyword strings)
  and passwords given in Italian (or English) prose.

``tests/fixtures/credentials/`` holds the corpus both ways: lines that must be found and
look-alikes that must not.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from evidence_pipeline.validation.problems import Problem, Severity
from evidence_pipeline.validation.text import scan_form, walk_strings

__all__ = ["credential_problems", "find_credentials", "walk_strings"]

# A value that names a secret instead of giving it: a shell/psql variable, a template, a
# placeholder, a mask.
_PLACEHOLDER = r"""(?![$%{<*:])"""
# An assigned value: quoted (spaces allowed), or a bare word that is not a call (getpass()).
_VALUE = (rf"""(?:'{_PLACEHOLDER}[^'\n]{{3,}}'|"{_PLACEHOLDER}[^"\n]{{3,}}\""""
          rf"""|{_PLACEHOLDER}[^\s'"();,&]{{3,}}(?![(\w]))""")
# A word given as a password in prose: letters and digits (a real password has both; a date,
# a number or a plain word has not), or a quoted string. Names of authentication methods are
# not passwords.
_PROSE_SECRET = (r"""(?:"[^"\n]{3,}"|'[^'\n]{3,}'|«[^»\n]{3,}»"""
                 r"""|(?!(?i:scram-sha-256|sha-?256|sha-?512)\b)"""
                 r"""(?=[^\s'"]*\d)(?=[^\s'"]*[A-Za-z])[A-Za-z0-9][^\s'"<>]{5,})""")
_PASSWORD_WORDS = r"(?:password|passwd|pwd|passwort|parola\s?chiave|parola\s+d['’]ordine)"

_OWN_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("password in a connection string",
     re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s:/@'\"]*:[^\s@/'\"]+@", re.IGNORECASE)),
    # (?<![a-z0-9]) rather than \b: DB_PASSWORD=, GITHUB_TOKEN= are names ending in the word;
    # a colon with a space before it and none after is psql's variable syntax (PASSWORD :'v')
    ("password assignment",
     re.compile(rf"(?i)(?<![a-z0-9]){_PASSWORD_WORDS}[`'\"]?(?:\s*=\s*|:\s*|\s+:\s+)"
                rf"{_VALUE}")),
    ("API key or token assignment",
     re.compile(r"(?i)(?<![a-z0-9])(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token"
                r"|secret[_-]?(?:access[_-]?)?key|client[_-]?secret|token|secret)"
                r"\s*[:=]\s*['\"]?[A-Za-z0-9_\-./+]{12,}")),
    ("OpenAI-style secret key", re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}")),
    ("Stripe secret key", re.compile(r"\b[rs]k_live_[A-Za-z0-9]{16,}")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")),
    ("Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"
                               r"|hooks\.slack\.com/services/[A-Za-z0-9_/]{20,}")),
    ("basic authorization header",
     re.compile(r"(?i)\bauthorization\s*:\s*basic\s+[A-Za-z0-9+/]{8,}={0,2}")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("JSON web token",
     re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{20,}=*")),
    # --- PostgreSQL ---
    # export / set / $env: / compose `- PGPASSWORD=` / YAML `PGPASSWORD:`; not $VAR or ${VAR}
    # also quoted as a name: `PGPASSWORD`=…, "PGPASSWORD": …
    ("PGPASSWORD with a value",
     re.compile(rf"(?<![A-Za-z0-9_])PGPASSWORD[`'\"]?\s*[:=]\s*{_VALUE}")),
    ("password of a PostgreSQL role",
     re.compile(r"(?is)\b(?:CREATE|ALTER)\s+(?:ROLE|USER|GROUP)\b[^;]*?\bPASSWORD\s+E?'(?:[^'\\]|''|\\.)+'")),
    # hostname:port:database:username:password, the port a number or *
    (".pgpass line",
     re.compile(r"(?m)^[ \t]*[^:\s]+:(?:\d{1,5}|\*):[^:\s]+:[^:\s]+:(?!\*+[ \t]*$)\S{3,}[ \t]*$")),
    # the same five fields inside a sentence ("Riga del file .pgpass: host:5432:db:user:pw"):
    # whole words, a numeric port, a password of 3+ characters that is not a mask or the
    # field's name
    (".pgpass line",
     re.compile(r"(?<!\S)[^:\s]+:(?:\d{1,5}|\*):[^:\s]+:[^:\s]+:"
                r"(?!\*+(?:\s|$)|(?i:password|passwd|pwd)\b)[^:\s]{3,}(?!\S*:)")),
    ("password in a libpq connection string",
     re.compile(r"(?i)(?<![\w.])password\s*=\s*'(?:[^'\\\n]|\\.){3,}'")),
    # --- prose ---
    # "la password dell'utente etl è S3gret0!", "The password for user etl is S3gret0x."
    ("password given in prose",
     re.compile(rf"(?i)\b{_PASSWORD_WORDS}\b[^.\n:=]{{0,60}}?(?:\bè|\be'|\bis\b)\s*:?\s*"
                rf"{_PROSE_SECRET}")),
    # "con password S3gret0x", "ha la password Rep0rt2024"
    ("password given in prose",
     re.compile(rf"(?i)\b{_PASSWORD_WORDS}\s+{_PROSE_SECRET}")),
    # "Le credenziali sono etl / S3gret0x", "Credenziali: etl_user / S3gret0!"
    ("user and password given in prose",
     re.compile(rf"(?i)\bcredenziali\b[^\n]{{0,40}}?[\w.@-]+\s*/\s*{_PROSE_SECRET}")),
)

# detect-secrets plugins left out, and why: each flags ordinary lines of notes.
_NOISY_PLUGINS = frozenset({
    "KeywordDetector",  # `password_encryption = 'scram-sha-256'`; our own rules cover keywords
    "Base64HighEntropyString",  # any quoted word: 'infinity', 'lettura'
    "HexHighEntropyString",  # hashes, e.g. a provenance sha256
    "IPPublicDetector",  # an address is not a credential
    "ArtifactoryDetector",  # codes such as AP0123456789
})


@cache
def _plugins() -> tuple[Any, ...]:
    # imported on first use: detect-secrets pulls in requests, which most commands never need
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    classes = get_mapping_from_secret_type_to_class().values()
    return tuple(cls() for cls in sorted(classes, key=lambda c: c.__name__)
                 if cls.__name__ not in _NOISY_PLUGINS)


def find_credentials(text: str) -> list[str]:
    """Names of the credential shapes found in a text (empty when clean), read in its
    :func:`~evidence_pipeline.validation.text.scan_form` (invisible characters removed, NFKC):
    ``pass\u200bword=…`` and a fullwidth ``ＰＧＰＡＳＳＷＯＲＤ=…`` are found too."""
    text = scan_form(text)
    found = [name for name, pattern in _OWN_RULES if pattern.search(text)]
    lines = text.splitlines()
    for plugin in _plugins():
        if any(next(iter(plugin.analyze_string(line)), None) for line in lines):
            found.append(plugin.secret_type)
    return list(dict.fromkeys(found))


def credential_problems(data: Any, body: str, *, path: str | None,
                        evidence_id: str | None, front_text: str = "") -> list[Problem]:
    """One ``credentials_found`` error per field (and the body) that holds a credential; the
    front matter text as read too, for what is in no field (a YAML comment)."""
    out = []
    found: set[str] = set()
    for field_path, text in [*walk_strings(data), ("body", body)]:
        for name in find_credentials(text):
            found.add(name)
            out.append(Problem("credentials_found", Severity.error, path, evidence_id,
                               f"looks like a credential ({name}); remove it", field_path))
    # YAML comments are no field, but they are committed with the file
    for name in find_credentials(front_text):
        if name not in found:
            out.append(Problem("credentials_found", Severity.error, path, evidence_id,
                               f"looks like a credential ({name}) in the front matter outside "
                               "any field (a YAML comment?); remove it"))
    return out
