"""Every program of the corpus, unmodified, through the console on a local pod: does the console read each
one's progress right, with nothing to set?

    .venv/bin/python benchmarks/programs.py [--only NAME,...] [--workers 2] [--keep] [--json OUT]

The corpus is benchmarks/programs/<name>/, a project folder each with its program.toml (what it runs, and
how its own output tells its steps, step time and loss: benchmarks/program_rows.py). The console is used
through its CLI as a user would, with a throwaway TPU_CONSOLE_HOME: one local pod (`create`, `bootstrap`)
for all of them; then for each program, one after another, `sync --dir` its folder, `setup -- pip install
-r requirements.txt` where it has one (`--python-version` where program.toml names a `python`), `launch --
COMMAND`, `logs --follow` until it ends, then `status --json`, `runs show --json` and the app's run dashboard
(benchmarks/dashboard_view.py: its Steps and Plots tabs, the real app headless); the step events are read
from the run's archive (what the console kept of it). `exec` tells each worker's version of the
program's package. The pod is deleted at the end, on Ctrl-C too (`--keep` keeps it, and the home).

Prints, as it goes, how long each phase took (sync, setup, the run from launch to its end), then one row
per program: its version, the steps it made and the steps the console saw, the step time the program
printed (or, where it prints none, the one its step lines' own timestamps give, else measured here from when
they reached output.log, polled every 5 ms) against the console's, the last loss of each, the format the
console found, the run's goodput from `runs show`, and PASS or FAIL by the targets, each failure's reasons
below the table. Exits 1 when a row fails. `--json OUT` writes the rows.

Only for local pods, whose workers are folders on this machine: each worker's pip (and uv) cache is this
machine's, so a second worker or a second session downloads nothing again; and where program.toml's
`python` is not on this machine's PATH but pyenv or uv has it, a link to it is put first on the PATH the
pod's workers see, so `setup --python-version` finds it there as it would on a worker that has it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from program_rows import (
    BadProgram,
    Program,
    Row,
    WorkerResult,
    dashboard_shown,
    first_requirement,
    judge,
    judge_dashboard,
    judge_plots,
    load_program,
    table,
)
from program_rows import made as made_from
from program_rows import seen as seen_from

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "programs"
CONSOLE = str(Path(sys.executable).parent / "tpu-console")
DASHBOARD_VIEW = str(ROOT / "benchmarks" / "dashboard_view.py")
POD = "programs"
POLL_S = 0.005


class Console:
    """The console's CLI with a home of its own; each call's output is kept in the home's logs/ folder."""

    def __init__(self, home: Path, path_first: Path) -> None:
        self.home = home
        self.logs = home / "bench-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # the local provider only: no TPU_CONSOLE_* or gcloud project of the developer's shell
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_CONSOLE_")
               and k not in ("CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT")}
        env["TPU_CONSOLE_HOME"] = str(home)
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
        self.env = env

    def __call__(self, *args: str, log: str | None = None,
                 timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([CONSOLE, *args], env=self.env, capture_output=True, text=True, check=False,
                              timeout=timeout)
        if log:
            said = f"$ tpu-console {' '.join(args)}\n{done.stdout}{done.stderr}"
            (self.logs / f"{log}.log").write_text(said)
        return done

    def dashboard(self, run_id: str, log: str) -> dict:
        """What the app's run dashboard shows of the run (benchmarks/dashboard_view.py, the real app
        headless, in this console's home)."""
        done = subprocess.run([sys.executable, DASHBOARD_VIEW, run_id], env=self.env, capture_output=True,
                              text=True, check=False, timeout=300)
        (self.logs / f"{log}.log").write_text(f"$ dashboard_view.py {run_id}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            raise RuntimeError(f"the dashboard could not be read: {last_line(done.stderr)}")
        return json.loads(done.stdout)

    def json(self, *args: str, log: str | None = None) -> dict:
        """The one JSON document a command prints with --json (put before a `--` command)."""
        at = args.index("--") if "--" in args else len(args)
        args = (*args[:at], "--json", *args[at:])
        done = self(*args, log=log)
        if done.returncode != 0:
            raise RuntimeError(f"`tpu-console {' '.join(args)}` exited {done.returncode}: "
                               f"{last_line(done.stderr)}")
        return json.loads(done.stdout)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


class Stopwatch:
    """When each worker's output.log grew, polled from the worker's folder (a local pod's workers are
    folders here): started before the launch, it times every run folder that appears after it started."""

    def __init__(self, runs_dirs: dict[int, Path]) -> None:
        self._runs_dirs = runs_dirs
        self._before = {w: set(os.listdir(d)) if d.is_dir() else set() for w, d in runs_dirs.items()}
        self._t0 = time.monotonic()
        self.growth: dict[tuple[int, str], list[tuple[float, int]]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.wait(POLL_S):
            for worker, runs in self._runs_dirs.items():
                try:
                    new = set(os.listdir(runs)) - self._before[worker]
                except OSError:
                    continue
                for run_id in new:
                    try:
                        size = os.path.getsize(runs / run_id / "output.log")
                    except OSError:
                        continue
                    seen = self.growth.setdefault((worker, run_id), [])
                    if not seen or size > seen[-1][1]:
                        seen.append((time.monotonic() - self._t0, size))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def python_link(version: str, bin_dir: Path, env: dict[str, str]) -> str | None:
    """Make `pythonX.Y` runnable from bin_dir where this machine's PATH gives none that runs (a pyenv shim
    of a version not selected): a link to pyenv's or uv's build of it. Returns what was linked, or None."""
    name = f"python{version}"

    def runs(path: str | None) -> bool:
        if not path:
            return False
        done = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, check=False, env=env)
        return done.returncode == 0 and done.stdout.strip() == version

    if runs(shutil.which(name, path=env["PATH"])):
        return None
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/{name}"), reverse=True)
    uv = shutil.which("uv", path=env["PATH"])
    if uv:
        found = subprocess.run([uv, "python", "find", "--no-project", version], capture_output=True,
                               text=True, check=False)
        candidates.append(found.stdout.strip() if found.returncode == 0 else "")
    for candidate in candidates:
        if runs(candidate):
            link = bin_dir / name
            link.unlink(missing_ok=True)
            link.symlink_to(candidate)
            return candidate
    return None


def cache_dirs() -> list[tuple[str, str]]:
    """(name under ~/.cache, this machine's folder) of the pip and uv caches there are."""
    found = []
    pip = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True,
                         check=False)
    if pip.returncode == 0 and pip.stdout.strip():
        found.append(("pip", pip.stdout.strip()))
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if os.access(uv, os.X_OK):
        done = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip():
            found.append(("uv", done.stdout.strip()))
    return found


def code_version() -> str:
    """This checkout's commit, `+dirty` with uncommitted changes (the console's code the workers run)."""
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                         check=False).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True, check=False).stdout.strip()
    return sha + ("+dirty" if dirty else "")


