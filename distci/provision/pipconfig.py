"""What pip and uv would resolve against besides a cell's own arguments: pip's
configuration values and the UV_*/PIP_* variables, digested into the wheelhouse key so a
changed index or constraint file never reuses a wheelhouse resolved under another.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from distci.provision.files import sha256_file

# pip options (config-file spelling) and uv variables that change what a resolution picks.
# Options that only change how (timeouts, certificates, progress, cache) are left out.
RESOLUTION_OPTIONS = ("index-url", "extra-index-url", "find-links", "no-index", "constraint", "pre",
                      "only-binary", "no-binary", "prefer-binary", "upgrade-strategy", "use-feature",
                      "use-deprecated", "platform", "python-version", "implementation", "abi")


UV_RESOLUTION_VARS = ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_FIND_LINKS",
                      "UV_NO_INDEX", "UV_CONSTRAINT", "UV_OVERRIDE", "UV_BUILD_CONSTRAINT", "UV_PRERELEASE",
                      "UV_INDEX_STRATEGY", "UV_RESOLUTION", "UV_EXCLUDE_NEWER", "UV_TORCH_BACKEND",
                      "UV_NO_BINARY", "UV_ONLY_BINARY", "UV_CONFIG_FILE", "UV_NO_CONFIG")


_FILE_OPTIONS = ("constraint", "UV_CONSTRAINT", "UV_OVERRIDE", "UV_BUILD_CONSTRAINT", "UV_CONFIG_FILE")


def _pip_var(option: str) -> str:
    return "PIP_" + option.upper().replace("-", "_")


def _files_digest(value: str) -> str:
    """Constraint files by content: ``sha256:...`` per file (``missing:PATH`` for an absent one)."""
    parts = []
    for item in value.split():
        path = Path(item[len("file://"):] if item.startswith("file://") else item).expanduser()
        parts.append(f"sha256:{sha256_file(path)}" if path.is_file() else f"missing:{item}")
    return " ".join(parts)


def _config_files(python: str, env: Mapping[str, str]) -> list[Path]:
    """The files pip reads its configuration from (pip's `configuration.get_configuration_files`):
    site-wide (XDG_CONFIG_DIRS, /etc), the user's (legacy and XDG), the interpreter's prefix
    (a venv's `bin/..`) and PIP_CONFIG_FILE."""
    home = Path(env.get("HOME") or Path.home())
    xdg_dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d] + [Path("/etc/pip.conf")]
    files += [home / ".pip" / "pip.conf", Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
    files.append(Path(python).parent.parent / "pip.conf")
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    return files


def _stamp(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return (str(path), None)
    return (str(path), st.st_mtime_ns, st.st_size)


_CONFIG_CACHE: dict[tuple, dict[str, str]] = {}


def pip_config_values(python: str = sys.executable) -> dict[str, str]:
    """pip's configuration files as pip reads them (``pip config list``), PIP_* variables
    excluded (resolution_environment reads those) but for PIP_CONFIG_FILE, which names a file.

    Keys are ``section.option`` (``global.constraint``); a later file overrides an earlier
    one as in pip itself. An interpreter without pip has no configuration to honour. Asked
    again in one process (a bisect asks per candidate) with every config file unchanged
    (path, mtime, size), pip is not started again: each `pip config list` costs ~0.3 CPU-s.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CONFIG_FILE"}
    key = (python, tuple(_stamp(f) for f in _config_files(python, env)))
    if key in _CONFIG_CACHE:
        return dict(_CONFIG_CACHE[key])
    proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, env=env)
    values: dict[str, str] = {}
    if proc.returncode != 0:
        return values
    for line in proc.stdout.splitlines():
        name, sep, raw = line.partition("=")
        if sep and not name.startswith(":env:"):
            values[name.strip()] = raw.strip().strip("'\"")
    _CONFIG_CACHE[key] = dict(values)
    return values


def resolution_environment(python: str = sys.executable, environ: Mapping[str, str] | None = None,
                           config: Mapping[str, str] | None = None) -> dict[str, str]:
    """The pip/uv settings outside our arguments that change what a download resolves to.

    PIP_* variables override pip's config files (so ``PIP_CONSTRAINT=<empty file>`` lifts a
    configured cap); the result names each setting where it came from (``env:PIP_CONSTRAINT``,
    ``pip.conf:global.constraint``), with constraint files replaced by their content hash.
    """
    env = os.environ if environ is None else environ
    conf = pip_config_values(python) if config is None else config
    found: dict[str, str] = {}
    for option in RESOLUTION_OPTIONS:
        var = _pip_var(option)
        if var in env:
            value = env[var]
            found[f"env:{var}"] = _files_digest(value) if option in _FILE_OPTIONS else value
            continue
        for name, value in conf.items():
            section, _, key = name.partition(".")
            if key == option and section in ("global", "install", "wheel", "download"):
                found[f"pip.conf:{name}"] = _files_digest(value) if option in _FILE_OPTIONS else value
    for var in UV_RESOLUTION_VARS:
        if var in env:
            found[f"env:{var}"] = _files_digest(env[var]) if var in _FILE_OPTIONS else env[var]
    return found


PYPI_SIMPLE = "https://pypi.org/simple"


def pip_index_urls(python: str = sys.executable, environ: Mapping[str, str] | None = None,
                   config: Mapping[str, str] | None = None) -> list[str]:
    """The indexes pip would read: its index URL (PyPI unless configured) and extra index
    URLs, each from PIP_* when set, else pip's configuration files."""
    env = os.environ if environ is None else environ
    conf = pip_config_values(python) if config is None else config

    def setting(option: str) -> str:
        if _pip_var(option) in env:
            return env[_pip_var(option)]
        for section in ("install", "download", "global"):
            if f"{section}.{option}" in conf:
                return conf[f"{section}.{option}"]
        return ""

    main = setting("index-url").split()
    return [*(main[:1] or [PYPI_SIMPLE]), *setting("extra-index-url").split()]
