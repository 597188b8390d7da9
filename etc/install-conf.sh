#!/bin/sh
# install-conf.sh SRC DIR — install SRC as DIR/gradd.conf (under $DESTDIR)
# unless there is one already.  Once installed, gradd.conf is the admin's:
# `meson install` of a new version must not overwrite their settings, and
# `ninja uninstall` must not delete them (meson lists only what it
# installed itself).  The pristine file is also installed to the docs
# directory, and `gradd --print-defaults` prints the defaults.
set -eu
src=$1
dir=${DESTDIR:-}$2
if [ -n "${MESON_INSTALL_DRY_RUN:-}" ]; then
  exit 0
fi
if [ -e "$dir/gradd.conf" ]; then
  echo "Keeping $dir/gradd.conf (not overwritten; compare with gradd --print-defaults)"
else
  echo "Installing $src to $dir"
  mkdir -p "$dir"
  install -m 0644 "$src" "$dir/gradd.conf"
fi