def say(text: str) -> None:
    print(text, flush=True)


def read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


class Bench:
    def __init__(self, console: Console, homes: dict[int, Path], bin_dir: Path, run_timeout_s: float) -> None:
        self.console = console
        self.homes = homes
        self.bin_dir = bin_dir
        self.run_timeout_s = run_timeout_s
        self.live_run: str | None = None  # stopped on Ctrl-C

    def run(self, program: Program) -> Row:
        row = Row(program.name)
        name = program.name
        started = time.monotonic()
        done = self.console("sync", POD, "--dir", str(program.folder), log=f"{name}-sync")
        row.phases_s["sync"] = time.monotonic() - started
        if done.returncode != 0:
            row.problems.append(f"sync failed: {last_line(done.stderr)}")
            return row
        if (program.folder / "requirements.txt").is_file():
            setup = ["setup", POD]
            if program.python:
                linked = python_link(program.python, self.bin_dir, self.console.env)
                if linked:
                    say(f"{name}: python{program.python} is {linked} (linked first on the workers' PATH)")
                setup += ["--python-version", program.python]
            say(f"{name}: setup -- pip install -r requirements.txt ...")
            started = time.monotonic()
            done = self.console(*setup, "--", "pip", "install", "-r", "requirements.txt", log=f"{name}-setup")
            row.phases_s["setup"] = time.monotonic() - started
            if done.returncode != 0:
                row.problems.append(f"setup failed: {last_line(done.stderr)}")
                return row
        stopwatch = Stopwatch({w: h / "tpu-console" / "runs" for w, h in self.homes.items()})
        started = time.monotonic()
        try:
            done = self.console("launch", POD, "--json", "--", *program.command, log=f"{name}-launch")
            if done.returncode != 0:
                row.problems.append(f"launch failed: {last_line(done.stderr)}")
                return row
            launched = json.loads(done.stdout)
            row.run_id = run_id = launched["run_id"]
            self.live_run = run_id
            say(f"{name}: {run_id} launched; following it until it ends ...")
            try:
                self.console("logs", run_id, "--follow", log=f"{name}-output", timeout=self.run_timeout_s)
            except subprocess.TimeoutExpired:
                row.problems.append(f"still running after {self.run_timeout_s:.0f} s: stopped")
                self.console("stop", run_id, "--yes", log=f"{name}-stop")
            row.phases_s["run"] = time.monotonic() - started
            self.live_run = None
        finally:
            stopwatch.stop()
        self.read_run(program, row, launched, stopwatch)
        return row

    def read_run(self, program: Program, row: Row, launched: dict, stopwatch: Stopwatch) -> None:
        run_id = launched["run_id"]
        status = self.console.json("status", run_id, log=f"{program.name}-status")
        shown = self.console.json("runs", "show", run_id, log=f"{program.name}-runs-show")
        row.version = self.version(program, launched["job"].get("env_dir"))
        if shown.get("state") != "succeeded":
            row.problems.append(f"the run {shown.get('state')}: {shown.get('failure') or '-'}")
        row.goodput_pct = (shown.get("goodput") or {}).get("goodput_pct")
        archive = Path(shown["archive_path"]) if shown.get("archive_path") else None
        by_worker = {w["worker"]: w for w in status.get("worker_status", [])}
        try:
            dashboard = self.console.dashboard(run_id, log=f"{program.name}-dashboard")
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            row.problems.append(str(exc))
            dashboard = None
        on_dashboard = dashboard_shown(dashboard) if dashboard is not None else {}
        formats: list[str] = []
        for worker in launched["workers"]:
            run_dir = self.homes[worker] / "tpu-console" / "runs" / run_id
            output = read(run_dir / "output.log")
            events_file = archive / f"worker-{worker}" / "events.jsonl" if archive else None
            if events_file is None or not events_file.is_file():
                events_file = run_dir / "events.jsonl"  # not archived: the worker's own
            events = read(events_file)
            program_made = made_from(program, output, stopwatch.growth.get((worker, run_id), []))
            console_seen = seen_from(events, by_worker.get(worker))
            problems = judge(program_made, console_seen)
            if dashboard is not None:
                problems += judge_dashboard(console_seen, on_dashboard.get(worker))
            row.workers[worker] = WorkerResult(program_made, console_seen, problems, on_dashboard.get(worker))
            formats += [f for f in console_seen.formats if f not in formats]
        row.format = ",".join(formats) or "-"
        if dashboard is not None:
            most_steps = max((len(r.seen.steps) for r in row.workers.values()), default=0)
            prints_loss = any(r.made.losses for r in row.workers.values())
            row.problems += judge_plots(dashboard, most_steps, prints_loss)
        lasts = [r.made.last for r in row.workers.values() if r.made.last is not None]
        summary_step = (shown.get("summary") or {}).get("step")
        if lasts and summary_step != max(lasts):
            row.problems.append(f"runs show's step is {summary_step if summary_step is not None else '-'}, "
                                f"the last made is {max(lasts)}")

    def version(self, program: Program, env_dir: str | None) -> str:
        package = program.package or first_requirement(program.folder)
        if not package:
            return "-"
        python = f"{env_dir}/bin/python" if env_dir else "python"
        done = self.console("exec", POD, "--worker", "0", "--json", "--",
                            f"{python} -c 'import importlib.metadata as m; print(m.version(\"{package}\"))'")
        try:
            result = json.loads(done.stdout)["results"][0]
        except (ValueError, KeyError, IndexError):
            return f"{package} ?"
        return f"{package} {result['stdout'].strip() if result['exit_status'] == 0 else '?'}"


