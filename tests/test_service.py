"""The plan service through FastAPI's TestClient: plans, dedup, the store across restarts,
estimate/validate, and every error class with the CLI's field-level problems."""

from __future__ import annotations

import copy
import json
import time

import pytest
from fastapi.testclient import TestClient

import cost_models
from autoshard.client import Client, ServiceError
from autoshard.errors import InputError
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import verify
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.plan import plan_from_json
from service.app import create_app
from service.inputs import canonical_plan_request, request_key
from service.schemas import PlanRequest
from service.store import Store
from support.service import MLP, OPTIONS, error_of, plan_document_of, settings_for


def test_plan_is_the_library_plan_and_prices_the_same_through_estimate(client):
    job = client.submit(MLP, "dp=2,tp=2", "dgx-h100", options=OPTIONS, wait_s=60)
    assert job.status == "done" and job.error is None
    document = job.plan
    assert document["format"] == "autoshard.plan/v1" and set(document["ops"]) == {"fc1", "fc2"}

    mesh = Mesh.parse("dp=2,tp=2")
    graph = graph_from_json(MLP, mesh)
    hw = bind_hardware("dgx-h100", mesh)
    direct = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=2, workers=1, seed=0))
    assert document["solver"]["objective_ps"] == direct.solver["objective_ps"]
    plan_from_json(document, graph, mesh)  # a valid plan for the graph
    # small plans are simulated by default, with the collectives the plan priced
    verification = document["verification"]
    assert verification["status"] == "passed" and verification["values_checked"] >= len(document["ops"])

    estimate = client.estimate(MLP, "dp=2,tp=2", document, "dgx-h100")
    assert estimate["totals"] == document["totals"]


def test_identical_requests_share_one_job_and_different_ones_do_not(client):
    first = client.submit(MLP, "dp=2,tp=2", options=OPTIONS, wait_s=60)
    # the same request spelt differently: mesh as an object, attributes re-ordered
    same = client.submit(copy.deepcopy(MLP), {"axes": [{"name": "dp", "size": 2}, {"name": "tp", "size": 2}]},
                         options={"seed": 0, "time_limit_s": 2.0})
    assert same.id == first.id and same.status == "done" and same.plan == first.plan
    other_seed = client.submit(MLP, "dp=2,tp=2", options=OPTIONS | {"seed": 1})
    other_mesh = client.submit(MLP, "tp=2,dp=2", options=OPTIONS)
    assert len({first.id, other_seed.id, other_mesh.id}) == 3
    for job in (other_seed, other_mesh):
        client.cancel(job.id)


def test_wait_zero_answers_202_with_location_then_the_plan(http):
    response = http.post("/v1/plans", json={"graph": MLP, "mesh": "dp=4", "options": OPTIONS})
    assert response.status_code == 202
    job = Client(http=http).poll(response.json()["id"], timeout_s=60)
    assert response.headers["location"] == f"/v1/plans/{job.id}"
    assert job.status == "done" and job.progress["phase"] == "done"
    again = http.post("/v1/plans?wait=0", json={"graph": MLP, "mesh": "dp=4", "options": OPTIONS})
    assert again.status_code == 200 and again.json()["id"] == job.id


def test_plans_survive_a_restart_and_unfinished_jobs_are_marked_interrupted(tmp_path):
    settings = settings_for(tmp_path)
    with TestClient(create_app(settings)) as http:
        done = Client(http=http).submit(MLP, "dp=2", options=OPTIONS, wait_s=60)
    assert done.status == "done"
    # a job a crashed process left solving
    store = Store(settings.db)
    orphan = store.create("some-key", {"options": {"emit": [], "dialect": "mesh"}})
    store.start(orphan.id)
    store.close()
    with TestClient(create_app(settings)) as http:
        client = Client(http=http)
        assert client.get(done.id).plan == done.plan
        interrupted = client.get(orphan.id)
        assert interrupted.status == "interrupted" and interrupted.plan is None
        assert interrupted.error["kind"] == "interrupted" and "restart" in interrupted.error["message"]
        with pytest.raises(ServiceError) as no_ir:
            client.ir(orphan.id)
        assert no_ir.value.status == 409 and "interrupted" in str(no_ir.value)


