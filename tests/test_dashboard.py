"""The dashboard's start-up lines: its address, and the way in when Ray's token auth is on.
Fast: nothing here starts Ray (benchmarks/dashboard_check.py opens a real dashboard)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from walle_ray.runtime import ray_init
from walle_ray.runtime.ray_init import dashboard_lines, token_location

ADDRESS = "walle_ray: Ray dashboard at http://127.0.0.1:8265 (actors walle/*, metrics walle_*)"


def test_auth_off_prints_only_the_address():
    assert dashboard_lines("127.0.0.1:8265", "disabled", environ={}) == [ADDRESS]


def test_auth_on_says_how_to_get_the_token_and_where_it_is(tmp_path):
    lines = dashboard_lines("127.0.0.1:8265", "token", environ={}, home=tmp_path)
    assert lines[0] == ADDRESS
    assert len(lines) == 2 and lines[1].startswith("walle_ray: ")
    assert "`ray get-auth-token`" in lines[1]
    assert str(tmp_path / ".ray" / "auth_token") in lines[1]


def test_the_token_itself_is_never_printed(tmp_path):
    secret = "0123456789abcdef0123456789abcdef"
    (tmp_path / "token").write_text(secret)
    for environ in ({"RAY_AUTH_TOKEN": secret}, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")}):
        text = "\n".join(dashboard_lines("127.0.0.1:8265", "token", environ=environ))
        assert secret not in text


def test_token_location_follows_rays_order(tmp_path):
    path = str(tmp_path / "tok")
    assert token_location({"RAY_AUTH_TOKEN": "x", "RAY_AUTH_TOKEN_PATH": path}) == \
        "the RAY_AUTH_TOKEN variable"
    assert token_location({"RAY_AUTH_TOKEN_PATH": path}) == path
    assert token_location({}, home=Path("/home/me")) == "/home/me/.ray/auth_token"


def test_an_address_with_a_scheme_is_kept():
    assert dashboard_lines("https://ray.example:443", "disabled", environ={})[0].startswith(
        "walle_ray: Ray dashboard at https://ray.example:443 ")


def test_start_ray_prints_the_lines(monkeypatch, capsys):
    """start_ray's wiring, with ray.init replaced (no cluster starts)."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: SimpleNamespace(dashboard_url="127.0.0.1:8265"))
    monkeypatch.setattr(ray_init, "auth_mode", lambda: "token")
    ray_init.start_ray(None, 2, "walle_test")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ADDRESS and "ray get-auth-token" in out[1]


def test_without_the_dashboards_packages_the_run_starts_without_it(monkeypatch, capsys):
    """Ray installed without its ``default`` extra: Ray's own ``include_dashboard=True``
    would raise from deep inside ``ray.init``; the run starts without the dashboard."""
    import sys

    import ray

    asked = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setitem(sys.modules, "ray.dashboard.optional_deps", None)  # import fails
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: asked.update(kw) or SimpleNamespace(dashboard_url=None))
    ray_init.start_ray(None, 2, "walle_test")
    out = capsys.readouterr().out.splitlines()
    assert asked["include_dashboard"] is False
    assert len(out) == 1 and out[0].startswith("walle_ray: no Ray dashboard: ")
    assert "ray[default]" in out[0]


@pytest.mark.parametrize("given,environ", [(None, "local"), ("local", "10.0.0.5:6379")])
def test_local_starts_the_runs_own_instance(monkeypatch, given, environ):
    """"local" (RAY_ADDRESS or run.ray_address) is Ray's word for a new local instance: it
    gets what a run's own instance gets (its CPUs, loopback servers, roles in a session of
    their own, which a signal to the run's process group must not reach), and Ray is told
    "local", so it joins neither RAY_ADDRESS's cluster nor one ``ray start`` left here."""
    import ray

    asked = {}
    monkeypatch.setenv("RAY_ADDRESS", environ)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: asked.update(kw) or SimpleNamespace(dashboard_url=None))
    ray_init.start_ray(given, 2, "walle_test")
    assert asked["address"] == "local" and asked["num_cpus"] == 2
    assert asked["_node_ip_address"] == "127.0.0.1"
