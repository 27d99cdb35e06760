# Sourced by scripts/console and scripts/test: make .venv hold what this checkout needs, once.
# Re-installs only when pyproject.toml changes (a stamp keyed on its hash), so later runs start at once.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo_root/.venv"
python_bin=${PYTHON:-python3}

# The file that says ITEM (an extra or a package) is installed for pyproject.toml's DIGEST.
_install_stamp() {
  echo "$venv/.installed-$1-$(echo "$2" | sha256sum | cut -c1-8)"
}

bootstrap_venv() {
  local extras=$1 extra_pkgs=${2:-}
  local -; set -f  # no globbing: jax[tpu] is a package, not a pattern
  if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: tpu-console needs Python 3.11+; set PYTHON=/path/to/python3.11" >&2
    exit 2
  fi
  [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
  # A stamp per extra and per extra package, keyed on pyproject.toml's hash: what scripts/test installed
  # (a superset of scripts/console's extras) serves scripts/console too, with no second pip run.
  local digest item missing=""
  digest=$(sha256sum "$repo_root/pyproject.toml" | cut -c1-16)
  for item in ${extras//,/ } $extra_pkgs; do
    [ -f "$(_install_stamp "$digest" "$item")" ] || missing="$missing $item"
  done
  if [ -n "$missing" ]; then
    echo "Installing tpu-console[$extras] into .venv (first run only)..." >&2
    # torch, when asked for, is pinned: an unpinned torch pulls gigabytes of CUDA wheels.
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --quiet --disable-pip-version-check -e "$repo_root[$extras]" $extra_pkgs
    for item in ${extras//,/ } $extra_pkgs; do
      touch "$(_install_stamp "$digest" "$item")"
    done
  fi
}

# Debian packages some tests need (a real OpenSSH server and client, tmux, and chromium for the browser
# test of `serve`). Installed only when missing. Outside CI a package that cannot be had is a note and its
# tests skip, naming it; under CI=true it is an error, so a CI run never passes by skipping them.
missing_apt_packages() {
  command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || echo openssh-server
  command -v ssh >/dev/null 2>&1 || echo openssh-client
  command -v tmux >/dev/null 2>&1 || echo tmux
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || echo chromium
}

ensure_apt_packages() {
  local missing why=""
  missing=$(missing_apt_packages | tr '\n' ' ')
  missing=${missing% }
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    why="not root or no apt-get, so they cannot be installed here"
  else
    echo "Installing $missing (first run only)..." >&2
    # shellcheck disable=SC2086
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null; }
    then
      why="apt-get install failed"
    fi
    missing=$(missing_apt_packages | tr '\n' ' ')
    missing=${missing% }
    [ -z "$missing" ] && return 0
    [ -n "$why" ] || why="installed, yet still not on PATH"
  fi
  if [ "${CI:-}" = "true" ]; then
    echo "error: $missing missing ($why); CI=true runs the OpenSSH, tmux and browser tests, so install them (apt-get install $missing)" >&2
    exit 1
  fi
  echo "note: $missing not installed ($why); the tests that need them will be skipped" >&2
}
