"""`localspec serve --metrics`: GET /metrics in Prometheus' text format, read with prometheus_client's parser."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
parser = pytest.importorskip("prometheus_client.parser")

KEY = "metrics-test-key"


@pytest.fixture(scope="module")
def served(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from serverproc import ServeProcess

    s = ServeProcess(["-t", str(tiny_dir / "target.gguf"), "-d", str(tiny_dir / "draft.gguf"), "--ctx", "1024",
                      "--metrics", "--api-key", KEY, "--method", "lookup"], tmp_path_factory.mktemp("serve"))
    yield s
    s.close()


def scrape(server, key: str = KEY) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, by (name, sorted labels)."""
    req = urllib.request.Request(server.base + "/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers.get_content_type() == "text/plain"
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_what_the_replies_report(served):
    client = openai.OpenAI(base_url=served.url, api_key=KEY, max_retries=0, timeout=60)
    before = scrape(served)
    messages = [{"role": "user", "content": "the cat sat on the mat; the cat sat on the mat; the cat sat on"}]
    first = client.chat.completions.create(model="target", messages=messages, max_tokens=12)
    second = client.chat.completions.create(model="target", messages=messages, max_tokens=12)
    after = scrape(served)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("localspec_requests_total", route="/v1/chat/completions", status="2xx") == 2
    assert grew("localspec_generations_total", outcome="completed") == 2
    replies = (first, second)
    assert grew("localspec_prompt_tokens_total") == sum(r.usage.prompt_tokens for r in replies)
    assert grew("localspec_generated_tokens_total") == sum(r.usage.completion_tokens for r in replies)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0  # the second request's prompt is the first one's
    assert grew("localspec_prompt_cached_tokens_total") >= cached
    drafted = sum(r.model_extra["timings"]["draft_n"] for r in replies)
    kept = sum(r.model_extra["timings"]["draft_n_accepted"] for r in replies)
    assert drafted > 0
    assert grew("localspec_drafted_tokens_total", drafter="lookup") == drafted
    assert grew("localspec_accepted_tokens_total", drafter="lookup") == kept
    assert after[("localspec_running", ())] == 0 and after[("localspec_queued", ())] == 0


def test_refusals_are_counted_and_metrics_need_the_key(served):
    before = scrape(served)
    status, _, _ = served.post("/v1/chat/completions", b'{"messages": []}')  # no key
    assert status == 401
    with pytest.raises(urllib.error.HTTPError) as err:
        scrape(served, key="wrong")
    assert err.value.code == 401
    status, _, _ = served.post("/no/such/path", b"{}", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 404
    after = scrape(served)
    assert after[("localspec_requests_total", (("route", "/v1/chat/completions"), ("status", "4xx")))] - \
        before.get(("localspec_requests_total", (("route", "/v1/chat/completions"), ("status", "4xx"))), 0) == 1
    # an unknown path is counted as "other", so a scanner cannot add label values
    assert after[("localspec_requests_total", (("route", "other"), ("status", "4xx")))] >= 1
    assert not any(labels and dict(labels).get("route") == "/no/such/path" for _, labels in after)


def test_a_model_by_name_counts_under_its_route_template(served):
    for name in ("a", "b/c", "d:latest"):
        request = urllib.request.Request(f"{served.base}/v1/models/{name}", headers={"Authorization": f"Bearer {KEY}"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 404
    routes = {dict(labels).get("route") for _, labels in scrape(served) if labels}
    assert "/v1/models/{name:path}" in routes and not routes & {"/v1/models/a", "/v1/models/b/c"}


def test_without_the_flag_there_is_no_metrics_route(server):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.base + "/metrics", timeout=10)
    assert err.value.code == 404
