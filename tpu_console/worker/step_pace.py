"""Who straggles, judged on the pod by the run's supervisor (supervisor.py, `on_straggler`) from the steps
the job runners report: observe/stragglers.py's rule, with the numbers the plan ships as its `pace`
(`window`, `min_steps`, `factor`, `min_excess_s`), so the rule has one home, the console's.

A worker's pace is the median step time of its last `window` steps seen: the step time the job gives
(the trainer's recent step time) where it gives one, else the time between two steps as seen here, over
the steps between them. A worker with `min_steps` steps seen straggles when its pace is `factor` times the
others' median and at least `min_excess_s` slower.

Python 3.8+ and the standard library only: shipped into the run folder beside supervisor.py.
"""

WINDOW = 20  # the rule's numbers where a plan gives none (the console's observe/stragglers.py ships them)


def kept_steps(rule):
    """How many of a worker's last steps to keep: twice the window."""
    return 2 * int(rule.get("window", WINDOW))


def stragglers(paced, rule):
    """{worker: (its step time, the others' median, the steps judged)} for each straggler among `paced`:
    {worker: {step: (when it was seen, the job's step time or None)}}, the running workers' steps."""
    window, factor = int(rule.get("window", WINDOW)), float(rule.get("factor", 1.5))
    min_steps, excess = int(rule.get("min_steps", 5)), float(rule.get("min_excess_s", 0))
    times = {w: step_time(steps, window) for w, steps in paced.items() if len(steps) >= min_steps}
    times = {w: s for w, s in times.items() if s is not None}
    slow = {}
    for index, seconds in sorted(times.items()):
        others = median([s for w, s in times.items() if w != index])
        if others is None or others <= 0 or seconds < factor * others or seconds - others < excess:
            continue
        slow[index] = (seconds, others, min(window, len(paced[index])))
    return slow


def step_time(paced, window):
    """The median step time of a worker's last `window` steps seen: the job's figure, else the time between
    two steps seen here (over the steps between them)."""
    steps = sorted(paced.items())[-window:]
    times = []
    for i in range(1, len(steps)):
        (step0, (t0, _)), (step, (t, s)) = steps[i - 1], steps[i]
        times.append(s if s is not None else (t - t0) / max(1, step - step0))
    return median(times)


def median(values):
    if not values:
        return None
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
