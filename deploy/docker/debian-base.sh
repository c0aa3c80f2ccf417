#!/bin/sh
# A Python base image made from Debian packages alone, for building deploy/docker/Dockerfile
# where no registry image can be pulled:
#   deploy/docker/debian-base.sh receiver-python-base
#   podman build --format docker --build-arg PYTHON_IMAGE=receiver-python-base \
#       -f deploy/docker/Dockerfile -t receiver .
# Debian bookworm's python3 (3.11) with venv (debootstrap --variant=minbase; a virtualenv gets
# pip from python3-venv's bundled wheel, so no system pip), this host's CA bundle and pip
# configuration (so that pip reaches the index this host uses), and /usr/local/bin/python, which
# the Dockerfile calls as the official Python images provide it. Documentation, manual pages and
# translations are left out, as in Debian's slim images (the copyright files stay).
# Needs root, debootstrap and podman.
set -eu
name=${1:?usage: $0 IMAGE-NAME [MIRROR]}
mirror=${2:-http://deb.debian.org/debian}
root=$(mktemp -d "${TMPDIR:-/tmp}/receiver-base.XXXXXX")
trap 'rm -rf "$root" "$root.log"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv \
    bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
mkdir -p "$root/etc/ssl/certs" "$root/usr/local/bin"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$root/etc/pip.conf"; fi
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
# No package caches or lists in the image: they are only needed to install more.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
find "$root/usr/share/doc" -type f ! -name copyright -delete
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/*
# The same exclusions for anything installed later (as debian:bookworm-slim has them).
cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EXCLUDES'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EXCLUDES
tar -C "$root" -c . | podman import --quiet --change 'CMD ["python3"]' - "$name" >/dev/null
echo "$name: $(podman image inspect --format '{{.Size}}' "$name" | awk '{printf "%.0f MB", $1/1e6}')"
