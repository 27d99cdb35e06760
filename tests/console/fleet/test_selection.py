import pytest

from tpu_console.errors import UserError
from tpu_console.fleet.selection import parse_worker_selection


@pytest.mark.parametrize(
    ("text", "count", "expected"),
    [
        ("all", 4, [0, 1, 2, 3]),
        ("ALL", 2, [0, 1]),
        ("0", 1, [0]),
        ("3", 4, [3]),
        ("0,2", 4, [0, 2]),
        ("2,0", 4, [0, 2]),
        ("1-3", 4, [1, 2, 3]),
        ("0,2-3", 4, [0, 2, 3]),
        ("1,1,0-1", 4, [0, 1]),
        (" 0 , 2 ", 4, [0, 2]),
        ("2-2", 3, [2]),
    ],
)
def test_valid_selections(text, count, expected):
    assert parse_worker_selection(text, count) == expected


@pytest.mark.parametrize(
    ("text", "count", "message"),
    [
        ("4", 4, "worker 4 is out of range: this node has 4 workers (0-3)"),
        ("0-4", 4, "worker 4 is out of range"),
        ("1", 1, "this node has 1 worker (0)"),
        ("3-1", 4, "write the lower index first, e.g. 1-3"),
        ("x", 4, "use all, an index (0-3)"),
        ("0,", 4, "bad worker selection"),
        ("-1", 4, "bad worker selection"),
        ("", 4, "empty worker selection"),
        ("1.5", 4, "bad worker selection"),
    ],
)
def test_invalid_selections_name_the_valid_range(text, count, message):
    with pytest.raises(UserError) as info:
        parse_worker_selection(text, count)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