def make_pod(console: Console, workers: int) -> dict[int, Path]:
    """The pod made and bootstrapped, its workers' caches linked to this machine's; each worker's home."""
    for args in (("create", POD, "--type", f"local-{workers}x1"), ("bootstrap", POD)):
        started = time.monotonic()
        done = console(*args, log=args[0])
        if done.returncode != 0:
            raise RuntimeError(f"`tpu-console {' '.join(args)}` exited {done.returncode}: "
                               f"{last_line(done.stderr)}")
        say(f"{args[0]}: {time.monotonic() - started:.1f} s")
    results = console.json("exec", POD, "--", 'echo "$HOME"')["results"]
    homes = {r["worker"]: Path(r["stdout"].strip()) for r in results}
    for name, folder in cache_dirs():
        for home in homes.values():
            link = home / ".cache" / name
            link.parent.mkdir(exist_ok=True)
            if not link.exists() and not link.is_symlink():
                link.symlink_to(folder)
    return homes


def main(programs: list[Program], workers: int, keep: bool, json_out: Path | None,
         run_timeout_s: float) -> int:
    home = Path(tempfile.mkdtemp(prefix="tpc-bench-programs-"))
    bin_dir = home / "bin"
    bin_dir.mkdir()
    console = Console(home, bin_dir)
    say(f"TPU_CONSOLE_HOME={home}; {len(programs)} program(s) on a local pod of {workers} worker(s); the "
        f"console at {code_version()}")
    rows: list[Row] = []
    bench: Bench | None = None
    interrupted = False
    try:
        bench = Bench(console, make_pod(console, workers), bin_dir, run_timeout_s)
        for program in programs:
            try:
                row = bench.run(program)
            except RuntimeError as exc:  # a console command that should not fail did: the row says so
                row = Row(program.name, problems=[str(exc)])
            rows.append(row)
            phases = ", ".join(f"{k} {v:.1f} s" for k, v in row.phases_s.items())
            say(f"{program.name}: {phases}: {'PASS' if row.passed else 'FAIL'}")
            for problem in row.all_problems() if not row.passed else []:
                say(f"    {problem}")
            if json_out is not None:  # the rows so far, should the rest never come
                json_out.write_text(json.dumps([r.to_json() for r in rows], indent=2) + "\n")
    except KeyboardInterrupt:
        interrupted = True
        say(f"interrupted: the rows of the {len(rows)} program(s) that ended follow")
    finally:
        if bench is not None and bench.live_run:
            console("stop", bench.live_run, "--yes")
        if keep:
            say(f"kept: the pod {POD} and TPU_CONSOLE_HOME={home} (each command's output in {console.logs})")
        else:
            started = time.monotonic()
            done = console("delete", POD, "--yes")
            say(f"delete: {time.monotonic() - started:.1f} s" if done.returncode == 0
                else f"delete failed: {last_line(done.stderr)} (TPU_CONSOLE_HOME={home} kept)")
            if done.returncode == 0:
                shutil.rmtree(home, ignore_errors=True)
    print()
    print(table(rows))
    if interrupted:
        return 130
    return 0 if rows and all(r.passed for r in rows) else 1


