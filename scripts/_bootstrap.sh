# Sourced by scripts/console and scripts/test: make .venv hold what this checkout needs, once.
# Re-installs only when pyproject.toml changes (a stamp keyed on its hash), so later runs start at once.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo_root/.venv"
python_bin=${PYTHON:-python3}

bootstrap_venv() {
  local extras=$1 extra_pkgs=${2:-}
  if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: tpu-console needs Python 3.11+; set PYTHON=/path/to/python3.11" >&2
    exit 2
  fi
  [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
  local digest
  digest=$(cat "$repo_root/pyproject.toml" <(echo "$extras $extra_pkgs") | sha256sum | cut -c1-16)
  local stamp="$venv/.installed-$digest"
  if [ ! -f "$stamp" ]; then
    echo "Installing tpu-console[$extras] into .venv (first run only)..." >&2
    # torch, when asked for, is pinned: an unpinned torch pulls gigabytes of CUDA wheels.
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --quiet --disable-pip-version-check -e "$repo_root[$extras]" $extra_pkgs
    touch "$stamp"
  fi
}

# Debian packages some tests need (a real OpenSSH server and client, tmux, and chromium for the browser
# test of `serve`). Installed only when missing.
ensure_apt_packages() {
  local missing=()
  command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
  command -v tmux >/dev/null 2>&1 || missing+=(tmux)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: ${missing[*]} not installed; the tests that need them will be skipped" >&2
    return 0
  fi
  echo "Installing ${missing[*]} (first run only)..." >&2
  # A failed install is reported, not fatal: the tests that need these skip, naming what is absent.
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  then
    echo "warning: could not install ${missing[*]} with apt-get; the tests that need them will be skipped" >&2
  fi
}
