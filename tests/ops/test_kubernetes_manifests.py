"""config/kubernetes, checked statically (no cluster here): every manifest parses and is listed in the
kustomization; ports, probe paths, drain timings, resources, the settings file, the API-key Secret, the
scrape config, the HPA's metric and the endpoint picker's metric names agree with the code."""

from __future__ import annotations

import re

import msgspec
import pytest
import tomllib
import yaml

from inferd.config import Settings
from tests.ops.promql import ROOT, RULES, exported_names, rendered_metrics

K8S = ROOT / "config" / "kubernetes"
# SmolLM2-135M-Instruct Q4_1 (the default model) is a 98 MB file; its weights are held once, repacked.
DEFAULT_MODEL_WEIGHTS_MIB = 100
# Python, tokenizer, scratch buffers (360 MiB measured serving with the KV cache idle, weights included)
RUNTIME_MIB = 300


def quantity_mib(q: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi)", q)
    assert m, q
    return float(m.group(1)) * units[m.group(2)]


@pytest.fixture(scope="module")
def docs() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["apiVersion"] and doc["metadata"]["name"], path
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, f"{key} twice"
            out[key] = doc
    return out


@pytest.fixture(scope="module")
def settings(docs) -> Settings:
    text = docs["ConfigMap", "inferd-config"]["data"]["inferd.toml"]
    return msgspec.convert(tomllib.loads(text), Settings)   # the daemon's own validation


@pytest.fixture(scope="module")
def pod(docs) -> dict:
    return docs["Deployment", "inferd"]["spec"]["template"]


@pytest.fixture(scope="module")
def container(pod) -> dict:
    (c,) = pod["spec"]["containers"]
    return c


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_kustomization_lists_every_manifest():
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def test_settings_file_is_valid_and_the_container_reads_it(settings, pod, container):
    assert settings.host == "0.0.0.0"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    config_path = mounts["config"]["mountPath"]
    assert container["args"] == ["serve", "--config", config_path]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "inferd-config"
    # the model cache is writable (the root filesystem is not)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert settings.model_cache_dir.startswith(mounts["cache"]["mountPath"] + "/")


def test_api_keys_come_from_the_secret(settings, pod, container):
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["api-keys"]["secret"]["secretName"] == "inferd-api-keys"
    assert settings.api_key_file.startswith(mounts["api-keys"]["mountPath"] + "/")
    assert settings.api_keys == []   # no key in the ConfigMap itself


def test_ports_and_probe_paths_match_the_server(settings, container):
    from inferd.server.app import create_app
    routes = {r.resource.canonical for r in create_app(settings).router.routes() if r.method == "GET"}
    (port,) = container["ports"]
    assert port == {"name": "http", "containerPort": settings.port, "protocol": "TCP"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] == "http" and get["path"] == "/health" and get["path"] in routes, probe
    assert "/metrics" in routes


def test_drain_fits_the_grace_period_and_liveness_does_not_cut_it(settings, pod, container):
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = settings.drain_delay_s + settings.drain_timeout_s
    assert pod["spec"]["terminationGracePeriodSeconds"] >= pre_stop + drain + 5
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > drain
    start = container["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 300   # room to download the model
    assert container["readinessProbe"]["failureThreshold"] == 1        # leave the endpoints at the first 503


def test_resources_are_sized_from_the_model_and_the_threads(settings, container):
    res = container["resources"]
    assert res["requests"] == res["limits"]   # Guaranteed QoS: whole CPUs, no memory overcommit
    assert int(res["limits"]["cpu"]) == settings.threads
    need = DEFAULT_MODEL_WEIGHTS_MIB + settings.kv_cache_mib + RUNTIME_MIB
    assert settings.model == "smollm2-135m-instruct"
    assert need <= quantity_mib(res["limits"]["memory"]) <= 2 * need


def test_service_and_pod_monitor_reach_the_pods(docs, pod, settings):
    labels = pod["metadata"]["labels"]
    svc = docs["Service", "inferd"]["spec"]
    assert selects(svc["selector"], labels)
    assert svc["ports"] == [{"name": "http", "port": settings.port, "targetPort": "http", "protocol": "TCP"}]
    monitor = docs["PodMonitor", "inferd"]
    assert selects(monitor["spec"]["selector"]["matchLabels"], labels)
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    assert monitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    # the operator names the job <namespace>/<PodMonitor name>: InferdTargetDown must match it
    target_down = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                       if r.get("alert") == "InferdTargetDown")
    pattern = re.search(r'job=~"([^"]+)"', target_down["expr"]).group(1)
    assert re.fullmatch(pattern, f"inferd/{monitor['metadata']['name']}")


