"""A mistyped node name: one line, exit status 2, nothing done, and the names it may be a typo of."""

from __future__ import annotations

import pytest

from tests.console.launch.test_local import pod, run  # noqa: F401 - fixture
from tests.fixtures_cli import FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.errors import UnknownNode, close_names, did_you_mean
from tpu_console.providers.registry import find_node

pytestmark = pytest.mark.usefixtures("console_home", "pod")


@pytest.mark.parametrize("argv", [
    ["status", "podd"], ["delete", "podd", "--yes"], ["exec", "pdo", "--", "true"],
    ["launch", "podd", "--", "true"], ["runs", "show", "pdo"], ["logs", "podd"], ["runs", "pdo"],
])
def test_a_mistyped_node_is_one_line_naming_the_node_it_may_mean(capsys, argv):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "(did you mean 'pod'?)" in err and repr(argv[-1] if argv[0] == "runs" else argv[1]) in err
    assert run(capsys, "ls", "--json")[0] == 0  # the pod is still there, untouched


def test_a_name_like_no_node_gets_no_guess(capsys):
    status, _, err = run(capsys, "delete", "something-else", "--yes")
    assert status == 2 and err == "error: unknown node 'something-else': `tpu-console ls` lists the nodes\n"


async def test_every_close_name_from_every_provider_the_closest_first():
    providers = {"fake": FakeProvider([make_node("grpo-a"), make_node("grpo-b"), make_node("bench")])}
    with pytest.raises(UnknownNode) as info:
        await find_node(providers, "grpo-c")
    assert info.value.close == ["grpo-a", "grpo-b"]
    assert str(info.value) == ("unknown node 'grpo-c' (did you mean 'grpo-a' or 'grpo-b'?): `tpu-console ls` "
                               "lists the nodes")
    assert did_you_mean(close_names("pod", ["pod-1", "pod-2", "pod-3", "pod-4"])) == (
        " (did you mean 'pod-1', 'pod-2' or 'pod-3'?)")
