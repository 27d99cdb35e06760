"""Shell recipes for a project of your own on the workers: its synced tree (`sync --dir`, `sync --git`) and
its setup environment (`setup`). Each function returns one bash command built with `shlex.quote` from data,
like tpu_console/provision/worker_recipes.py, whose layout under `~/tpu-console/` this extends:

    projects/<digest>/    a synced project tree, content-addressed, never modified by the console again
    project.json          the current project (source, digest, dir, name, git_sha, dirty, url, branch)
    envs/<digest>/        a setup environment: a venv from python.json's interpreter, keyed by the setup
    setup.json            the current setup (digest, env, command, requirements, ...), written on success

They print the `@@ ` lines of tpu_console/provision/report.py (`@@ project {json}`, `@@ setup {json}`).
"""

from __future__ import annotations

import shlex

from tpu_console.provision.worker_recipes import (
    PROJECT_FILE,
    PROJECTS_DIR,
    ROOT,
    VERSIONS_FUNCTION,
    _home,
    _install_command,
    _require_env,
)

NO_PROJECT_EXIT = 30  # `@@ missing`: the tree is not on this worker yet; upload it
UPLOAD_DIR = f"{ROOT}/uploads"


# A JSON string of $1 with sed alone (the worker may have no Python yet): backslashes and quotes escaped.
JSON_STRING_FUNCTION = (
    "jstr() { printf '\"%s\"' \"$(printf '%s' \"$1\" | sed -e 's/\\\\/\\\\\\\\/g' -e 's/\"/\\\\\"/g')\"; }"
)


def _write_json(json_text_var: str, relative: str) -> str:
    """Write the shell variable `json_text_var` to `relative` atomically and echo it as `@@ KIND {json}`."""
    kind = relative.rsplit("/", 1)[-1].removesuffix(".json")
    return (
        f'printf \'%s\\n\' "${json_text_var}" > {_home(relative)}.tmp && '
        f"mv -f {_home(relative)}.tmp {_home(relative)} && "
        f'echo "@@ {kind} ${json_text_var}"'
    )


def use_project(digest: str, project_json: str) -> str:
    """If `projects/<digest>/` is on this worker, make it the current project (`@@ ready already`);
    otherwise exit NO_PROJECT_EXIT with `@@ missing`. One round trip for an unchanged re-sync."""
    folder = _home(f"{PROJECTS_DIR}/{digest}")
    return (
        f"( if [ -d {folder} ]; then json={shlex.quote(project_json)}; {_write_json('json', PROJECT_FILE)} "
        '&& echo "@@ ready already"; exit $?; fi\n'
        f'echo "@@ missing"; exit {NO_PROJECT_EXIT} )'
    )


def unpack_project(digest: str, tarball: str, project_json: str) -> str:
    """Unpack the uploaded `tarball` (home-relative) into `projects/<digest>/` (into a temp folder first,
    so a half-unpacked tree is never taken for a whole one) and make it the current project."""
    folder = _home(f"{PROJECTS_DIR}/{digest}")
    return (
        f"( tarball={_home(tarball)}; folder={folder}; tmp=\"$folder.tmp.$$\"\n"
        'echo "@@ step unpacking into ~/' + f"{PROJECTS_DIR}/{digest}" + '"\n'
        'rm -rf "$tmp" && mkdir -p "$tmp" && tar -xzf "$tarball" -C "$tmp" '
        '|| { echo "@@ error unpacking the project failed"; rm -rf "$tmp"; exit 31; }\n'
        'if [ -d "$folder" ]; then rm -rf "$tmp"; else mv "$tmp" "$folder" || exit 32; fi\n'
        'rm -f "$tarball"\n'
        f"json={shlex.quote(project_json)}; {_write_json('json', PROJECT_FILE)} "
        '&& echo "@@ ready unpacked" )'
    )


def clone_project(url: str, branch: str, name: str) -> str:
    """Find the commit `branch` of `url` is at (`git ls-remote`), and unless `projects/<sha>/` is there
    already, clone it into that folder; then make it the current project. Works for any repository the
    worker can reach. When the checkout is this project (it has `trainer/` and `tpu_console/`), it is also
    installed into `~/tpu-console/env` and recorded in code.json, as the trainer's code."""
    projects = _home(PROJECTS_DIR)
    code_file = _home(f"{ROOT}/code.json")
    return (
        f"( {JSON_STRING_FUNCTION}\n"
        f"url={shlex.quote(url)}; branch={shlex.quote(branch)}; name={shlex.quote(name)}\n"
        f"projects={projects}\n"
        'command -v git >/dev/null || { echo "@@ error git is not installed on this worker"; exit 22; }\n'
        # A branch, else an annotated tag's commit, else a light tag's.
        'for ref in "refs/heads/$branch" "refs/tags/$branch^{}" "refs/tags/$branch"; do\n'
        '  sha=$(git ls-remote "$url" "$ref" 2>/dev/null | head -n 1 | cut -f1)\n'
        '  [ -n "$sha" ] && break; done\n'
        '[ -n "$sha" ] || { echo "@@ error no branch or tag $branch in $url (or this worker cannot reach '
        'it)"; exit 23; }\n'
        'folder="$projects/$sha"\n'
        'if [ -d "$folder" ]; then ready=already; else\n'
        '  echo "@@ step cloning $branch ($sha)"; tmp="$folder.tmp.$$"; rm -rf "$tmp"; mkdir -p "$projects"\n'
        '  git clone -q --depth 1 --branch "$branch" "$url" "$tmp" '
        '|| { echo "@@ error git clone of $url failed"; rm -rf "$tmp"; exit 23; }\n'
        '  got=$(git -C "$tmp" rev-parse HEAD)\n'
        '  [ "$got" = "$sha" ] || { echo "@@ error $branch moved while cloning ($sha, then $got); '
        'sync again"; rm -rf "$tmp"; exit 23; }\n'
        '  if [ -d "$folder" ]; then rm -rf "$tmp"; else mv "$tmp" "$folder" || exit 32; fi; ready=cloned\n'
        "fi\n"
        'if [ -d "$folder/trainer" ] && [ -d "$folder/tpu_console" ]; then\n'
        f"  {_require_env()}\n  {VERSIONS_FUNCTION}\n"
        '  echo "@@ step installing the trainer into ~/tpu-console/env"\n'
        f"  {_install_command(chr(34) + '$folder' + chr(34))} || exit 21\n"
        '  printf \'{"source": "git", "git_sha": "%s", "dirty": false, "url": %s, "branch": %s}\\n\' '
        '"$sha" "$(jstr "$url")" "$(jstr "$branch")" '
        f"> {code_file}.tmp && mv -f {code_file}.tmp {code_file}\n"
        "  versions\n"
        "fi\n"
        'json=$(printf \'{"source": "git", "digest": "%s", "dir": "%s", "name": %s, "git_sha": "%s", '
        '"dirty": false, "url": %s, "branch": %s, "synced_at": "%s"}\' "$sha" '
        f'"{PROJECTS_DIR}/$sha" "$(jstr "$name")" "$sha" "$(jstr "$url")" "$(jstr "$branch")" '
        '"$(date -u +%Y-%m-%dT%H:%M:%S+00:00)")\n'
        f"{_write_json('json', PROJECT_FILE)} && echo \"@@ ready $ready\" )"
    )