def test_prometheus_rule_carries_the_same_rules(docs):
    assert docs["PrometheusRule", "inferd"]["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_hpa_scales_on_the_queue_through_the_adapter(docs):
    hpa = docs["HorizontalPodAutoscaler", "inferd"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "inferd"}
    (metric,) = hpa["metrics"]
    adapter = yaml.safe_load(docs["ConfigMap", "inferd-prometheus-adapter-rules"]["data"]["config.yaml"])
    (rule,) = adapter["rules"]
    series = re.match(r"[a-zA-Z_:][\w:]*", rule["seriesQuery"]).group(0)
    assert series == "inferd:num_requests_waiting" and series in exported_names(rendered_metrics())
    exposed = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), series)
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == exposed
    assert hpa["minReplicas"] >= 2   # a rolling restart always leaves one pod serving


def test_inference_pool_and_endpoint_picker_use_our_ports_and_metric_names(docs, pod, settings):
    pool = docs["InferencePool", "inferd"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert selects(pool["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert pool["spec"]["targetPorts"] == [{"number": settings.port}]
    ref = pool["spec"]["endpointPickerRef"]
    epp_svc = docs["Service", ref["name"]]["spec"]
    assert ref["port"]["number"] in [p["port"] for p in epp_svc["ports"]]
    epp = docs["Deployment", ref["name"]]["spec"]["template"]
    assert selects(epp_svc["selector"], epp["metadata"]["labels"])
    (c,) = epp["spec"]["containers"]
    flags = dict(a[2:].split("=", 1) for a in c["args"])
    assert flags["pool-name"] == pool["metadata"]["name"]
    assert flags["model-server-metrics-path"] == "/metrics"
    exported = exported_names(rendered_metrics())
    # no metric flag: the picker's defaults (vLLM's names, older and newer) are all exported
    assert not [f for f in flags if f.endswith("-metric")]
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info", "vllm:cache_config_info"} <= exported
    config = yaml.safe_load(docs["ConfigMap", "inferd-epp-config"]["data"]["epp.yaml"])
    scorers = {p["pluginRef"] for p in config["schedulingProfiles"][0]["plugins"]}
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= scorers
    assert scorers <= {p["type"] for p in config["plugins"]}
    mounted = {m["mountPath"] for m in c["volumeMounts"]}
    assert flags["config-file"].rsplit("/", 1)[0] in mounted
    role = docs["Role", "inferd-epp"]
    assert any("inferencepools" in r["resources"] for r in role["rules"])
    assert epp["spec"]["serviceAccountName"] == "inferd-epp"


def test_http_route_sends_the_api_to_the_pool(docs):
    (rule,) = docs["HTTPRoute", "inferd"]["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "inferd"}]
    assert rule["matches"][0]["path"]["value"] == "/v1"


def test_the_many_models_overlay_mounts_the_folder_its_settings_serve():
    overlay = K8S / "many-models"
    k = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert k["resources"] == ["..", "models-pvc.yaml"]
    assert sorted(p["path"] for p in k["patches"]) == ["configmap.yaml", "deployment.yaml"]
    assert sorted(p.name for p in overlay.glob("*.yaml")) == sorted(
        ["kustomization.yaml", "models-pvc.yaml", *(p["path"] for p in k["patches"])])
    text = yaml.safe_load((overlay / "configmap.yaml").read_text())["data"]["inferd.toml"]
    s = msgspec.convert(tomllib.loads(text), Settings)
    assert s.many_models and s.models_dir == "/models"
    patch = yaml.safe_load((overlay / "deployment.yaml").read_text())
    (c,) = patch["spec"]["template"]["spec"]["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "models")
    assert mount == {"name": "models", "mountPath": s.models_dir, "readOnly": True}
    (volume,) = patch["spec"]["template"]["spec"]["volumes"]
    pvc = yaml.safe_load((overlay / "models-pvc.yaml").read_text())
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    # the budget holds the models; the limit adds what the daemon itself needs beside them
    limit = quantity_mib(c["resources"]["limits"]["memory"])
    assert s.memory_budget_mib + RUNTIME_MIB <= limit
    assert c["resources"]["requests"] == c["resources"]["limits"]
