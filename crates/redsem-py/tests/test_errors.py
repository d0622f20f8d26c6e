"""Each exception, raised by the real situation that makes the Rust library raise it."""

from __future__ import annotations

import pytest

import redsem
from conftest import free_port


def test_every_exception_is_a_redsem_error_and_the_python_kind_it_names():
    for name in redsem._errors.__all__:
        assert issubclass(getattr(redsem, name), redsem.Error), name
    assert issubclass(redsem.Timeout, TimeoutError)
    assert issubclass(redsem.Unavailable, ConnectionError)
    assert issubclass(redsem.InvalidArgument, ValueError)
    assert issubclass(redsem.LeaseLost, redsem.NotHeld)


def test_an_unreachable_server_is_unavailable():
    port = free_port()  # nothing listens there
    with pytest.raises(redsem.Unavailable) as raised:
        redsem.connect(f"redis://127.0.0.1:{port}", connect_timeout=1.0)
    assert str(raised.value).startswith("redis unavailable")
    assert isinstance(raised.value, ConnectionError)


def test_bad_arguments_are_invalid_argument(url):
    r = redsem.connect(url)
    with pytest.raises(redsem.InvalidArgument, match="capacity"):
        r.lease_semaphore("x", 0)
    with pytest.raises(ValueError, match="at least 0.030 s"):
        r.lease_semaphore("x", 1, lease=0.001)
    with pytest.raises(redsem.InvalidArgument, match="timeout"):
        r.lease_semaphore("x", 1).acquire(timeout=-1.0)
    with pytest.raises(redsem.InvalidArgument, match="server_checks"):
        redsem.connect(url, server_checks="sometimes")
    with pytest.raises(redsem.InvalidArgument, match="url"):
        redsem.connect("http://127.0.0.1")


def test_another_capacity_in_force_is_a_capacity_conflict(url):
    r = redsem.connect(url)
    held = r.lease_semaphore("jobs", 2).try_acquire()
    with pytest.raises(redsem.CapacityConflict) as raised:
        r.lease_semaphore("jobs", 3).try_acquire()
    assert "capacity 3" in str(raised.value) and "capacity 2" in str(raised.value)
    held.release()


def test_a_second_request_of_a_label_is_already_held(url):
    r = redsem.connect(url)
    sem = r.lease_semaphore("hosts", 2, label="web-1", one_per_label=True)
    held = sem.try_acquire()
    assert sem.status()["holders"][0]["label"] == "web-1"
    with pytest.raises(redsem.AlreadyHeld, match="web-1"):
        sem.try_acquire()
    held.release()


def test_a_foreign_value_is_wrong_type_and_left_untouched(server, url):
    server.command("SET", "redsem:{lease:taken}:state", "not mine")
    with pytest.raises(redsem.WrongType):
        redsem.connect(url).lease_semaphore("taken", 1).try_acquire()
    assert server.command("GET", "redsem:{lease:taken}:state") == "not mine"


def test_state_of_another_layout_is_incompatible(server, url):
    sem = redsem.connect(url).lease_semaphore("old", 1)
    sem.try_acquire().release()
    server.command("HSET", "redsem:{lease:old}:state", "layout", "99")
    with pytest.raises(redsem.Incompatible) as raised:
        sem.try_acquire()
    assert "99" in str(raised.value)


def test_the_prefix_names_the_keys(server, url):
    r = redsem.connect(url, prefix="billing")
    assert r.prefix == "billing"
    held = r.lease_semaphore("exports", 1).try_acquire()
    assert server.command("EXISTS", "billing:{lease:exports}:state") == 1
    assert redsem.connect(url).lease_semaphore("exports", 1).try_acquire() is not None
    held.release()


def test_the_native_engine_without_the_module_is_engine_unavailable(server, url):
    with pytest.raises(redsem.EngineUnavailable) as raised:
        redsem.connect(url, engine="native")
    text = str(raised.value)
    assert text.startswith("the native engine was asked for"), text
    assert f"127.0.0.1:{server.port}" in text and "unknown command" in text, text
    assert server.command("KEYS", "*") == []  # nothing was written
    # The default, "auto", and "scripts": the Lua scripts serve a server without the module.
    assert redsem.connect(url).engine == "scripts"
    assert redsem.connect(url, engine="scripts").engine == "scripts"
    with pytest.raises(redsem.InvalidArgument, match="engine"):
        redsem.connect(url, engine="lua")


def test_an_unsuitable_server_is_refused(server, url):
    server.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    with pytest.raises(redsem.Unsuitable, match="maxmemory-policy"):
        redsem.connect(url)
    redsem.connect(url, server_checks="warn")  # accepted, with a warning in the log
