"""The Kubernetes manifests in deploy/k8s: valid for the Kubernetes versions we support, lint-clean, and consistent
with the image, the server's settings and each other.

Everything runs offline: kubernetes-validate bundles the API schemas, yamllint is a linter, and `kubectl kustomize`
(used when a recent enough kubectl is installed, skipped otherwise) renders locally without a cluster.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

from app.settings import Settings
from tests.support import ROOT

K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes release the manifests target, and the newest whose schemas the pinned kubernetes-validate
# bundles: a field missing from either fails the test.
KUBERNETES_VERSIONS = ("1.31", "1.37")
KUSTOMIZE_KINDS = {"Kustomization", "Component"}
IMAGE_UID = 10001


def manifest_files() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resources() -> list[dict[str, Any]]:
    """Every Kubernetes object in deploy/k8s (the kustomize files excluded)."""
    return [doc for path in manifest_files() for doc in documents(path) if doc["kind"] not in KUSTOMIZE_KINDS]


def only(kind: str, docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    found = [doc for doc in (resources() if docs is None else docs) if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def server_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "episerve"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def all_containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    pod = deployment["spec"]["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


def image_repository(image: str) -> str:
    """`registry/name:tag` -> `name` (the last path component, without tag or digest)."""
    return image.split("@")[0].rsplit("/", 1)[-1].split(":")[0]


# -- validators ----------------------------------------------------------------------------------------------------


def test_yamllint_passes_on_every_manifest_with_the_committed_config() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-f", "parsable", "-c", str(ROOT / ".yamllint.yaml"), str(K8S)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_resource_validates_strictly_against_the_kubernetes_schemas(version: str) -> None:
    checked = []
    for path in manifest_files():
        for doc in documents(path):
            if doc["kind"] in KUSTOMIZE_KINDS:
                continue  # no schema of their own; rendering them is checked below
            try:
                # strict: unknown fields (a misspelt key) are errors, not silently dropped by the API server
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                path_in_doc = ".".join(str(part) for part in error.path)
                pytest.fail(f"{path.relative_to(ROOT)}: {doc['kind']} {path_in_doc}: {error.message}")
            except kubernetes_validate.SchemaNotFoundError as error:
                pytest.fail(f"{path.relative_to(ROOT)}: {error.message}")
            checked.append(doc["kind"])
    assert sorted(checked) == ["Deployment", "HorizontalPodAutoscaler", "Ingress", "Namespace", "Service"]


def test_every_manifest_is_listed_by_a_kustomization() -> None:
    listed = set()
    for path in manifest_files():
        for doc in documents(path):
            if doc["kind"] in KUSTOMIZE_KINDS:
                listed |= {(path.parent / name).resolve() for name in doc.get("resources", [])}
                listed |= {(path.parent / name).resolve() for name in doc.get("components", [])}
    kustomization = documents(K8S / "kustomization.yaml")[0]
    # the optional autoscaler is a component that is listed commented out, so that it is one uncommented line away
    assert "components" not in kustomization
    assert re.search(r"^# components:\n#   - autoscaling$", (K8S / "kustomization.yaml").read_text(), re.MULTILINE)
    listed.add((K8S / "autoscaling").resolve())
    plain = {path.resolve() for path in manifest_files() if path.name != "kustomization.yaml"}
    assert plain <= listed, f"not in any kustomization: {sorted(str(p) for p in plain - listed)}"


# -- the Deployment ------------------------------------------------------------------------------------------------


def test_probes_ask_readyz_for_readiness_and_healthz_for_liveness_on_the_server_port() -> None:
    container = server_container(only("Deployment"))
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        port = container[probe]["httpGet"]["port"]
        assert ports.get(port, port) == 8000, probe


def test_container_port_is_the_one_the_server_listens_on() -> None:
    container = server_container(only("Deployment"))
    env = env_of(container)
    (port,) = container["ports"]
    assert port["containerPort"] == int(env["EPISERVE_PORT"]["value"]) == 8000
    assert env["EPISERVE_HOST"]["value"] == "0.0.0.0"


def test_no_service_links_inject_episerve_variables() -> None:
    # a Service named `episerve` would otherwise give every pod EPISERVE_PORT=tcp://..., EPISERVE_SERVICE_HOST, ...
    assert only("Service")["metadata"]["name"] == "episerve"
    assert only("Deployment")["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_every_episerve_variable_is_a_server_setting() -> None:
    settings = {f"EPISERVE_{name.upper()}" for name in Settings.model_fields}
    names = {name for name in env_of(server_container(only("Deployment"))) if name.startswith("EPISERVE_")}
    assert names - settings == set()


def test_pods_run_as_the_image_user_and_only_the_ownership_init_container_as_root() -> None:
    dockerfile_uid = int(re.search(r"^ARG UID=(\d+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE).group(1))
    assert dockerfile_uid == IMAGE_UID
    deployment = only("Deployment")
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == pod["runAsGroup"] == IMAGE_UID
    assert pod["seccompProfile"]["type"] == "RuntimeDefault"
    server = server_container(deployment)["securityContext"]
    assert server["runAsNonRoot"] is True and server["runAsUser"] == IMAGE_UID
    assert server["capabilities"] == {"drop": ["ALL"]}
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][0] == "chown" and init["command"][1] == f"{IMAGE_UID}:{IMAGE_UID}"
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    for container in all_containers(deployment):
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, container["name"]
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_root_filesystem_is_read_only_with_an_empty_dir_tmp() -> None:
    deployment = only("Deployment")
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    for container in all_containers(deployment):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, container["name"]
    mounts = {mount["mountPath"]: mount["name"] for mount in server_container(deployment)["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_cache_directory_is_a_node_local_volume_shared_by_no_other_pod() -> None:
    deployment = only("Deployment")
    container = server_container(deployment)
    cache_dir = env_of(container)["EPISERVE_CACHE_DIR"]["value"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volume = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}[mounts[cache_dir]]
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][-1] == cache_dir and {m["mountPath"] for m in init["volumeMounts"]} == {cache_dir}
    # one pod per node, so a node's cache directory has one server; hence no surge pod waiting for a free node
    (rule,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert rule["topologyKey"] == "kubernetes.io/hostname"
    assert rule["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


def test_roots_are_a_bucket_with_credentials_from_a_secret_and_an_endpoint_for_s3_compatible_stores() -> None:
    env = env_of(server_container(only("Deployment")))
    assert env["EPISERVE_ROOTS"]["value"] == "s3://bucket/prefix"
    assert env["AWS_ENDPOINT_URL"]["value"].startswith("http")
    assert env["AWS_REGION"]["value"]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name], f"{name} must not be written into the manifest"
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "episerve-s3", "key": name}
    assert not any(doc["kind"] == "Secret" for doc in resources()), "credentials do not belong in the repository"


def test_every_container_has_cpu_and_memory_requests_and_limits() -> None:
    for container in all_containers(only("Deployment")):
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][bound]), (container["name"], bound)


def test_image_is_the_one_the_dockerfile_and_the_deploy_test_build() -> None:
    compose_image = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-episerve"]["image"]
    built = re.search(r'"(episerve-server):\$TAG"', (ROOT / "tests" / "deploy" / "run.sh").read_text()).group(1)
    assert image_repository(compose_image) == built == "episerve-server"
    for container in all_containers(only("Deployment")):
        assert image_repository(container["image"]) == built, container["name"]
    (entry,) = documents(K8S / "kustomization.yaml")[0]["images"]
    assert entry["name"] == built


# -- Service, Ingress, autoscaler ----------------------------------------------------------------------------------


def test_service_selects_the_deployment_pods_and_targets_the_server_port() -> None:
    deployment, service = only("Deployment"), only("Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in server_container(deployment)["ports"]}


def test_ingress_routes_by_consistent_hash_of_the_path_to_the_service() -> None:
    ingress, service = only("Ingress"), only("Service")
    annotations = ingress["metadata"]["annotations"]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    # the path without the query: every pick of a dataset's rows goes to one pod (see ingress.yaml)
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$uri"
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    body_limit = annotations["nginx.ingress.kubernetes.io/proxy-body-size"]
    assert body_limit.endswith("m") and int(body_limit[:-1]) * 1024 * 1024 >= Settings().max_body_bytes
    assert "http_503" not in annotations["nginx.ingress.kubernetes.io/proxy-next-upstream"]
    backends = [path["backend"]["service"] for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]]
    assert backends == [{"name": service["metadata"]["name"], "port": {"name": service["spec"]["ports"][0]["name"]}}]


def test_dataset_key_map_in_the_ingress_notes_extracts_the_dataset_id() -> None:
    """The `map` suggested in ingress.yaml for hashing on the dataset id alone (PCRE; this regex reads the same in
    Python) gives one key for every endpoint of a dataset, ids with slashes included."""
    text = (K8S / "ingress.yaml").read_text()
    pattern = re.search(r'"~(\^/datasets/.*\$)" \$episerve_id;', text).group(1).replace("?<", "?P<")
    endpoints = ["", "/rows", "/rows/take", "/cache", "/episodes"]
    for dataset in ("lerobot/pusht", "demo", "team/robot/v3"):
        keys = {re.match(pattern, f"/datasets/{dataset}{suffix}").group("episerve_id") for suffix in endpoints}
        assert keys == {dataset}


def test_autoscaler_scales_the_deployment_on_cpu() -> None:
    hpa, deployment = only("HorizontalPodAutoscaler"), only("Deployment")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # every pod needs a CPU request for a utilization target to mean anything
    assert "cpu" in server_container(deployment)["resources"]["requests"]


# -- rendering with kustomize --------------------------------------------------------------------------------------


def kustomize_or_skip() -> list[str]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomization is not rendered (the manifests are checked above)")
    result = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60)
    version = json.loads(result.stdout or "{}").get("kustomizeVersion", "") if result.returncode == 0 else ""
    match = re.match(r"v(\d+)\.", version)
    if not match or int(match.group(1)) < 4:
        pytest.skip(f"kubectl's kustomize ({version or 'unknown version'}) predates components (kustomize >= 4)")
    return [kubectl, "kustomize"]


def render(kustomize: list[str], directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run([*kustomize, str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def check_rendered(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "episerve", doc["kind"]
    for container in all_containers(only("Deployment", docs)):
        assert container["image"] == "episerve-server:local"


def test_kustomization_renders_the_server_service_and_ingress_in_their_namespace() -> None:
    docs = render(kustomize_or_skip(), K8S)
    assert sorted(doc["kind"] for doc in docs) == ["Deployment", "Ingress", "Namespace", "Service"]
    check_rendered(docs)
    assert only("Deployment", docs)["spec"]["replicas"] == 3


def test_enabling_the_autoscaling_component_adds_the_autoscaler_and_drops_fixed_replicas(tmp_path: Path) -> None:
    kustomize = kustomize_or_skip()
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    kustomization = copy / "kustomization.yaml"
    kustomization.write_text(
        kustomization.read_text().replace("# components:\n#   - autoscaling", "components:\n  - autoscaling")
    )
    docs = render(kustomize, copy)
    assert sorted(doc["kind"] for doc in docs) == [
        "Deployment",
        "HorizontalPodAutoscaler",
        "Ingress",
        "Namespace",
        "Service",
    ]
    check_rendered(docs)
    assert "replicas" not in only("Deployment", docs)["spec"]