def test_jobs_left_queued_by_a_stopped_service_run_after_its_restart(tmp_path):
    settings = settings_for(tmp_path)
    body = PlanRequest(graph=MLP, mesh="dp=2", options=OPTIONS).model_dump(mode="json")  # as the route reads it
    canonical = canonical_plan_request(body, settings)
    store = Store(settings.db)
    waiting = store.create(request_key(canonical), canonical)  # queued when the service stopped
    store.close()
    with TestClient(create_app(settings)) as http:
        client = Client(http=http)
        deadline = time.monotonic() + 60
        while client.get(waiting.id).status == "queued" or client.get(waiting.id).status == "solving":
            assert time.monotonic() < deadline, "the queued job did not run after the restart"
            time.sleep(0.1)
        resumed = client.get(waiting.id)
        assert resumed.status == "done" and resumed.plan["solver"]["status"] in ("optimal", "feasible")


def test_cancelling_a_finished_plan_is_a_conflict_and_unknown_ids_are_404(client):
    job = client.submit(MLP, "dp=2", options=OPTIONS, wait_s=60)
    with pytest.raises(ServiceError) as conflict:
        client.cancel(job.id)
    assert conflict.value.status == 409 and "already done" in str(conflict.value)
    for call in (client.get, client.cancel, client.ir):
        with pytest.raises(ServiceError) as missing:
            call("no-such-plan")
        assert missing.value.status == 404 and missing.value.kind == "not_found"


def test_graph_problems_are_the_cli_problems_under_graph(http):
    broken = copy.deepcopy(MLP)
    broken["ops"][0]["kind"] = "matmull"
    broken["tensors"]["y"]["shape"] = [8, 15]
    broken["tensors"]["h"]["dtype"] = "f33"
    with pytest.raises(InputError) as direct:
        graph_from_json(broken)
    response = http.post("/v1/plans", json={"graph": broken, "mesh": "dp=2"})
    assert response.status_code == 422
    error = error_of(response)
    assert error["kind"] == "input"
    assert error["problems"] == [{"where": "/graph" + p.where, "message": p.message} for p in direct.value.problems]
    assert {p["where"] for p in error["problems"]} >= {"/graph/ops/0/kind", "/graph/tensors/h/dtype"}


@pytest.mark.parametrize("body, where, words", [
    ({"graph": MLP, "mesh": "dp=2,tp"}, "/mesh", "NAME=SIZE"),
    ({"graph": MLP, "mesh": "dp=65536,tp=65536"}, "/mesh", "over the limit of 1048576"),
    ({"graph": MLP, "mesh": "dp=2", "options": {"seed": 2 ** 64}}, "/options/seed", ""),
    ({"graph": MLP | {"tensors": MLP["tensors"] | {"x": {"shape": [10 ** 30, 16], "dtype": "f32", "role": "input"}}},
      "mesh": "dp=2"}, "/graph/tensors/x/shape", "over the limit of 2**50"),
    ({"graph": MLP, "mesh": {"axes": [{"name": "dp", "size": 0}]}}, "/mesh/axes/0/size", "greater than or equal to 1"),
    ({"graph": MLP, "mesh": "dp=2", "topology": "/etc/passwd"}, "/topology", "unknown topology"),
    ({"graph": MLP, "mesh": "dp=2", "topology": {"name": "mine"}}, "/topology/kind", ""),
    ({"graph": MLP, "mesh": "dp=2", "options": {"time_limit_s": 3600}}, "/options/time_limit_s", "at most 60 s"),
    ({"graph": MLP, "mesh": "dp=2", "options": {"time_limit_s": -1}}, "/options/time_limit_s", "greater than 0"),
    ({"graph": MLP, "mesh": "dp=2", "options": {"emit": ["llvm"]}}, "/options/emit/0", "annotated"),
    ({"graph": MLP, "mesh": "dp=2", "options": {"colour": "red"}}, "/options/colour", "Extra inputs"),
    ({"graph": MLP, "mesh": "dp=2", "topology_options": {"slice": "4by4"}}, "/topology_options/slice", "4x4x4"),
    ({"mesh": "dp=2"}, "/graph", "Field required"),
    ({"graph": {"format": "autoshard.graph/v0"}, "mesh": "dp=2"}, "/graph/format", "autoshard.graph/v1"),
])
def test_request_problems_point_at_the_field(http, body, where, words):
    response = http.post("/v1/plans", json=body)
    assert response.status_code == 422
    problems = error_of(response)["problems"]
    assert any(p["where"] == where and words in p["message"] for p in problems), problems


def test_the_service_device_limit_is_its_own_setting(tmp_path):
    with TestClient(create_app(settings_for(tmp_path, max_devices=64))) as http:
        for route, body in (("/v1/plans", {"graph": MLP, "mesh": "dp=128"}),
                            ("/v1/validate", {"graph": MLP, "mesh": "dp=16,tp=8"}),
                            ("/v1/estimate", {"graph": MLP, "mesh": "dp=128", "plan": {}})):
            response = http.post(route, json=body)
            assert response.status_code == 422
            assert error_of(response)["problems"] == [
                {"where": "/mesh", "message": "128 devices; this service accepts meshes of at most 64"}]
        assert http.post("/v1/validate", json={"graph": MLP, "mesh": "dp=64"}).status_code == 200


