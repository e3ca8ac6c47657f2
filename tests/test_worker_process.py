"""The web worker's process settings (config/gunicorn.py, fastpath/gcfreeze.py): the
collector frozen once the application is loaded, and no access-log record built per
request unless one is asked for."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gunicorn.config import Config
from gunicorn.glogging import Logger

from config import gunicorn as gunicorn_config
from config.gunicorn_workers import NoAccessLogger
from fastpath.gcfreeze import gc_freeze_after_load
from tests.live import gunicorn_running


@pytest.fixture
def unfrozen_afterwards() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def _collected(obj: object) -> bool:
    """Whether collections still walk `obj` (frozen objects are in no generation)."""
    return any(candidate is obj for candidate in gc.get_objects())


def test_the_freeze_takes_every_live_object_out_of_collections(unfrozen_afterwards: None) -> None:
    kept = [[index] for index in range(10)]  # alive, tracked containers made before the freeze
    assert _collected(kept[0])
    frozen = gc_freeze_after_load()
    # a frozen object can still be freed (by a thread an earlier test left running) before the count is read again
    assert 0 <= frozen - gc.get_freeze_count() < 100 and frozen > len(kept)
    assert not _collected(kept[0]) and not _collected(kept)
    made_after = [1, 2]
    assert _collected(made_after)


def test_the_freeze_loads_the_url_configurations_first(unfrozen_afterwards: None) -> None:
    from django.conf import settings
    from django.urls import clear_url_caches, get_resolver

    clear_url_caches()  # as in a new worker: no resolver built yet
    gc_freeze_after_load()
    for urlconf in (settings.ROOT_URLCONF, settings.PUBLIC_SCHEMA_URLCONF):
        resolver = get_resolver(urlconf)
        assert "url_patterns" in resolver.__dict__, urlconf  # loaded (a cached_property)
        assert not _collected(resolver.__dict__["url_patterns"]), urlconf


def test_the_worker_hook_freezes_and_says_how_many(unfrozen_afterwards: None) -> None:
    said: list[tuple[Any, ...]] = []

    class Worker:
        class log:  # stands in for gunicorn's worker.log
            @staticmethod
            def info(message: str, *args: Any) -> None:
                said.append((message, *args))

    cfg = Config()
    cfg.set("post_worker_init", gunicorn_config.post_worker_init)  # resolved as gunicorn resolves it
    cfg.post_worker_init(Worker())
    [(message, count)] = said
    assert message == "gc: %d objects of the loaded application frozen"
    assert count > 20_000 and abs(gc.get_freeze_count() - count) < 100  # frozen objects can still be freed


def _logger(logger_class: type[Logger], **cfg: Any) -> Logger:
    """A logger of `logger_class` with our gunicorn settings (logconfig_dict set) and `cfg`."""
    logger = logger_class.__new__(logger_class)  # gunicorn's setup() would open files and configure logging
    settings = {"accesslog": None, "logconfig": None, "logconfig_json": None, "syslog": False,
                "disable_redirect_access_to_syslog": False, "logconfig_dict": gunicorn_config.logconfig_dict, **cfg}
    logger.cfg = SimpleNamespace(**settings)
    logger._access_log_enabled = logger._compute_access_log_enabled()
    return logger


def test_no_access_log_record_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []

    def atoms(self: Logger, *args: Any) -> dict[str, str]:
        built.append(args)
        raise RuntimeError("stop here: the access-log fields were being worked out")

    monkeypatch.setattr(Logger, "atoms", atoms)
    assert gunicorn_config.logger_class == "config.gunicorn_workers.NoAccessLogger"
    _logger(NoAccessLogger).access(None, None, {}, None)
    assert built == []
    with pytest.raises(RuntimeError):  # gunicorn's own logger does, with our logconfig_dict
        _logger(Logger).access(None, None, {}, None)
    with pytest.raises(RuntimeError):  # and ours does when an access log is asked for
        _logger(NoAccessLogger, accesslog="-").access(None, None, {}, None)


def test_a_served_worker_freezes_its_loaded_application(django_db_setup: None, tmp_path: Path) -> None:
    log = tmp_path / "gunicorn.log"
    with gunicorn_running(log=log):
        pass
    lines = [line for line in log.read_text().splitlines() if "objects of the loaded application frozen" in line]
    assert len(lines) == 1, log.read_text()[-2000:]
    frozen = int(lines[0].split("gc: ", 1)[1].split(" ", 1)[0])
    assert frozen > 20_000  # Django, DRF and the project's modules, not a handful
