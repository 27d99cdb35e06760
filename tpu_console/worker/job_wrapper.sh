# The detached session of a run: `bash -c <this> tpu-console-run PYTHON ARGS...` in the run's folder
# (tpu_console/fleet/recipes.py, start_detached). Sources .env, starts the job in its own process group with
# output.log as stdout+stderr, records the group in `pid`, waits, and writes `exit` atomically.
# `set -m` gives the job a process group apart from this wrapper's, so `stop` can kill the whole job (and
# whatever it spawned) while the wrapper lives on to record the status: 128+N for a job killed by signal N.
set -m
# Secrets arrive as a 0600 file and reach the job through the environment only.
if [ -f .env ]; then set -a; . ./.env; set +a; fi
PYTHONUNBUFFERED=1 "$@" </dev/null >>output.log 2>&1 &
job=$!
echo "$job" > pid.tmp && mv -f pid.tmp pid
wait "$job"; status=$?
echo "$status" > exit.tmp && mv -f exit.tmp exit
