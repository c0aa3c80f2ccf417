#!/bin/sh
# A Python base image made from Debian packages alone, for building deploy/docker/Dockerfile
# where no registry image can be pulled:
#   deploy/docker/debian-base.sh receiver-python-base
#   podman build --format docker --build-arg PYTHON_IMAGE=receiver-python-base \
#       -f deploy/docker/Dockerfile -t receiver .
# Debian bookworm's python3 (3.11) with venv and pip (debootstrap --variant=minbase), this host's
# CA bundle and pip configuration (so that pip reaches the index this host uses), and
# /usr/local/bin/python, which the Dockerfile calls as the official Python images provide it.
# Needs root, debootstrap and podman.
set -eu
name=${1:?usage: $0 IMAGE-NAME [MIRROR]}
mirror=${2:-http://deb.debian.org/debian}
root=$(mktemp -d "${TMPDIR:-/tmp}/receiver-base.XXXXXX")
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
    bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
mkdir -p "$root/etc/ssl/certs" "$root/usr/local/bin"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$root/etc/pip.conf"; fi
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
# No package caches or lists in the image: they are only needed to install more.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
tar -C "$root" -c . | podman import --quiet --change 'CMD ["python3"]' - "$name" >/dev/null
echo "$name: $(podman image inspect --format '{{.Size}}' "$name" | awk '{printf "%.0f MB", $1/1e6}')"
