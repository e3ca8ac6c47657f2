"""The web worker's process settings (config/gunicorn.py): the collector frozen once the
application is loaded, and no access-log record built per request."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gunicorn.glogging import Logger

from config import gunicorn as gunicorn_config
from config.gc_tuning import gc_freeze_after_load
from config.gunicorn_workers import NoAccessLogger
from tests.live import gunicorn_running


@pytest.fixture
def unfrozen_afterwards() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_freeze_takes_every_live_object_out_of_collections(unfrozen_afterwards: None) -> None:
    kept = [[index] for index in range(1000)]  # alive, tracked containers made before the freeze
    frozen = gc_freeze_after_load()
    assert frozen == gc.get_freeze_count() > len(kept)
    assert not any(gc.is_tracked(obj) and obj in gc.get_objects(generation=2) for obj in kept[:5])
    made_after = [1, 2]
    assert made_after in gc.get_objects(generation=0)


def test_the_worker_hook_freezes_and_says_how_many(unfrozen_afterwards: None) -> None:
    said: list[tuple[Any, ...]] = []

    class Worker:
        class log:  # stands in for gunicorn's worker.log
            @staticmethod
            def info(message: str, *args: Any) -> None:
                said.append((message, *args))

    gunicorn_config.post_worker_init(Worker())
    [(message, count)] = said
    assert message == "gc: %d objects of the loaded application frozen"
    assert count > 100_000 and abs(gc.get_freeze_count() - count) < 100  # frozen objects can still be freed


def test_no_access_log_record_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def atoms(*args: Any) -> dict[str, str]:
        raise AssertionError("the access-log fields were worked out")

    monkeypatch.setattr(Logger, "atoms", atoms)
    assert gunicorn_config.logger_class == "config.gunicorn_workers.NoAccessLogger"
    logger = NoAccessLogger.__new__(NoAccessLogger)  # access() needs no set-up
    logger.access(None, None, {}, None)
    with pytest.raises(AssertionError):  # gunicorn's own logger does, with logconfig_dict set as ours is
        _StockLogger().access(None, None, {}, None)


class _StockLogger(Logger):  # type: ignore[misc]
    def __init__(self) -> None:  # gunicorn's set-up needs a config; access() only asks this
        self._access_log_enabled = True


def test_a_served_worker_freezes_its_loaded_application(django_db_setup: None, tmp_path: Path) -> None:
    log = tmp_path / "gunicorn.log"
    with gunicorn_running(log=log):
        pass
    lines = [line for line in log.read_text().splitlines() if "objects of the loaded application frozen" in line]
    assert len(lines) == 1, log.read_text()[-2000:]
    frozen = int(lines[0].split("gc: ", 1)[1].split(" ", 1)[0])
    assert frozen > 100_000  # Django, DRF and the project's modules, not a handful
