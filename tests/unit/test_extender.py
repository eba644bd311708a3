"""The scheduler extender over real HTTP (a server on a free port), fed by hand-made records (no broker)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from extender_payloads import kube_args, node, pod, volcano_predicate, volcano_prioritize
from prometheus_client.parser import text_string_to_metric_families

from clients import SchedulerClient
from clients.extender import ExtenderServer, Scorer
from events import JobEvent, Prediction, WhatIf

T0 = 1_700_000_000.0
LM = "LM (batch size 20)"
ASK = {"aip.io/job-type": LM}

# node -> GPU -> (job types running, what-if for LM as (newcomer_pct, existing_pct)); None: idle
FLEET: dict[str, dict[str, Any]] = {
    # the score is 10 * (1 - cost / 250): node-a's best GPU costs 20 -> 9.2
    "node-a": {"GPU-a1": (["A3C", "GAN"], (40.0, 20.0)), "GPU-a2": (["A3C", "ResNet-18"], (12.0, 8.0))},
    "node-b": {"GPU-b1": None},  # idle -> 10
    "node-c": {"GPU-c1": (["GAN", "Transformer"], (150.0, 50.0))},  # 200 -> 2
}


def feed(client: SchedulerClient) -> None:
    n = 0
    for host, gpus in FLEET.items():
        for gpu, spec in gpus.items():
            types = ["A3C"] if spec is None else spec[0]
            ids = []
            for t in types:
                n += 1
                ids.append(f"j{n}")
                client.on_job_event(JobEvent(ts=T0 - 100, kind="started", job_id=f"j{n}", job_type=t, gpu_uuid=gpu, host=host))
            if spec is None:
                for i in ids:
                    client.on_job_event(JobEvent(ts=T0 - 50, kind="finished", job_id=i, job_type="A3C", gpu_uuid=gpu, host=host))
                continue
            client.update(Prediction(
                ts=T0, gpu_uuid=gpu, environment="v100", job_id=ids[0], job_type=types[0], job_set=types, mode="placement",
                interference_pct=10.0, model="knn", category="all", window_end=T0 - 10,
                what_if=[WhatIf(job_type=LM, newcomer_pct=spec[1][0], existing_pct=spec[1][1])],
            ))  # fmt: skip


@pytest.fixture
def server() -> Iterator[ExtenderServer]:
    client = SchedulerClient(clock=lambda: T0 + 5, history_complete=True)
    feed(client)
    with ExtenderServer(Scorer(client), "127.0.0.1", 0) as srv:
        yield srv


def call(srv: ExtenderServer, path: str, body: Any = None, *, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(srv.url + path, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read().decode()
            return resp.status, json.loads(text) if resp.headers["Content-Type"] == "application/json" else text
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


NODES = ["node-c", "node-a", "node-d", "node-b"]  # node-d: no predictions


@pytest.mark.parametrize("cache_capable", [True, False])
def test_prioritize_answers_one_host_priority_per_node_ranked_by_the_predictions(server: ExtenderServer, cache_capable: bool) -> None:
    code, answer = call(server, "/prioritize", kube_args(pod(ASK), NODES, node_cache_capable=cache_capable))
    assert code == 200
    assert [set(h) for h in answer] == [{"Host", "Score"}] * 4  # HostPriority: Host, Score (no json tags)
    assert [h["Host"] for h in answer] == NODES
    assert all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in answer)
    assert {h["Host"]: h["Score"] for h in answer} == {"node-b": 10, "node-a": 9, "node-d": 5, "node-c": 2}


def test_filter_with_node_names_returns_a_subset_and_failed_nodes(server: ExtenderServer) -> None:
    code, result = call(server, "/filter", kube_args(pod({**ASK, "aip.io/max-slowdown-pct": "50"}), NODES))
    assert code == 200
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert result["NodeNames"] == ["node-a", "node-d", "node-b"] and result["Nodes"] is None
    assert list(result["FailedNodes"]) == ["node-c"] and "GPU-c1" in result["FailedNodes"]["node-c"]
    assert result["FailedAndUnresolvableNodes"] == {} and result["Error"] == ""


def test_filter_with_a_node_list_returns_the_node_objects_it_keeps(server: ExtenderServer) -> None:
    code, result = call(server, "/filter", kube_args(pod({**ASK, "aip.io/max-slowdown-pct": "15"}), NODES, node_cache_capable=False))
    assert code == 200 and result["NodeNames"] is None
    # limit 15: node-a's best GPU has newcomer 12, jobs there 8 -> passes; node-c fails; unknown node-d passes
    assert result["Nodes"]["items"] == [node("node-a"), node("node-d"), node("node-b")]
    assert set(result["FailedNodes"]) == {"node-c"}


def test_without_a_limit_filter_keeps_every_node(server: ExtenderServer) -> None:
    _, result = call(server, "/filter", kube_args(pod(ASK), NODES))
    assert result["NodeNames"] == NODES and result["FailedNodes"] == {}


def metric(srv: ExtenderServer, name: str, **labels: str) -> float:
    _, text = call(srv, "/metrics")
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


@pytest.mark.parametrize(
    ("annotations", "counter", "scores"),
    [
        (None, "aip_extender_pods_without_job_type_total", [5, 5, 5, 5]),
        # no prediction for this type anywhere: neutral, except that an idle GPU is still the best place
        ({"aip.io/job-type": "never-seen"}, "aip_extender_unknown_job_types_total", [5, 5, 5, 10]),
    ],
)
def test_pod_without_or_with_an_unknown_job_type_gets_a_neutral_answer_and_is_counted(
    server: ExtenderServer, annotations: dict[str, str] | None, counter: str, scores: list[int]
) -> None:
    limited = {**(annotations or {}), "aip.io/max-slowdown-pct": "1"}
    code, answer = call(server, "/prioritize", kube_args(pod(annotations), NODES))
    assert code == 200 and [h["Score"] for h in answer] == scores
    _, result = call(server, "/filter", kube_args(pod(limited), NODES))
    assert result["NodeNames"] == NODES and result["FailedNodes"] == {}
    assert metric(server, counter, verb="prioritize") == 1 and metric(server, counter, verb="filter") == 1


def test_nodes_without_predictions_are_counted_and_bad_limits_ignored(server: ExtenderServer) -> None:
    call(server, "/prioritize", kube_args(pod(ASK), ["node-d", "node-x", "node-a"]))
    assert metric(server, "aip_extender_nodes_without_predictions_total", verb="prioritize") == 2
    _, result = call(server, "/filter", kube_args(pod({**ASK, "aip.io/max-slowdown-pct": "lots"}), NODES))
    assert result["NodeNames"] == NODES
    assert metric(server, "aip_extender_bad_annotations_total") == 1


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "must be a JSON object"),
        (json.dumps({"NodeNames": ["a"]}).encode(), "Pod must be a JSON object"),
        (json.dumps({"Pod": pod(ASK)}).encode(), "neither NodeNames nor Nodes"),
        (json.dumps({"Pod": pod(ASK), "NodeNames": "node-a"}).encode(), "NodeNames must be an array"),
        (json.dumps({"Pod": pod(ASK), "Nodes": {"items": [{"metadata": {}}]}}).encode(), "Nodes.items[0] has no metadata.name"),
        (json.dumps({"Pod": {"metadata": {"annotations": ["x"]}}, "NodeNames": []}).encode(), "annotations must be a JSON object"),
    ],
)
@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
def test_malformed_bodies_get_400_with_one_line(server: ExtenderServer, verb: str, body: bytes, says: str) -> None:
    code, text = call(server, verb, raw=body)
    assert code == 400 and says in text
    assert text.endswith("\n") and text.count("\n") == 1


def test_volcano_predicate_and_prioritize(server: ExtenderServer) -> None:
    limited = pod({**ASK, "aip.io/max-slowdown-pct": "50"})
    code, ok = call(server, "/volcano/predicate", volcano_predicate(limited, "node-a"))
    assert code == 200 and ok == {"status": "", "code": 0}  # PredicateResponse: json tags status, code
    _, failed = call(server, "/volcano/predicate", volcano_predicate(limited, "node-c"))
    assert failed["code"] == 2 and "max-slowdown-pct" in failed["status"]  # api.Unschedulable
    code, answer = call(server, "/volcano/prioritize", volcano_prioritize(pod(ASK), NODES))
    assert code == 200 and set(answer) == {"nodeScore", "errorMessage"} and answer["errorMessage"] == ""
    assert answer["nodeScore"] == {"node-c": 20.0, "node-a": 92.0, "node-d": 50.0, "node-b": 100.0}
    code, text = call(server, "/volcano/prioritize", {"task": {"Pod": pod(ASK)}, "nodes": [{"State": {}}]})
    assert code == 400 and "nodes[0] has no Name" in text


def test_score_healthz_metrics_and_unknown_paths(server: ExtenderServer) -> None:
    code, answer = call(server, "/score?job_type=" + urllib.request.quote(LM) + "&nodes=node-a,node-b,node-c")
    assert code == 200 and answer["ranked"] == ["node-b", "node-a", "node-c"]
    best_a = next(n for n in answer["nodes"] if n["node"] == "node-a")
    assert best_a["best_gpu"] == "GPU-a2" and best_a["cost_pct"] == 20.0 and best_a["basis"] == "predicted"
    assert next(n for n in answer["nodes"] if n["node"] == "node-b")["basis"] == "idle"
    _, every = call(server, "/score?job_type=" + urllib.request.quote(LM))
    assert {n["node"] for n in every["nodes"]} == set(FLEET)
    assert call(server, "/score")[0] == 400
    code, health = call(server, "/healthz")
    assert code == 200 and health["status"] == "ok" and health["gpus"] == 4 and health["nodes"] == 3
    assert call(server, "/nope")[0] == 404 and call(server, "/filter")[0] == 405
    assert metric(server, "aip_extender_requests_total", verb="score", code="200") == 2
    assert metric(server, "aip_extender_requests_total", verb="score", code="400") == 1
    assert metric(server, "aip_extender_request_duration_seconds_count", verb="score") == 3


def test_a_node_is_scored_and_filtered_from_its_predicted_gpus() -> None:
    client = SchedulerClient(clock=lambda: T0 + 5, history_complete=True)
    feed(client)
    client.on_job_event(JobEvent(ts=T0, kind="started", job_id="solo", job_type="GAN", gpu_uuid="GPU-c2", host="node-c"))
    scorer = Scorer(client)
    scores = {s.node: (s.score, s.basis, s.gpu) for s in scorer.score_nodes(LM, ["node-c", "node-a"])}
    assert scores == {"node-c": (2, "predicted", "GPU-c1"), "node-a": (9, "predicted", "GPU-a2")}
    limited = pod({**ASK, "aip.io/max-slowdown-pct": "50"})
    passed, failed = scorer.filter_nodes(limited, ["node-c"])  # GPU-c2 (one job, no prediction) does not count
    assert passed == [] and "GPU-c1" in failed["node-c"]


def test_keep_alive_survives_a_refused_request_with_a_body(server: ExtenderServer) -> None:
    import http.client

    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("POST", "/bind", body=json.dumps(kube_args(pod(ASK), NODES)), headers={"Content-Type": "application/json"})
        first = conn.getresponse()
        assert first.status == 404 and first.read().decode().count("\n") == 1
        conn.request("POST", "/prioritize", body=json.dumps(kube_args(pod(ASK), ["node-b"])))  # the same client, next request
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read()) == [{"Host": "node-b", "Score": 10}]
    finally:
        conn.close()


# ------------------------------------------------------------------ kube-scheduler's own bodies
def test_kube_schedulers_own_extender_args_are_read_and_answered_in_its_shapes(server: ExtenderServer) -> None:
    """The ExtenderArgs of kube-scheduler's types_test.go, verbatim (its pod has no job type: neutral), and as that
    test also decodes it, lowercased (Go's encoding/json matches field names case-insensitively)."""
    from extender_payloads import EXTENDER_ARGS_JSON, EXTENDER_FILTER_RESULT_JSON, HOST_PRIORITY_JSON

    for body in (EXTENDER_ARGS_JSON, EXTENDER_ARGS_JSON.lower()):
        code, answer = call(server, "/prioritize", raw=body.encode())
        assert code == 200 and answer == [{"Host": "node1", "Score": 5}]  # NodeNames, when both are given
        assert [list(h) for h in answer] == [list(json.loads(HOST_PRIORITY_JSON))]  # HostPriority's keys, in order
        code, result = call(server, "/filter", raw=body.encode())
        assert code == 200 and list(result) == list(json.loads(EXTENDER_FILTER_RESULT_JSON))  # ExtenderFilterResult's
        assert result["NodeNames"] == ["node1"] and result["FailedNodes"] == {} and result["Error"] == ""


# ------------------------------------------------------------------ the score's full scale
# cost of each node's best GPU for LM: node-a 20 (GPU-a2: 12 + 8), node-b 0 (idle), node-c 200 (150 + 50)
# score = 10 * (1 - min(cost, full scale) / full scale), rounded half up; Volcano gets it x 10 unrounded
FULL_SCALE_CASES = {
    "100": ({"node-a": 8, "node-b": 10, "node-c": 0}, {"node-a": 80.0, "node-b": 100.0, "node-c": 0.0}),
    "250": ({"node-a": 9, "node-b": 10, "node-c": 2}, {"node-a": 92.0, "node-b": 100.0, "node-c": 20.0}),
    "400": ({"node-a": 10, "node-b": 10, "node-c": 5}, {"node-a": 95.0, "node-b": 100.0, "node-c": 50.0}),
    "1000": ({"node-a": 10, "node-b": 10, "node-c": 8}, {"node-a": 98.0, "node-b": 100.0, "node-c": 80.0}),
}


@pytest.mark.parametrize("full_scale", sorted(FULL_SCALE_CASES))
def test_aip_extender_full_scale_pct_sets_the_cost_that_scores_0(full_scale: str) -> None:
    """``AIP_EXTENDER_FULL_SCALE_PCT`` (read by Settings, as ``aip extender`` reads it) moves every score."""
    from config import Settings

    settings = Settings.from_env({"AIP_EXTENDER_FULL_SCALE_PCT": full_scale})
    assert settings.extender_full_scale_pct == float(full_scale)
    client = SchedulerClient(clock=lambda: T0 + 5, history_complete=True)
    feed(client)
    kube, volcano = FULL_SCALE_CASES[full_scale]
    with ExtenderServer(Scorer(client, full_scale_pct=settings.extender_full_scale_pct), "127.0.0.1", 0) as srv:
        _, answer = call(srv, "/prioritize", kube_args(pod(ASK), sorted(kube)))
        assert {h["Host"]: h["Score"] for h in answer} == kube
        _, vp = call(srv, "/volcano/prioritize", volcano_prioritize(pod(ASK), sorted(volcano)))
        assert vp["nodeScore"] == pytest.approx(volcano)


@pytest.mark.parametrize("bad", ["0", "-10"])
def test_a_full_scale_that_is_not_positive_is_refused(bad: str) -> None:
    from config import Settings

    full_scale = Settings.from_env({"AIP_EXTENDER_FULL_SCALE_PCT": bad}).extender_full_scale_pct
    assert full_scale == float(bad)  # a number the settings take: the scorer is what refuses it
    with pytest.raises(ValueError, match="full_scale_pct"):
        Scorer(SchedulerClient(), full_scale_pct=full_scale)


# ------------------------------------------------------------------ --max-age
def test_predictions_older_than_max_age_are_no_longer_used() -> None:
    """``aip extender --max-age S`` (``SchedulerClient(max_age_s=S)``): a node whose predictions are older than S
    seconds is scored neutral and passes every filter, until a new prediction comes."""
    now = [T0 + 5]
    client = SchedulerClient(clock=lambda: now[0], history_complete=True, max_age_s=60.0)
    feed(client)  # predictions at T0
    limited = pod({**ASK, "aip.io/max-slowdown-pct": "50"})
    with ExtenderServer(Scorer(client), "127.0.0.1", 0) as srv:

        def scores() -> dict[str, int]:
            return {h["Host"]: h["Score"] for h in call(srv, "/prioritize", kube_args(pod(ASK), NODES))[1]}

        def failed() -> list[str]:
            return sorted(call(srv, "/filter", kube_args(limited, NODES))[1]["FailedNodes"])

        assert scores() == {"node-a": 9, "node-b": 10, "node-c": 2, "node-d": 5} and failed() == ["node-c"]
        now[0] = T0 + 60.0  # 60 s old: still used
        assert scores() == {"node-a": 9, "node-b": 10, "node-c": 2, "node-d": 5} and failed() == ["node-c"]
        now[0] = T0 + 60.5  # older than 60 s: node-a and node-c neutral; node-b is idle by its lifecycle, not a prediction
        assert scores() == {"node-a": 5, "node-b": 10, "node-c": 5, "node-d": 5} and failed() == []
        assert call(srv, "/healthz")[1]["job_types"] == 0
        client.update(Prediction(
            ts=T0 + 60.0, gpu_uuid="GPU-c1", environment="v100", job_id="j6", job_type="GAN", job_set=["GAN", "Transformer"],
            mode="placement", interference_pct=10.0, model="knn", category="all", window_end=T0 + 50,
            what_if=[WhatIf(job_type=LM, newcomer_pct=150.0, existing_pct=50.0)],
        ))  # fmt: skip
        assert scores()["node-c"] == 2 and failed() == ["node-c"]  # fresh again


def raw_post(srv: ExtenderServer, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, str, str | None]:
    """POST with exactly ``headers`` (no Content-Length unless given): status, body text, its Connection header."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(srv.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), resp.getheader("Connection")
    finally:
        conn.close()


@pytest.mark.parametrize("length", [None, "ten"])
def test_a_body_without_a_length_gets_411_and_the_connection_closes(server: ExtenderServer, length: str | None) -> None:
    headers = {"Content-Type": "application/json"} | ({} if length is None else {"Content-Length": length})
    assert raw_post(server, "/filter", headers) == (411, "a Content-Length header is required\n", "close")


def test_a_body_over_the_limit_gets_413_unread(server: ExtenderServer) -> None:
    from clients.extender import MAX_BODY_BYTES

    too_big = MAX_BODY_BYTES + 1
    code, text, connection = raw_post(server, "/prioritize", {"Content-Length": str(too_big)}, b"{")  # the rest never sent
    assert (code, text, connection) == (413, f"the body is {too_big} bytes; at most {MAX_BODY_BYTES} are read\n", "close")
    assert metric(server, "aip_extender_requests_total", verb="prioritize", code="413") == 1


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "bad request: the body is not JSON: Expecting value: line 1 column 1 (char 0)\n"),
        (
            b'{"Pod": "\xff"}',
            "bad request: the body is not JSON: 'utf-8' codec can't decode byte 0xff in position 9: invalid start byte\n",
        ),
    ],
)
def test_an_empty_or_non_utf8_body_gets_400_with_one_line(server: ExtenderServer, body: bytes, says: str) -> None:
    assert raw_post(server, "/filter", {"Content-Length": str(len(body))}, body)[:2] == (400, says)