def test_wait_out_of_range_is_a_query_problem(http):
    response = http.post("/v1/plans?wait=-1", json={"graph": MLP, "mesh": "dp=2"})
    assert response.status_code == 422
    assert error_of(response)["problems"][0]["where"] == "?wait"


@pytest.mark.parametrize("body", [b'{"graph": ', b'{"graph": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                                  b'{"graph": "\xff"}'])
def test_a_body_that_is_not_json_is_400(http, body):
    """Cut short, nested too deeply or not UTF-8: a 400, never a server error."""
    response = http.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and error_of(response)["kind"] == "malformed"


def test_size_limits_are_413(http):
    padded = copy.deepcopy(MLP) | {"name": "x" * 30_000}
    response = http.post("/v1/plans", json={"graph": padded, "mesh": "dp=2"})
    assert response.status_code == 413 and error_of(response)["kind"] == "too_large"

    def chunks():
        yield b'{"graph": {"name": "'
        for _ in range(40):
            yield b"x" * 1000
        yield b'"}, "mesh": "dp=2"}'

    response = http.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "at most 20000 bytes" in error_of(response)["message"]

    wide = copy.deepcopy(MLP)
    for i in range(8):
        wide["tensors"][f"t{i}"] = {"shape": [8, 16], "dtype": "f32"}
        wide["ops"].append({"name": f"copy{i}", "kind": "relu", "inputs": ["y"], "outputs": [f"t{i}"]})
    response = http.post("/v1/plans", json={"graph": wide, "mesh": "dp=2"})
    assert response.status_code == 413
    assert [p["where"] for p in error_of(response)["problems"]] == ["/graph/ops"]


def test_estimate_and_validate_report_plan_problems_under_plan(client):
    bad_plan = plan_document_of(MLP, "dp=2")
    bad_plan["ops"]["fc1"]["option"] = [["dp"], ["nope"], []]
    with pytest.raises(ServiceError) as estimate:
        client.estimate(MLP, "dp=2", bad_plan)
    with pytest.raises(ServiceError) as validate:
        client.validate(MLP, "dp=2", bad_plan)
    for error in (estimate.value, validate.value):
        assert error.status == 422
        assert error.problems and all(p.where.startswith("/plan/ops/fc1") for p in error.problems)
        assert any("nope" in p.message for p in error.problems)
    with pytest.raises(ServiceError) as no_mesh:
        client.validate(MLP, plan={"ops": {}})
    assert [p.where for p in no_mesh.value.problems] == ["/mesh"]


def test_validate_summarises_a_valid_graph_and_plan(client):
    replicated = plan_document_of(MLP, "dp=2,tp=2", {"fc1": [[], [], []], "fc2": [[], [], []]})
    result = client.validate(MLP, "dp=2,tp=2", replicated)
    assert result["valid"] and result["plan_checked"] and (result["ops"], result["tensors"]) == (2, 5)
    assert result["summary"].startswith("mlp: 2 ops, 5 tensors")


def test_estimate_of_a_replicated_plan_has_no_communication(client):
    replicated = plan_document_of(MLP, "dp=2,tp=2", {"fc1": [[], [], []], "fc2": [[], [], []]})
    totals = client.estimate(MLP, "dp=2,tp=2", replicated)["totals"]
    assert totals["communication_bytes"] == 0 and totals["communication_s"] == 0
    # every device holds everything: 5 f32 tensors of 128, 512, 512, 256 and 128 elements
    assert totals["peak_memory_bytes_per_device"] <= 4 * (128 + 512 + 512 + 256 + 128)


def test_topologies_health_and_openapi(http, client):
    assert [t["name"] for t in client.topologies()] == cost_models.list_profiles()
    assert http.get("/healthz").json() == {"status": "ok", "jobs": {}}
    assert http.post("/v1/plans?wait=30", json={"graph": MLP, "mesh": "dp=4", "options": OPTIONS}).status_code == 200
    assert http.get("/healthz").json() == {"status": "ok", "jobs": {"done": 1}}
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "jobs": {"done": 1}}
    spec = http.get("/openapi.json").json()
    assert {"/v1/plans", "/v1/plans/{plan_id}", "/v1/plans/{plan_id}/ir", "/v1/estimate", "/v1/validate",
            "/v1/topologies"} <= set(spec["paths"])
    assert http.get("/docs").status_code == 200
    assert json.loads(http.get("/v1/nowhere").text)["error"]["kind"] == "not_found"


def test_ir_emitted_with_the_plan_and_on_demand_passes_the_mlir_verifiers(client):
    job = client.submit(MLP, "dp=2,tp=2", options=OPTIONS | {"emit": ["annotated", "partitioned"], "dialect": "shard"},
                        wait_s=60)
    assert job.status == "done" and set(job.ir) == {"annotated", "partitioned"}
    assert client.ir(job.id, "annotated") == job.ir["annotated"]  # the plan's dialect by default
    assert client.ir(job.id, "partitioned", "shard") == job.ir["partitioned"]
    texts = {(stage, dialect, arguments): client.ir(job.id, stage, dialect, arguments)
             for stage in ("annotated", "partitioned") for dialect in ("mesh", "shard")
             for arguments in ("local", "global")}
    assert texts[("annotated", "mesh", "local")] == texts[("annotated", "mesh", "global")]
    assert texts[("partitioned", "shard", "local")] != texts[("partitioned", "shard", "global")]
    for (stage, dialect, arguments), text in texts.items():
        verify(text, dialect)



@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_declared_json_is_refused_with_415(http, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = http.post("/v1/validate", content=b'{"graph": {}}', headers=headers)
    assert response.status_code == 415
    body = response.json()
    assert body["error"]["kind"] == "unsupported_media_type" and (content_type or "no content type") in \
        body["error"]["message"]
    assert http.post("/v1/validate", json={"graph": {}}).status_code == 422  # JSON reaches the validators


def test_a_body_repeating_a_key_is_refused_naming_the_key(http):
    body = b'{"graph": {"format": "autoshard.graph/v1", "tensors": {}, "ops": [], "name": "a", "name": "b"}}'
    for route in ("/v1/validate", "/v1/plans", "/v1/estimate"):
        response = http.post(route, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, route
        assert "'name' appears twice" in error_of(response)["message"]


def test_estimate_and_validate_refuse_a_plan_made_for_another_mesh(client):
    job = client.submit(MLP, "dp=2,tp=2", options=OPTIONS, wait_s=60)
    assert client.estimate(MLP, "dp=2,tp=2", job.plan)["totals"] == job.plan["totals"]
    for call in (client.estimate, client.validate):
        with pytest.raises(ServiceError) as other:
            call(MLP, "dp=4", job.plan)
        assert other.value.status == 422
        assert [(p.where, p.message) for p in other.value.problems] == [
            ("/plan/mesh", "the plan was made for mesh dp=2,tp=2, not dp=4")]


def test_the_openapi_schema_states_the_graph_document_and_that_a_plan_needs_a_mesh(http):
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    for request in ("PlanRequest", "EstimateRequest", "ValidateRequest"):
        graph = schemas[request]["properties"]["graph"]
        assert graph["properties"]["format"]["const"] == "autoshard.graph/v1"
        assert set(graph["required"]) == {"format", "tensors", "ops"}
        tensor = graph["properties"]["tensors"]["additionalProperties"]
        assert "bf16" in tensor["properties"]["dtype"]["enum"] and tensor["additionalProperties"] is False
        assert "matmul" in graph["properties"]["ops"]["items"]["properties"]["kind"]["enum"]
        assert "$ref" not in json.dumps(graph)
    assert schemas["ValidateRequest"]["dependentRequired"] == {"plan": ["mesh"]}
    # the route holds to it, even for a plan of null
    response = http.post("/v1/validate", json={"graph": MLP, "plan": None})
    assert response.status_code == 422 and error_of(response)["problems"][0]["where"] == "/mesh"


def test_a_plan_for_microbatches_is_made_and_priced_as_microbatches(tmp_path):
    from autoshard.models.mlp import MLPConfig, mlp

    graph = mlp(MLPConfig(layers=1, batch=4, hidden=8, ffn=8, dtype="f32"), training=True)
    with TestClient(create_app(settings_for(tmp_path, max_body_bytes=400_000, max_ops=100, max_tensors=100))) as http:
        client = Client(http=http)
        job = client.submit(graph, "dp=2", "dgx-h100", options=OPTIONS | {"microbatches": 2}, wait_s=60)
        assert job.status == "done" and job.plan["microbatches"] == 2
        assert job.plan["verification"]["status"] == "passed"
        assert client.estimate(graph, "dp=2", job.plan)["totals"] == job.plan["totals"]
        body = {"graph": graph, "mesh": "dp=2", "topology": "dgx-h100", "plan": job.plan, "microbatches": 3}
        response = http.post("/v1/estimate", json=body)
    assert response.status_code == 422
    assert {p["where"] for p in error_of(response)["problems"]} == {"/graph/tensors/x/batch_dim",
                                                                      "/graph/tensors/labels/batch_dim"}


def test_a_pipelined_plan_is_the_library_one_with_its_pipeline_section_and_wrong_settings_point_at_their_field(
        tmp_path):
    from autoshard.models.gpt import GPTConfig, gpt
    from autoshard.planning.pipeline_plan import PipelineSettings, pipeline_mesh, plan_pipeline

    graph = gpt(GPTConfig(layers=4, hidden=64, heads=4, seq=16, batch=8, vocab=256), training=True)
    options = {"deterministic": True, "microbatches": 4, "verify": "always",
               "pipeline": {"stages": 2, "schedule": "interleaved:2"}}
    with TestClient(create_app(settings_for(tmp_path, max_body_bytes=4_000_000, max_ops=5000,
                                            max_tensors=5000))) as http:
        client = Client(http=http)
        job = client.submit(graph, "dp=2", "dgx-h100", options=options, wait_s=300)
        assert job.status == "done", job.error
        section = job.plan["pipeline"]
        assert (section["stage_count"], section["virtual_stages_per_stage"], section["microbatches"]) == (2, 2, 4)
        assert [stage["devices"] for stage in section["stages"]] == [[0, 1], [2, 3]]
        assert job.plan["verification"]["status"] == "passed"
        mesh = Mesh.parse("dp=2")
        direct = plan_pipeline(graph_from_json(graph, mesh), mesh, bind_hardware("dgx-h100", pipeline_mesh(mesh, 2)),
                               SolveSettings(deterministic=True, microbatches=4), PipelineSettings(2, "interleaved", 2))
        assert section["step_s"] == direct.timeline.step_s
        priced = client.estimate(graph, "dp=2", job.plan, "dgx-h100")
        assert priced["pipeline"]["step_s"] == pytest.approx(section["step_s"], rel=1e-12)
        assert [s["memory"] for s in priced["pipeline"]["stages"]] == [s["memory"] for s in section["stages"]]
        wrong = {"/options/pipeline/stages": {"pipeline": {"stages": 5}},
                 "/options/pipeline/schedule": {"pipeline": {"stages": 2, "schedule": "interleaved:1"}},
                 "/options/layer_once": {"pipeline": {"stages": 2}, "layer_once": True}}
        for where, given in wrong.items():
            response = http.post("/v1/plans", json={"graph": graph, "mesh": "dp=2", "topology": "dgx-h100",
                                                    "options": given})
            assert response.status_code == 422 and where in {p["where"] for p in error_of(response)["problems"]}, \
                (where, response.json())


def test_a_recomputed_plan_records_it_and_reads_back_onto_the_graph_it_was_asked_for(tmp_path):
    from autoshard.models.gpt import GPTConfig, gpt

    graph = gpt(GPTConfig(layers=2, hidden=32, heads=2, seq=16, batch=4, vocab=64, style="megatron"), training=True)
    with TestClient(create_app(settings_for(tmp_path, max_body_bytes=4_000_000, max_ops=5000,
                                            max_tensors=5000))) as http:
        client = Client(http=http)
        job = client.submit(graph, "dp=2", "dgx-h100", options=OPTIONS | {"recompute": "selective", "verify": "always"},
                            wait_s=120)
        assert job.status == "done", job.error
        assert job.plan["recompute"] == "selective" and job.plan["verification"]["status"] == "passed"
        copies = {name for name in job.plan["ops"] if name.startswith("recompute.")}
        assert {"recompute.layer0.attn.softmax", "recompute.layer1.attn.softmax"} <= copies
        priced = client.estimate(graph, "dp=2", job.plan, "dgx-h100")  # the graph as the user sent it
        assert priced["totals"] == job.plan["totals"]
        assert http.post("/v1/validate", json={"graph": graph, "mesh": "dp=2", "plan": job.plan}).status_code == 200
        forward = gpt(GPTConfig(layers=1, hidden=32, heads=2, seq=16, batch=4, vocab=64))
        for given, where in (({"recompute": "full"}, "/options/recompute"), ({"recompute": "some"}, "/options/recompute")):
            response = http.post("/v1/plans", json={"graph": forward, "mesh": "dp=2", "topology": "dgx-h100",
                                                    "options": given})
            assert response.status_code == 422 and where in {p["where"] for p in error_of(response)["problems"]}, \
                response.json()
