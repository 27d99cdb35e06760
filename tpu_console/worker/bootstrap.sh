# Make ~/tpu-console/env hold the trainer's dependencies. Run as
#   bash -s -- PYTHON VERSION EXACT DIGEST LINK TOOLS FORCE REQ...
# with this script on stdin (tpu_console/provision/recipes.py builds that command).
#   PYTHON   an interpreter to use as is (python3, or a path; ~/ expands to $HOME), or empty: find one
#   VERSION  the Python the environment needs, 3.11 or later ("3.12")
#   EXACT    1: exactly that minor version (an env that links the console's packages), 0: that or newer
#   DIGEST   what the requirements, JAX flavour and Python add up to; equal to the stamp = nothing to do
#   LINK     a site-packages folder to see through a .pth file instead of installing (pods on the console's
#            own machine), or empty
#   TOOLS    console executables to link into env/bin with LINK (py-spy), ':'-separated, or empty
#   FORCE    1 to install even when the stamp matches
# UV_PYTHON_INSTALL_MIRROR in the environment points `uv python install` at a mirror (closed networks).
# Lines starting with "@@ " are for the console (step, ready, error, versions); the rest is installer output.
set -u
py=$1; version=$2; exact=$3; want=$4; link=$5; tools=$6; force=$7; shift 7
case "$py" in "~/"*) py="$HOME/${py#\~/}";; esac
root="$HOME/tpu-console"; env="$root/env"; stamp="$env/.tpu-console-bootstrap"

# versions() (python, jax, jaxlib, libtpu, flax of $env, and the code there) is defined by the console
# ahead of this script: tpu_console/provision/recipes.py, VERSIONS_FUNCTION.

