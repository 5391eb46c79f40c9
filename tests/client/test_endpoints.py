"""Start checks of endpoints: /v1/models must list the model; /server_info is read when present."""

from __future__ import annotations

import asyncio
import logging

import httpx2
import pytest

from regen.client import check_endpoints, server_root
from regen.core.errors import EndpointError
from regen.manifest import Endpoint

GOOD = "http://10.0.0.1:30000/v1"
OLD = "http://10.0.0.2:30000/v1"
WRONG = "http://10.0.0.3:30000/v1"
DEAD = "http://10.0.0.4:30000/v1"
MODEL = "moonshotai/Kimi-K2.5"

SERVER_INFO = {
    "max_running_requests": 48,
    "version": "0.5.13",
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_model_path": "/drafts/k25",
    "tp_size": 8,
}


def handler(request: httpx2.Request) -> httpx2.Response:
    host, path = request.url.host, request.url.path
    if host == "10.0.0.4":
        raise httpx2.ConnectError("connection refused")
    if path == "/v1/models":
        served = "other/model" if host == "10.0.0.3" else MODEL
        return httpx2.Response(
            200, json={"object": "list", "data": [{"id": served, "max_model_len": 262144}]}
        )
    if host == "10.0.0.1" and path == "/server_info":
        return httpx2.Response(200, json=SERVER_INFO)
    if host == "10.0.0.2" and path == "/get_server_info":
        return httpx2.Response(200, json={"max_running_requests": 16, "version": "0.4.9"})
    return httpx2.Response(404, json={"detail": "Not Found"})


def check(urls, model=MODEL):
    factory = lambda t: httpx2.AsyncClient(transport=httpx2.MockTransport(handler))  # noqa: E731
    endpoints = [Endpoint(url=u) for u in urls]
    return asyncio.run(check_endpoints(endpoints, model, http_factory=factory))


def test_server_info_is_read():
    (info,) = check([GOOD])
    assert info.url == GOOD and info.models == (MODEL,)
    assert info.max_model_len == 262144
    assert info.max_running_requests == 48
    assert info.version == "0.5.13"
    assert info.speculative == {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/drafts/k25",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }
    assert info.server_info is True


def test_old_get_server_info_alias_and_no_server_info():
    old, wrong_ok = check([OLD]), check([WRONG], model="other/model")
    assert (old[0].max_running_requests, old[0].version) == (16, "0.4.9")
    assert wrong_ok[0].server_info is False and wrong_ok[0].max_running_requests is None


def test_unusable_endpoints_are_dropped_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="regen.client.endpoints"):
        infos = check([DEAD, GOOD, WRONG])
    assert [i.url for i in infos] == [GOOD]
    text = caplog.text
    assert DEAD in text and "unreachable" in text
    assert WRONG in text and "other/model" in text


def test_none_usable_names_each_endpoint_and_why():
    with pytest.raises(EndpointError) as info:
        check([DEAD, WRONG])
    msg = str(info.value)
    assert f"{DEAD}: unreachable" in msg
    assert f"{WRONG}: does not serve model '{MODEL}' (it serves: 'other/model')" in msg


def test_no_endpoints_at_all():
    with pytest.raises(EndpointError, match="no endpoints"):
        check([])


def test_server_root():
    assert server_root("http://h:1/v1") == "http://h:1"
    assert server_root("http://h:1/v1/") == "http://h:1"
    assert server_root("http://h:1/api") == "http://h:1/api"


def test_a_url_without_v1_gets_a_hint_not_a_bare_404():
    with pytest.raises(EndpointError) as e:
        check(["http://10.0.0.1:30000"])
    assert "GET /models answered HTTP 404 (the URL has no /v1: try http://10.0.0.1:30000/v1)" in (
        str(e.value)
    )


def test_the_start_up_line_of_an_endpoint_reads_as_a_sentence() -> None:
    """Issue 31, item 9: no "reported engine.concurrency sizes ..., openai None"."""
    from regen.client.endpoints import EndpointInfo, describe_endpoint

    bare = EndpointInfo(url="http://h/v1", weight=1.0, models=("m",))
    assert describe_endpoint(bare) == (
        "openai (no version); no batch slots reported, so engine.concurrency sizes the "
        "in-flight limits"
    )
    sglang = EndpointInfo(url="http://h/v1", weight=1.0, models=("m",), engine="sglang",
                          version="0.5.23", max_running_requests=64,
                          slots_source="max_running_requests")  # fmt: skip
    assert describe_endpoint(sglang) == (
        "sglang 0.5.23; its 64 batch slots (max_running_requests) size the in-flight limits"
    )


def test_a_hung_sglang_is_left_out_at_start_not_taken_for_a_plain_openai_server() -> None:
    """A hung SGLang lists its model (the HTTP server answers) but not /server_info (the
    scheduler does): regen.devkit.simulate's hang, as SGLang 0.5.23 behaves."""
    import asyncio
    import time

    import httpx2

    from regen.client.endpoints import check_endpoints
    from regen.core.errors import EndpointError
    from regen.devkit.simulate.testing import simulator_in_thread
    from regen.manifest import Endpoint

    with (
        simulator_in_thread(model_name="m", hang_at_s=1.0) as hung,
        simulator_in_thread(model_name="m") as fine,
    ):
        for _ in range(100):  # hung once its /stats says so (started healthy: ready)
            if httpx2.get(f"{hung.base}/stats", timeout=5).json().get("hung"):
                break
            time.sleep(0.05)
        eps = [Endpoint(url=hung.url), Endpoint(url=fine.url)]
        usable = asyncio.run(check_endpoints(eps, "m", timeout_s=1.0))
        assert [u.url for u in usable] == [fine.url]
        assert usable[0].engine == "sglang"
        with pytest.raises(EndpointError, match="hung server"):
            asyncio.run(check_endpoints(eps[:1], "m", timeout_s=1.0))
