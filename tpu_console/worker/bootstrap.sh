# Make ~/tpu-console/env hold the trainer's dependencies. Run as `bash -s -- PYTHON DIGEST LINK FORCE REQ...`
# with this script on stdin (tpu_console/provision/recipes.py builds that command).
#   PYTHON  the base interpreter on this worker (python3, or a path; ~/ expands to $HOME)
#   DIGEST  what the requirements, JAX flavour and base python add up to; equal to the stamp = nothing to do
#   LINK    a site-packages folder to see through a .pth file instead of installing (pods on the console's
#           own machine), or empty
#   FORCE   1 to install even when the stamp matches
# Lines starting with "@@ " are for the console (step, ready, error, versions); the rest is installer output.
set -u
py=$1; want=$2; link=$3; force=$4; shift 4
case "$py" in "~/"*) py="$HOME/${py#\~/}";; esac
env="$HOME/tpu-console/env"; stamp="$env/.tpu-console-bootstrap"
mkdir -p "$HOME/tpu-console" || exit 1

# versions() (python, jax, jaxlib, libtpu, flax of $env, and the code there) is defined by the console
# ahead of this script: tpu_console/provision/recipes.py, VERSIONS_FUNCTION.

if [ "$force" != 1 ] && [ -x "$env/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
   && "$env/bin/python" -c "" 2>/dev/null; then
  echo "@@ ready already"; versions; exit 0
fi

if ! command -v "$py" >/dev/null 2>&1; then
  echo "@@ error $py not found on this worker; install Python 3.11+ or pass --python PATH"; exit 10
fi
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "@@ error $py is Python $("$py" -V 2>&1 | cut -d' ' -f2); the trainer needs 3.11+: pass --python PATH"; exit 11
fi

uv=""
if [ -z "$link" ]; then  # linked packages are visible to pip only (pip looks on sys.path, uv does not)
  for c in "$(command -v uv 2>/dev/null)" "$HOME/.local/bin/uv" "$env/bin/uv"; do
    if [ -n "$c" ] && [ -x "$c" ]; then uv=$c; break; fi
  done
fi

if [ ! -x "$env/bin/python" ]; then
  echo "@@ step creating the environment at ~/tpu-console/env"
  if [ -n "$uv" ]; then
    "$uv" venv -q --python "$py" "$env" || exit 12
  elif ! "$py" -m venv "$env" >/dev/null 2>&1; then
    # Ubuntu images (TPU VMs among them) ship python3 without venv; root can add it.
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
      echo "@@ step installing python3-venv with apt-get"
      s=""; [ "$(id -u)" = 0 ] || s="sudo -n"
      $s env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null \
        && rm -rf "$env" && "$py" -m venv "$env" || exit 12
    else
      echo "@@ error python -m venv failed; install python3-venv on the worker"; exit 12
    fi
  fi
fi

if [ -n "$link" ]; then
  site=$("$env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") || exit 13
  echo "$link" > "$site/_tpu_console_linked.pth" || exit 13
  echo "@@ step linked to the console's packages (this pod shares the console's machine)"
elif [ -z "$uv" ]; then
  echo "@@ step installing uv"
  if "$env/bin/python" -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1 && [ -x "$env/bin/uv" ]; then
    uv="$env/bin/uv"
  else
    echo "uv could not be installed; using pip"
  fi
fi

if [ -n "$uv" ]; then
  echo "@@ step installing the trainer's dependencies with uv"
  "$uv" pip install -q --python "$env/bin/python" "$@" || { echo "@@ error uv pip install failed"; exit 14; }
  echo "uv $uv" > "$env/.tpu-console-installer"
else
  echo "@@ step installing the trainer's dependencies with pip"
  "$env/bin/python" -m pip install -q --disable-pip-version-check "$@" || { echo "@@ error pip install failed"; exit 14; }
  echo "pip" > "$env/.tpu-console-installer"
fi
echo "$want" > "$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
echo "@@ ready installed"
versions