# A linked environment is in place only while it hides the console's libtpu (below).
if [ "$force" != 1 ] && [ -x "$env/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
   && "$env/bin/python" -c "" 2>/dev/null \
   && { [ -z "$link" ] || ! "$env/bin/python" -c "import libtpu" 2>/dev/null; }; then
  echo "@@ ready already"; versions; exit 0
fi

# Is "$1" a Python that meets VERSION (EXACT)?
fits() {
  "$1" -c 'import sys; want = tuple(int(p) for p in sys.argv[1].split(".")); have = sys.version_info[:2]
sys.exit(not (have == want if sys.argv[2] == "1" else have >= want))' "$version" "$exact" 2>/dev/null
}
if [ "$exact" = 1 ]; then spec="$version"; else spec=">=$version"; fi

# uv: on PATH, where its installer puts it, or where this script put it before.
find_uv() {
  for c in "$(command -v uv 2>/dev/null)" "$HOME/.local/bin/uv" "$HOME/.cargo/bin/uv" "$root/uv/bin/uv" \
           "$env/bin/uv"; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

# Get uv with what the image has: pip of any python3 (a binary wheel), else astral's installer.
install_uv() {
  if command -v python3 >/dev/null 2>&1 \
     && python3 -m pip install -q --disable-pip-version-check --target "$root/uv" uv >/dev/null 2>&1 \
     && [ -x "$root/uv/bin/uv" ]; then
    echo "$root/uv/bin/uv"; return 0
  fi
  if command -v curl >/dev/null 2>&1 && curl -LsSf https://astral.sh/uv/install.sh 2>/dev/null \
     | env UV_INSTALL_DIR="$root/uv/bin" UV_NO_MODIFY_PATH=1 sh >/dev/null 2>&1 && [ -x "$root/uv/bin/uv" ]; then
    echo "$root/uv/bin/uv"; return 0
  fi
  return 1
}

mkdir -p "$root" || exit 1
source=""
if [ -n "$py" ]; then  # --python: this interpreter or none
  if ! command -v "$py" >/dev/null 2>&1; then
    echo "@@ error $py not found on this worker; install Python $version+ or pass --python PATH"; exit 10
  fi
  if ! fits "$py"; then
    echo "@@ error $py is Python $("$py" -V 2>&1 | cut -d' ' -f2); the environment needs $spec: pass another --python PATH"
    exit 11
  fi
  source=found; [ "$py" = python3 ] && source=image
elif fits python3; then
  py=python3; source=image
else
  image=$(python3 -V 2>/dev/null | cut -d' ' -f2); image=${image:-none}
  if [ "$exact" = 1 ]; then names="python$version"; else names="python3.14 python3.13 python3.12 python3.11"; fi
  for c in $names; do
    if command -v "$c" >/dev/null 2>&1 && fits "$c"; then py=$c; source=found; break; fi
  done
  uv=$(find_uv)
  if [ -z "$source" ] && [ -n "$uv" ]; then
    found=$(cd "$root" && "$uv" python find --no-project "$spec" 2>/dev/null) && fits "$found" && py=$found && source=found
  fi
  if [ -z "$source" ]; then
    if [ -z "$uv" ]; then echo "@@ step installing uv into ~/tpu-console/uv"; uv=$(install_uv) || uv=""; fi
    if [ -z "$uv" ]; then
      echo "@@ error no Python $spec on this worker (python3 is $image) and uv could not be installed to get one: install python$version, or uv, or pass --python PATH"
      exit 11
    fi
    echo "@@ step installing Python $version with uv${UV_PYTHON_INSTALL_MIRROR:+ from $UV_PYTHON_INSTALL_MIRROR}"
    # Into ~/tpu-console/pythons, and no python3.X link into ~/.local/bin (UV_PYTHON_INSTALL_BIN=0).
    out=$(cd "$root" && UV_PYTHON_INSTALL_DIR="$root/pythons" UV_PYTHON_INSTALL_BIN=0 "$uv" python install "$version" 2>&1)
    found=$(cd "$root" && UV_PYTHON_INSTALL_DIR="$root/pythons" "$uv" python find --no-project "$spec" 2>/dev/null)
    if [ -n "$found" ] && fits "$found"; then
      py=$found; source=uv
    else
      said=$(printf '%s\n' "$out" | grep -v '^ *$' | tail -n 1)
      echo "@@ error no Python $spec on this worker (python3 is $image) and uv python install $version failed (${said:-no output}): set workers.python_install_mirror in config.toml for a closed network, install python$version, or pass --python PATH"
      exit 11
    fi
  fi
fi
py=$(command -v "$py")
case "$py" in /*) ;; *) py="$PWD/$py";; esac

uv=""
if [ -z "$link" ]; then  # linked packages are visible to pip only (pip looks on sys.path, uv does not)
  uv=$(find_uv) || uv=""
fi

# An environment made from another interpreter (the configured version changed) is made again.
if [ -x "$env/bin/python" ]; then
  mine=$("$env/bin/python" -c 'import sys; print(sys.base_prefix)' 2>/dev/null)
  theirs=$("$py" -c 'import sys; print(sys.base_prefix)' 2>/dev/null)
  if [ "$mine" != "$theirs" ]; then echo "@@ step replacing the environment made from $mine"; rm -rf "$env"; fi
fi

if [ ! -x "$env/bin/python" ]; then
  echo "@@ step creating the environment at ~/tpu-console/env from $py"
  if [ -n "$uv" ]; then
    "$uv" venv -q --python "$py" "$env" || exit 12
  elif ! "$py" -m venv "$env" >/dev/null 2>&1; then
    # Ubuntu images (TPU VMs among them) ship python3 without venv; root, or a user with sudo, can add it.
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
      minor=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
      echo "@@ step installing python$minor-venv with apt-get"
      # A fresh Ubuntu VM's unattended-upgrades may hold dpkg's lock for minutes after boot: wait for it.
      s=""; [ "$(id -u)" = 0 ] || s="sudo -n"
      apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq)
      { $s "${apt[@]}" "python$minor-venv" >/dev/null 2>&1 || $s "${apt[@]}" python3-venv >/dev/null; } \
        && rm -rf "$env" && "$py" -m venv "$env" || exit 12
    else
      echo "@@ error python -m venv failed; install python3-venv on the worker (or uv)"; exit 12
    fi
  fi
fi
"$py" -c 'import json, platform, sys
print(json.dumps({"python": sys.executable, "version": platform.python_version(), "source": sys.argv[1]}))' \
  "$source" > "$root/python.json.tmp" && mv -f "$root/python.json.tmp" "$root/python.json"

if [ -n "$link" ]; then
  site=$("$env/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") || exit 13
  echo "$link" > "$site/_tpu_console_linked.pth" || exit 13
  # The console's libtpu (its planner compiles for TPU topologies with it) is of no use to a worker on this
  # machine, which has no TPU, and JAX 0.4.20 and older take an importable libtpu for a Cloud TPU VM: their
  # jax.distributed.initialize() then asks the GCE metadata server for the slice's peers. A package of that
  # name in front of the link hides it; a libtpu a project's setup installs comes before both.
  mkdir -p "$site/libtpu" && printf '%s\n' \
    'raise ImportError("no libtpu on this worker: it has no TPU (tpu-console bootstrap --link hides the console'"'"'s)")' \
    > "$site/libtpu/__init__.py" || exit 13
  # Executables of linked packages (py-spy is a binary) are not on the .pth path: link them into env/bin.
  old_ifs=$IFS; IFS=:
  for tool in $tools; do [ -x "$tool" ] && ln -sf "$tool" "$env/bin/$(basename "$tool")"; done
  IFS=$old_ifs
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
