"""Registration refuses what cannot run, with an error that says what to write instead."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from helpers import url_text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sqla_jobs import Registry, RegistryError, SchemaNotReadyError, enqueue, enqueue_many
from sqla_jobs.producer import NewJob
from sqla_jobs.tasks import load_registry


def test_an_async_def_handler_is_registered_as_async() -> None:
    registry = Registry()

    async def send(session: Any, payload: Any, job: Any) -> None:
        pass

    handler = registry.handler("send")(send)
    assert (handler.is_async, handler.wants_job) == (True, True)
    assert registry.kinds_where(True) == ("send",)
    assert registry.kinds_where(False) == ()


def test_a_generator_handler_is_refused_because_calling_it_runs_nothing() -> None:
    def report(session: Any, payload: Any) -> Any:
        yield 1

    with pytest.raises(RegistryError, match=r"'report' .* is a generator function"):
        Registry().register("report", report)


def test_an_object_with_an_async_call_is_an_async_handler_too() -> None:
    class Sender:
        async def __call__(self, session: Any, payload: Any) -> None:
            pass

    handler = Registry().register("send", Sender())
    assert (handler.is_async, handler.wants_job) == (True, False)


def test_an_async_handler_with_the_wrong_arguments_is_refused() -> None:
    async def send(session: Any) -> None:
        pass

    with pytest.raises(
        RegistryError,
        match=r"'send' .* cannot be called as \(session, payload\) or \(session, payload, "
        r"job\).*\(or async def, with the same arguments\)",
    ):
        Registry().register("send", send)


@pytest.mark.parametrize("kind", ["generator", "async generator"])
def test_a_generator_handler_is_refused(kind: str) -> None:
    def gen(session: Any, payload: Any) -> Any:
        yield 1

    async def agen(session: Any, payload: Any) -> Any:
        yield 1

    with pytest.raises(
        RegistryError,
        match=r"handler 'g' \(.*\) is a generator function \(it contains `yield`\): calling "
        r"it would not run its body; write it as a plain def \(or async def\) that returns",
    ):
        Registry().register("g", gen if kind == "generator" else agen)


def test_calling_an_async_handler_like_a_plain_one_says_to_await_run_async() -> None:
    async def send(session: Any, payload: Any) -> None:
        pass

    handler = Registry().register("send", send)
    with pytest.raises(TypeError, match=r"'send' is an async def function: await handler"):
        handler(None, {}, None)  # type: ignore[arg-type, unused-coroutine]


@pytest.mark.parametrize(
    "fn",
    [
        lambda session: None,
        lambda: None,
        lambda session, payload, job, extra: None,
        lambda session, payload, *, required: None,
    ],
    ids=["one-arg", "no-arg", "four-required", "required-keyword"],
)
def test_a_handler_that_cannot_take_session_payload_is_refused(fn: Any) -> None:
    with pytest.raises(
        RegistryError,
        match=r"cannot be called as \(session, payload\) or \(session, payload, job\): "
        r"write it as def handler\(session, payload\)",
    ):
        Registry().register("k", fn)


@pytest.mark.parametrize(
    ("fn", "wants_job"),
    [
        (lambda session, payload: None, False),
        (lambda session, payload, job: None, True),
        (lambda session, payload, job=None: None, True),
        (lambda session, payload, *rest: None, True),
        (lambda session, payload, **kw: None, False),
        (lambda *args: None, True),
    ],
)
def test_handler_signatures_that_can_run_are_accepted(fn: Any, wants_job: bool) -> None:
    assert Registry().register("k", fn).wants_job is wants_job


def test_the_decorator_without_its_kind_is_refused() -> None:
    registry = Registry()
    with pytest.raises(RegistryError, match=r'write @registry.handler\("kind"\), not @registry'):

        @registry.handler  # type: ignore[arg-type]
        def send_mail(session: Any, payload: Any) -> None:
            pass


def test_a_misspelled_registry_attribute_is_named(tmp_path: Path) -> None:
    (tmp_path / "typoapp.py").write_text("from sqla_jobs import Registry\nregistry = Registry()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(
            RegistryError,
            match=r"module 'typoapp' has no attribute 'registri' \(in 'typoapp:registri'\)",
        ):
            load_registry("typoapp:registri")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("typoapp", None)


def test_an_app_path_naming_a_class_says_the_class_not_its_metaclass(tmp_path: Path) -> None:
    (tmp_path / "modelsapp.py").write_text(
        "from sqlalchemy.orm import DeclarativeBase\n\n\nclass Base(DeclarativeBase):\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(RegistryError) as caught:
            load_registry("modelsapp:Base")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("modelsapp", None)
    assert str(caught.value) == "'modelsapp:Base' is not a sqla_jobs.Registry (got the class Base)"
    with pytest.raises(RegistryError, match=r"\(got the module sqla_jobs\.models\)"):
        load_registry("sqla_jobs:models")


def test_the_worker_command_names_a_misspelled_registry(tmp_path: Path, db_url: URL) -> None:
    (tmp_path / "typoapp2.py").write_text(
        textwrap.dedent(
            """
            from sqla_jobs import Registry
            registry = Registry()
            registry.register("k", lambda session, payload: None)
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sqla_jobs.worker", "typoapp2:registri"],
        cwd=tmp_path,
        env={"DATABASE_URL": url_text(db_url), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "module 'typoapp2' has no attribute 'registri'" in proc.stderr


def test_enqueue_into_an_unmigrated_database_says_to_run_the_migrations(
    empty_db_url: URL,
) -> None:
    engine = sa.create_engine(empty_db_url)
    try:
        for call in (
            lambda s: enqueue(s, "k", {}),
            lambda s: enqueue_many(s, [NewJob("k", {})]),
        ):
            with (
                Session(engine) as s,
                pytest.raises(
                    SchemaNotReadyError,
                    match=r"the jobs table does not exist.*alembic upgrade head",
                ),
            ):
                call(s)
    finally:
        engine.dispose()


def test_the_worker_on_an_unmigrated_database_prints_one_line(empty_db_url: URL) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sqla_jobs.worker", "jobapp:registry"],
        cwd=Path(__file__).parent,
        env={"DATABASE_URL": url_text(empty_db_url), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "run `alembic upgrade heads`" in proc.stderr
