#!/usr/bin/env bash
# Make the local Debian + Python base image that docker/cpu and docker/cuda build FROM,
# without pulling anything: debootstrap a minimal Debian, then `docker import` it.
#
#   docker/base/make-base.sh TAG
#
# Why this and not `FROM debian`: self-hosted runners (and this project's CI) may have no
# registry access at all; debootstrap needs only a Debian mirror (or a local apt cache).
# The image holds what a cell needs below its Python env: python3 with venv and headers,
# gcc/g++ (Inductor compiles C++ on CPU and Triton's launchers in C on CUDA) and the CA
# store. PyPI's CUDA wheels carry their own CUDA runtime, so no CUDA toolkit is needed.
#
# Environment:
#   DISTCI_DEBIAN_MIRROR  Debian mirror URL (default on a Debian host: the first `URIs:`/`deb`
#                         line of its apt sources; elsewhere, e.g. on Ubuntu, it must be set:
#                         an Ubuntu mirror has no bookworm)
#   DISTCI_DEBIAN_KEYRING keyring debootstrap checks the mirror with (default: Debian's archive
#                         keyring, /usr/share/keyrings/debian-archive-keyring.gpg; on Ubuntu:
#                         apt-get install debian-archive-keyring)
#   DISTCI_DEBIAN_SUITE   suite (default: bookworm, whose python3 is 3.11)
#   DISTCI_BASE_PACKAGES  extra packages, space separated
# Runs as root (debootstrap needs it), once per machine; building cell images FROM the
# result needs only the docker group. About 80 s and 450 MB on a 2-core machine.
set -euo pipefail

tag=${1:?usage: make-base.sh TAG}
suite=${DISTCI_DEBIAN_SUITE:-bookworm}
packages="python3,python3-venv,python3-dev,gcc,g++,libc6-dev,ca-certificates"
if [ -n "${DISTCI_BASE_PACKAGES:-}" ]; then
  packages="$packages,$(echo "$DISTCI_BASE_PACKAGES" | tr ' ' ',')"
fi

# shellcheck disable=SC1091  # the host's own file
host_id=$(. /etc/os-release 2>/dev/null && echo "${ID:-unknown}")
mirror=${DISTCI_DEBIAN_MIRROR:-}
if [ -z "$mirror" ] && [ "$host_id" != debian ]; then
  echo "make-base: this host is $host_id, its apt sources are not a Debian mirror: set DISTCI_DEBIAN_MIRROR" >&2
  exit 2
fi
if [ -z "$mirror" ]; then
  mirror=$( (cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list 2>/dev/null || true) |
           sed -nE 's/^URIs:[[:space:]]*//p; s/^deb (\[[^]]*\] )?//p' | awk '!/security/ {print $1; exit}')
fi
[ -n "$mirror" ] || { echo "make-base: set DISTCI_DEBIAN_MIRROR (no apt source found on this host)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "make-base: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 2; }
keyring=${DISTCI_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
[ -f "$keyring" ] || { echo "make-base: no Debian keyring at $keyring (apt-get install debian-archive-keyring)" >&2; exit 2; }

rootfs=$(mktemp -d "${TMPDIR:-/tmp}/distci-base.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT

echo "make-base: debootstrap $suite from $mirror into $rootfs"
debootstrap --variant=minbase --keyring="$keyring" --include="$packages" "$suite" "$rootfs" "$mirror"

# A smaller image and no stale state: apt lists, caches, docs, logs.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log \
       "$rootfs"/var/log/apt/* "$rootfs"/tmp/*
echo "deb $mirror $suite main" > "$rootfs"/etc/apt/sources.list

echo "make-base: docker import -> $tag"
tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  --change "LABEL org.opencontainers.image.title=distci-base org.opencontainers.image.base.name=debian:$suite" \
  - "$tag"
