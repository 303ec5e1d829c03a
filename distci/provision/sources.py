"""How a cell's Sources become pip arguments: index configuration, requirement lines.

The Source record itself (kinds, parsing, PACKAGE_AXES) is distci.sources. Typical flow
of a runner::

    config = IndexConfig.from_env()
    sources = resolve_sources(cell.sources, config, variant=cell.variant)
    requirements = requirement_lines(sources) + ["pytest", "packaging"]
    args = pip_args(sources, config, variant=cell.variant)
    # -> distci.provision.wheelhouse.ensure_wheelhouse(requirements, args, ...)

Sources that pip cannot pin by itself (a nightly, a nightly date, a git branch) must go
through `resolve_sources` first: the wheelhouse is content-addressed by its requirement
lines, so ``torch`` unpinned would reuse the first nightly ever downloaded forever.

Index URLs are configuration, never written in the repository: every URL comes from a
``DISTCI_*`` environment variable (see `IndexConfig`). A URL may contain ``{variant}``,
replaced by the cell's variant (``cpu``, ``cu130``), so one variable serves every cell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from distci.errors import ConfigError, SourceError
from distci.sources import Source, env_var_name
from distci.sources import PACKAGE_AXES  # noqa: F401 - distci/bisect imports it from here (its owner moves it)


@dataclass(frozen=True)
class IndexConfig:
    """Package index settings, read from the environment (never from the repository).

    DISTCI_INDEX_URL          main index; empty means pip's own configuration
    DISTCI_EXTRA_INDEX_URLS   space-separated extra indexes
    DISTCI_FIND_LINKS         space-separated find-links locations
    DISTCI_NIGHTLY_INDEX_URL  PyTorch nightly simple index; needed only for nightly sources
    DISTCI_TEST_INDEX_URL     PyTorch test (release candidate) index; needed only for test:
    DISTCI_WHEELHOUSE_<NAME>  directory of wheels for ``wheelhouse:NAME`` sources
    DISTCI_GIT_<NAME>         repository URL or path for ``git:NAME@REV`` sources
    DISTCI_CA_BUNDLE          CA bundle for reading indexes over https (behind a proxy)
    """

    index_url: str = ""
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    nightly_index_url: str = ""
    test_index_url: str = ""
    named: Mapping[str, str] = field(default_factory=dict, hash=False)
    ca_bundle: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "IndexConfig":
        env = os.environ if environ is None else environ
        named = {
            k: v
            for k, v in env.items()
            if (k.startswith("DISTCI_WHEELHOUSE_") and k != "DISTCI_WHEELHOUSE_ROOT")
            or k.startswith("DISTCI_GIT_")
        }
        return cls(
            index_url=env.get("DISTCI_INDEX_URL", "").strip(),
            extra_index_urls=tuple(env.get("DISTCI_EXTRA_INDEX_URLS", "").split()),
            find_links=tuple(env.get("DISTCI_FIND_LINKS", "").split()),
            nightly_index_url=env.get("DISTCI_NIGHTLY_INDEX_URL", "").strip(),
            test_index_url=env.get("DISTCI_TEST_INDEX_URL", "").strip(),
            named=named,
            ca_bundle=env.get("DISTCI_CA_BUNDLE", "").strip(),
        )

    def index_for(self, source: Source, variant: str | None = None) -> str:
        """The index that serves a nightly or test source; ConfigError names the missing variable."""
        if source.kind == "nightly":
            var, url, what = "DISTCI_NIGHTLY_INDEX_URL", self.nightly_index_url, "PyTorch nightly"
        elif source.kind == "test":
            var, url, what = "DISTCI_TEST_INDEX_URL", self.test_index_url, "PyTorch test-channel"
        else:
            raise ValueError(f"{source.kind} sources have no dedicated index")
        if not url:
            raise ConfigError(
                f"{var} is not set: {source.package} = '{source.declared}' needs the {what} "
                f"simple index URL (it may contain {{variant}}, e.g. .../{{variant}})"
            )
        return format_url(url, variant, var)

    def wheelhouse_dir(self, source: Source) -> Path:
        var = env_var_name("DISTCI_WHEELHOUSE_", source.spec)
        value = self.named.get(var, "")
        if not value:
            raise ConfigError(
                f"{var} is not set: {source.package} = '{source.declared}' needs a directory of wheels"
            )
        path = Path(value).expanduser()
        if not path.is_dir():
            raise ConfigError(f"{var}={value} is not a directory of wheels")
        return path.resolve()

    def git_url(self, source: Source) -> str:
        """The pip VCS URL (``git+...``) of a git source's repository, without the revision."""
        var = env_var_name("DISTCI_GIT_", source.git_name)
        value = self.named.get(var, "")
        if not value:
            raise ConfigError(
                f"{var} is not set: {source.package} = '{source.declared}' needs a repository "
                "URL or local path"
            )
        if value.startswith("git+"):
            return value
        if "://" in value:
            return "git+" + value
        path = Path(value).expanduser()
        if not path.exists():
            raise ConfigError(f"{var}={value} is neither a URL nor an existing path")
        return "git+" + path.resolve().as_uri()


def format_url(url: str, variant: str | None, var: str) -> str:
    if "{variant}" not in url:
        return url
    if not variant:
        raise ConfigError(f"{var} contains {{variant}} but no cell variant was given")
    return url.replace("{variant}", variant)


def requirement_lines(sources: Iterable[Source]) -> list[str]:
    """pip requirement lines for the sources; nightly and git sources must be resolved first."""
    lines: list[str] = []
    for source in sources:
        if source.kind in ("none", "installed"):
            continue
        if source.kind == "git":
            if not source.resolved:
                raise SourceError(
                    f"{source.package} = '{source.declared}' is not resolved to a commit; "
                    "call distci.provision.resolve.resolve_sources first"
                )
            lines.append(f"{source.package} @ {source.resolved}")
        elif source.resolved:
            lines.append(f"{source.package}=={source.resolved}")
        elif source.kind in ("nightly", "latest"):
            raise SourceError(
                f"{source.package} = '{source.declared}' is not resolved to a version; "
                "call distci.provision.resolve.resolve_sources first"
            )
        elif source.kind == "wheelhouse":
            lines.append(source.package)
        else:
            lines.append(f"{source.package}{source.spec}")
    return lines


def pip_args(sources: Iterable[Source], config: IndexConfig, *, variant: str | None = None) -> list[str]:
    """Index, find-links and --pre arguments that make pip see every source's origin.

    With no DISTCI_INDEX_URL, pip keeps its own configured index (pip.conf, PIP_* vars);
    nightly/test indexes are added as extra indexes so ordinary dependencies still come
    from the usual place.
    """
    pairs: list[tuple[str, str]] = []
    if config.index_url:
        pairs.append(("--index-url", format_url(config.index_url, variant, "DISTCI_INDEX_URL")))
    for url in config.extra_index_urls:
        pairs.append(("--extra-index-url", format_url(url, variant, "DISTCI_EXTRA_INDEX_URLS")))
    for loc in config.find_links:
        pairs.append(("--find-links", format_url(loc, variant, "DISTCI_FIND_LINKS")))
    pre = False
    for source in sources:
        if source.kind in ("nightly", "test"):
            pairs.append(("--extra-index-url", config.index_for(source, variant)))
            pre = True
        elif source.kind == "wheelhouse":
            pairs.append(("--find-links", str(config.wheelhouse_dir(source))))
    args: list[str] = []
    for pair in dict.fromkeys(pairs):
        args.extend(pair)
    if pre:
        args.append("--pre")
    return args


# --------------------------------------------------------------------------- nightly dates


