"""Which handlers a worker runs as coroutines: `fleet.worker.process.is_coroutine_function`
answers as `inspect.iscoroutinefunction` does, for every kind of callable a role names."""
from __future__ import annotations

import functools
import inspect
import subprocess
import sys
import textwrap

import pytest

from fleet.worker.process import is_coroutine_function


async def fetch(x):
    return x


def compute(x):
    return x


async def agen(x):
    yield x


class Holder:
    async def method(self, x):
        return x

    def plain(self, x):
        return x

    async def __call__(self, x):
        return x


KINDS = {
    "async_def": fetch, "def": compute, "async_generator": agen, "partial_of_async": functools.partial(fetch, 1),
    "partial_of_def": functools.partial(compute, 1), "bound_async_method": Holder().method,
    "bound_method": Holder().plain, "callable_object": Holder(), "builtin": len, "lambda": lambda x: x,
    "unbound_async_method": Holder.method,
}


@pytest.mark.parametrize("handler", KINDS.values(), ids=KINDS.keys())
def test_as_inspect_answers(handler):
    assert is_coroutine_function(handler) is inspect.iscoroutinefunction(handler)


def test_a_marked_function_is_asked_of_inspect():
    def marked(x):
        return x

    marked.__dict__["_is_coroutine_marker"] = object()  # what inspect.markcoroutinefunction sets (3.12+)
    assert is_coroutine_function(marked) is inspect.iscoroutinefunction(marked)


def test_a_plain_function_does_not_import_inspect():
    code = textwrap.dedent("""
        import sys
        from fleet.worker.process import is_coroutine_function
        async def f(): pass
        def g(): pass
        assert (is_coroutine_function(f), is_coroutine_function(g)) == (True, False)
        print("inspect" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