def corpus(only: str | None) -> list[Program]:
    folders = sorted(p.parent for p in CORPUS.glob("*/program.toml"))
    if only:
        wanted = [n.strip() for n in only.split(",") if n.strip()]
        known = {f.name: f for f in folders}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise BadProgram(f"no program {unknown[0]!r} in {CORPUS} (there are: "
                             f"{', '.join(known) or 'none'}); name one of those in --only")
        folders = [known[n] for n in wanted]
    if not folders:
        raise BadProgram(f"no program in {CORPUS}: each is a folder with a program.toml")
    return [load_program(f) for f in folders]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", metavar="NAME,...", help="these programs only (folder names)")
    parser.add_argument("--workers", type=int, default=2, help="the local pod's workers (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the pod and its TPU_CONSOLE_HOME")
    parser.add_argument("--json", dest="json_out", type=Path, metavar="OUT", help="write the rows here")
    parser.add_argument("--run-timeout", type=float, default=3600.0, metavar="S",
                        help="stop a program's run after S seconds (default 3600)")
    options = parser.parse_args()
    try:
        chosen = corpus(options.only)
        if options.workers < 1:
            raise BadProgram("--workers must be 1 or more")
    except BadProgram as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(chosen, options.workers, options.keep, options.json_out, options.run_timeout))
    except RuntimeError as exc:  # the pod could not be made
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # a second Ctrl-C, while the pod was being deleted
        print("interrupted", file=sys.stderr)
        sys.exit(130)
