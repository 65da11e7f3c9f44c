"""The Helm chart (helm/tidemark) and the image (docker/), checked offline.

The chart is rendered by Helm's own engine: helm-python-sdk bundles Helm 4's Go library
(``libhelm_c.so``), so templates, ``values.schema.json`` and ``fail`` run exactly as under
``helm install``. Every manifest is validated in strict mode (unknown fields are errors)
against the Kubernetes OpenAPI schemas that kubernetes-validate ships, for KUBERNETES_VERSIONS,
and ``helm lint`` (the same library) has nothing to warn about.
The tests then assert what an operator relies on: replicas, RBAC rules, probes, scrape
annotations, secret references, security contexts and the Spark settings of the drivers.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.present import present

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (Helm's engine) is a dev dependency")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "tidemark"
# The oldest version the chart supports (Chart.yaml's kubeVersion) and a current one.
KUBERNETES_VERSIONS = ("1.25.0", "1.30.0")
RELEASE, NAMESPACE = "lake", "pipelines"
FULLNAME = f"{RELEASE}-tidemark"
EXAMPLES = sorted(f"examples/{p.name}" for p in (CHART / "examples").glob("*-values.yaml"))
VALUES_FILES = [None] + sorted(p.name for p in (CHART / "ci").glob("*-values.yaml")) + EXAMPLES
# The Secrets an operator created before installing, for values that give the catalog and S3 no other way
# (the chart's defaults give none: they fail, saying which values to set).
CREATED_SECRETS = {"catalog": {"uri": {"existingSecret": "tidemark-catalog"},
                               "s3": {"credentials": {"existingSecret": "tidemark-s3"}}}}
# What each example's header puts on the helm install command line: the object store.
OBJECT_STORE = {"catalog": {"warehouse": "s3://my-bucket/warehouse",
                            "s3": {"credentials": {"accessKeyId": "AKIAEXAMPLE", "secretAccessKey": "example"}}}}
SPARK_MASTER = "k8s://https://kubernetes.default.svc"


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(str(CHART)) as loaded:
        yield loaded


def merged(base: dict, top: dict) -> dict:
    """``top`` over ``base``, recursively (as Helm merges values files)."""
    result = dict(base)
    for key, value in top.items():
        result[key] = merged(result[key], value) if isinstance(value, dict) and isinstance(result.get(key), dict) \
            else value
    return result


def values_of(name):
    """A values file as installed: an example with its command line's object store, any other file with the
    operator's Secrets unless it gives the catalog and S3 credentials itself."""
    if name and name.startswith("examples/"):
        return merged(yaml.safe_load((CHART / name).read_text()), OBJECT_STORE)
    return with_credentials(yaml.safe_load((CHART / "ci" / name).read_text()) if name else {})


def with_credentials(values: dict) -> dict:
    """``values``, plus the operator's Secrets (CREATED_SECRETS) for the catalog and S3 when they give none."""
    catalog = values.get("catalog", {})
    if not ({"value", "existingSecret"} & set(catalog.get("uri", {})) or catalog.get("bundledPostgres")):
        values = merged({"catalog": {"uri": CREATED_SECRETS["catalog"]["uri"]}}, values)
    if not set(catalog.get("s3", {}).get("credentials", {})) & {"accessKeyId", "existingSecret", "podIdentity"}:
        values = merged({"catalog": {"s3": CREATED_SECRETS["catalog"]["s3"]}}, values)
    return values


def render(chart, values=None) -> list[dict]:
    """Every manifest of one release, as ``helm template`` would print them (NOTES excluded)."""
    rendered = chart.render(with_credentials(values or {}), name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict] = []
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def only(docs, kind, name=None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def of_kind(docs, kind) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def pod_specs(docs) -> dict[str, dict]:
    """Pod specs by owner: workloads' templates and the executor pod templates Spark reads."""
    specs = {f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
             for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    specs.update({f"CronJob/{d['metadata']['name']}": d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
                  for d in of_kind(docs, "CronJob")})
    for cm in of_kind(docs, "ConfigMap"):
        if "executor-pod.yaml" in cm["data"]:
            specs[f"executor-of/{cm['metadata']['name']}"] = yaml.safe_load(cm["data"]["executor-pod.yaml"])["spec"]
    return specs


def env_of(container) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def object_name(job: str) -> str:
    """The name of a job's objects: ``jobs.<key>`` with '_' as '-'."""
    return f"{FULLNAME}-{job.replace('_', '-')}"


def spark_defaults(docs, job) -> dict[str, str]:
    text = only(docs, "ConfigMap", object_name(job))["data"]["spark-defaults.conf"]
    return dict(line.split(" ", 1) for line in text.splitlines() if line.strip())


def driver(docs, job) -> tuple[dict, dict]:
    deployment = only(docs, "Deployment", object_name(job))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- every values file: valid Kubernetes, consistent references, hardened pods ---------------

@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda v: v or "defaults")
def test_every_manifest_validates_against_the_kubernetes_schemas(chart, values_file, version):
    docs = render(chart, values_of(values_file))
    assert docs
    custom = {"ServiceMonitor", "PrometheusRule"}  # prometheus-operator's CRDs: checked below
    for doc in docs:
        if doc["kind"] not in custom:
            kubernetes_validate.validate(doc, version, strict=True)
    for name, spec in pod_specs(docs).items():
        if name.startswith("executor-of/"):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "executor"}, "spec": spec}
            kubernetes_validate.validate(pod, version, strict=True)
    keys = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "two manifests share a kind and name"
    for doc in docs:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), doc["metadata"]["name"]
        assert len(doc["metadata"]["name"]) <= 63


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda v: v or "defaults")
def test_helm_lint_finds_nothing_to_warn_about(values_file):
    report = helm.lint(str(CHART), values_of(values_file), strict=True, namespace=NAMESPACE,
                       kube_version=f"v{KUBERNETES_VERSIONS[0]}")
    assert not report["errors"]
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # 1 is information ("icon is recommended")


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda v: v or "defaults")
def test_services_configmaps_and_service_accounts_referenced_exist(chart, values_file):
    docs = render(chart, values_of(values_file))
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    templates = [w["spec"]["template"]["metadata"]["labels"] for w in workloads]
    for service in of_kind(docs, "Service"):
        assert any(selects(service["spec"]["selector"], labels) for labels in templates), service["metadata"]["name"]
    configmaps = {d["metadata"]["name"] for d in of_kind(docs, "ConfigMap")}
    accounts = {d["metadata"]["name"] for d in of_kind(docs, "ServiceAccount")}
    for workload in workloads:
        spec = workload["spec"]["template"]["spec"]
        assert selects(workload["spec"]["selector"]["matchLabels"], workload["spec"]["template"]["metadata"]["labels"])
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in accounts
    for pdb in of_kind(docs, "PodDisruptionBudget"):
        assert sum(selects(pdb["spec"]["selector"]["matchLabels"], labels) for labels in templates) == 1


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda v: v or "defaults")
def test_every_pod_runs_as_non_root_with_a_read_only_root_filesystem(chart, values_file):
    docs = render(chart, values_of(values_file))
    for owner, spec in pod_specs(docs).items():
        assert spec["securityContext"]["runAsNonRoot"] is True, owner
        # No <SERVICE>_PORT variables: a Service named like a setting (tidemark-zk) must not set one.
        assert spec["enableServiceLinks"] is False, owner
        assert spec["securityContext"]["runAsUser"] > 0, owner
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, owner
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, owner
            assert context["readOnlyRootFilesystem"] is True, owner
            assert context["capabilities"]["drop"] == ["ALL"], owner
            assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, owner
            if not owner.startswith("executor-of/"):  # Spark sizes executors from spark.executor.*
                assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], owner
            if not owner.startswith(("executor-of/", "CronJob/")):  # a CronJob's pod ends: no probes
                assert container["readinessProbe"] and container["livenessProbe"], owner
        if not owner.startswith("Deployment/") or owner.endswith("-exporter"):
            assert spec.get("automountServiceAccountToken") is False, f"{owner} needs no API token"


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda v: v or "defaults")
def test_secrets_are_referenced_by_name_never_inlined(chart, values_file):
    docs = render(chart, values_of(values_file))
    # The only Secrets in a release are the ones values give the content of (and those the chart makes up: the
    # bundled PostgreSQL's password, tidemark serve's token).
    for secret in of_kind(docs, "Secret"):
        assert secret["metadata"]["name"] in {f"{FULLNAME}-catalog", f"{FULLNAME}-s3", f"{FULLNAME}-postgres",
                                              f"{FULLNAME}-serve-auth"}
        assert set(secret) == {"apiVersion", "kind", "metadata", "type", "stringData"}
    for owner, spec in pod_specs(docs).items():
        for container in spec["containers"]:
            for name, entry in env_of(container).items():
                if re.search(r"PASSWORD|SECRET|CATALOG_URI|ACCESS_KEY", name):
                    assert "secretKeyRef" in entry["valueFrom"], f"{owner}: {name} is inlined"


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda v: v or "defaults")
def test_the_notes_name_every_secret_the_release_reads(chart, values_file):
    values = values_of(values_file)
    notes = chart.render(values, name=RELEASE, namespace=NAMESPACE)["tidemark/templates/NOTES.txt"]
    docs = render(chart, values)
    referenced = {v["secret"]["secretName"] for spec in pod_specs(docs).values() for v in spec.get("volumes", [])
                  if "secret" in v}
    for spec in pod_specs(docs).values():
        for container in spec["containers"]:
            referenced |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
                           if "secretKeyRef" in e.get("valueFrom", {})}
    for conf in (spark_defaults(docs, job) for job in values.get("jobs", {})):
        referenced |= {v.split(":")[0] for k, v in conf.items() if ".secretKeyRef." in k}
    for secret in referenced:
        assert re.search(rf"^  {re.escape(secret)} \(", notes, re.M), f"NOTES.txt does not name {secret}"


# -- what each values file is about ----------------------------------------------------------

def test_defaults_bundle_a_three_server_zookeeper_ensemble(chart):
    docs = render(chart)
    zk = only(docs, "StatefulSet", f"{FULLNAME}-zookeeper")
    assert zk["spec"]["replicas"] == 3
    assert zk["spec"]["podManagementPolicy"] == "Parallel"
    (claim,) = zk["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    (server,) = zk["spec"]["template"]["spec"]["containers"]
    assert {m["mountPath"]: m["name"] for m in server["volumeMounts"]}["/data"] == claim["metadata"]["name"]
    for probe in (server["readinessProbe"], server["livenessProbe"]):
        assert probe["httpGet"] == {"path": "/commands/ruok", "port": "admin"}
    headless = only(docs, "Service", f"{FULLNAME}-zookeeper-headless")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert zk["spec"]["serviceName"] == headless["metadata"]["name"]
    pdb = only(docs, "PodDisruptionBudget", f"{FULLNAME}-zookeeper")
    assert pdb["spec"]["maxUnavailable"] == 1
    zoo_cfg = only(docs, "ConfigMap", f"{FULLNAME}-zookeeper")["data"]["zoo.cfg"]
    servers = re.findall(r"^server\.(\d)=(\S+)$", zoo_cfg, re.M)
    assert [(n, host) for n, host in servers] == [
        (str(i + 1), f"{FULLNAME}-zookeeper-{i}.{FULLNAME}-zookeeper-headless.{NAMESPACE}.svc:2888:3888;2181")
        for i in range(3)]
    exporter = only(docs, "Deployment", f"{FULLNAME}-exporter")
    (container,) = exporter["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["TIDEMARK_ZK"]["value"] == ",".join(
        f"{FULLNAME}-zookeeper-{i}.{FULLNAME}-zookeeper-headless.{NAMESPACE}.svc:2181" for i in range(3)) + "/tidemark"
    assert not [d for d in of_kind(docs, "Deployment")
                if d["metadata"]["labels"]["app.kubernetes.io/component"] == "driver"]
    assert not of_kind(docs, "ServiceMonitor") and not of_kind(docs, "PrometheusRule")
    assert f"{FULLNAME}-rules" not in {d["metadata"]["name"] for d in of_kind(docs, "ConfigMap")}


def test_the_exporter_is_scraped_through_its_service(chart):
    docs = render(chart)
    service = only(docs, "Service", f"{FULLNAME}-exporter")
    assert service["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9464", "prometheus.io/path": "/metrics"}
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9464, "targetPort": "metrics"}]
    deployment = only(docs, "Deployment", f"{FULLNAME}-exporter")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["exporter", "--port", "9464"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9464}]
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}
    dashboard = only(docs, "ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["tidemark.json"].strip() == (CHART / "dashboards" / "tidemark.json").read_text().strip()


def test_tidemark_serve_runs_as_a_scraped_deployment_with_the_reader_identity_and_the_catalog(chart):
    docs = render(chart)
    service = only(docs, "Service", f"{FULLNAME}-serve")
    assert service["spec"]["ports"] == [{"name": "http", "port": 8181, "targetPort": "http"}]
    assert service["metadata"]["labels"]["tidemark.io/metrics"] == "true"
    deployment = only(docs, "Deployment", f"{FULLNAME}-serve")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["serve", "--host", "0.0.0.0", "--port", "8181"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTP"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTP"}
    names = {e["name"] for e in container["env"]}
    assert {"TIDEMARK_CATALOG_NAME", "TIDEMARK_CATALOG_URI"} <= names
    assert container["resources"]["limits"]["memory"] == "1Gi"
    # Authentication on by default: a token the chart makes up, kept across upgrades.
    generated = only(docs, "Secret", f"{FULLNAME}-serve-auth")
    assert generated["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(generated["stringData"]["tokens"]) == 40
    tokens = next(e for e in container["env"] if e["name"] == "TIDEMARK_SERVE_TOKENS")
    assert tokens["valueFrom"]["secretKeyRef"]["name"] == f"{FULLNAME}-serve-auth"
    budget = only(docs, "PodDisruptionBudget", f"{FULLNAME}-serve")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    anyone = render(chart, {"serve": {"auth": {"enabled": False}}})
    (container,) = only(anyone, "Deployment", f"{FULLNAME}-serve")["spec"]["template"]["spec"]["containers"]
    assert "TIDEMARK_SERVE_TOKENS" not in {e["name"] for e in container["env"]}
    assert not [d for d in anyone if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-serve-auth")]

    secured = render(chart, {"serve": {"auth": {"existingSecret": "serve-auth"},
                                       "tls": {"existingSecret": "serve-tls"}},
                             "metrics": {"serviceMonitor": {"enabled": True}}})
    (container,) = only(secured, "Deployment", f"{FULLNAME}-serve")["spec"]["template"]["spec"]["containers"]
    assert container["args"][-4:] == ["--tls-cert-file", "/etc/tidemark/serve-tls/tls.crt", "--tls-key-file",
                                      "/etc/tidemark/serve-tls/tls.key"]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    tokens = next(e for e in container["env"] if e["name"] == "TIDEMARK_SERVE_TOKENS")
    assert tokens["valueFrom"]["secretKeyRef"]["name"] == "serve-auth"
    assert not [d for d in secured if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-serve-auth")]
    monitor = only(secured, "ServiceMonitor")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics", "http"]
    assert not [d for d in render(chart, {"serve": {"enabled": False}}) if d["metadata"]["name"].endswith("-serve")]
    on_aws = render(chart, {"serve": {"credentials": {"stsRoleArn": "arn:aws:iam::1:role/reader",
                                                      "stsDurationSeconds": 900}}})
    (container,) = only(on_aws, "Deployment", f"{FULLNAME}-serve")["spec"]["template"]["spec"]["containers"]
    assert container["args"][5:] == ["--sts-role-arn", "arn:aws:iam::1:role/reader", "--sts-duration", "900"]
    static = render(chart, {"serve": {"credentials": {"vend": "static"}}})
    (container,) = only(static, "Deployment", f"{FULLNAME}-serve")["spec"]["template"]["spec"]["containers"]
    assert container["args"][5:] == ["--vend-credentials", "static"]


def test_bundled_zookeeper_with_auth_and_an_inline_job_script(chart):
    values = values_of("bundled-zk-auth-values.yaml")
    docs = render(chart, values)
    deployment, container = driver(docs, "word-counts")
    exporter = only(docs, "Deployment", f"{FULLNAME}-exporter")["spec"]["template"]["spec"]["containers"][0]
    writer, reader = env_of(container), env_of(exporter)
    assert writer["TIDEMARK_ZK_USER"]["valueFrom"]["secretKeyRef"] == {"name": "tidemark-zk-auth", "key": "user"}
    assert writer["TIDEMARK_ZK_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "tidemark-zk-auth",
                                                                          "key": "password"}
    assert "TIDEMARK_ZK_USER" not in reader and "TIDEMARK_ZK_PASSWORD" not in reader  # read-only
    for env in (writer, reader):  # drivers grant the reader read access; the exporter is the reader
        assert env["TIDEMARK_ZK_READER_USER"]["valueFrom"]["secretKeyRef"] == {"name": "tidemark-zk-reader",
                                                                               "key": "user"}
        assert env["TIDEMARK_ZK_READER_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "tidemark-zk-reader", "key": "password"}
    server = only(docs, "StatefulSet", f"{FULLNAME}-zookeeper")["spec"]["template"]["spec"]["containers"][0]
    admin = {"name": "tidemark-zk-admin", "key": "password"}
    assert env_of(server)["ZK_SUPER_PASSWORD"]["valueFrom"]["secretKeyRef"] == admin
    assert server["command"] == ["/bin/bash", "/conf/start.sh"]
    start = only(docs, "ConfigMap", f"{FULLNAME}-zookeeper")["data"]["start.sh"]
    assert "-Dzookeeper.DigestAuthenticationProvider.superDigest=super:" in start
    config = only(docs, "ConfigMap", f"{FULLNAME}-word-counts")
    assert config["data"]["job.py"] == values["jobs"]["word-counts"]["script"]
    assert container["args"] == ["job", "/etc/tidemark/job/job.py"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["job-script"]["mountPath"] == "/etc/tidemark/job"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["job-script"]["configMap"] == {"name": config["metadata"]["name"],
                                                   "items": [{"key": "job.py", "path": "job.py"}]}


def test_each_job_can_have_its_own_zookeeper_identity_and_the_servers_require_one(chart):
    docs = render(chart, values_of("bundled-zk-auth-values.yaml"))
    _, container = driver(docs, "word-counts")
    env = env_of(container)
    own = {"name": "tidemark-zk-word-counts"}
    assert env["TIDEMARK_ZK_JOB_USER"]["valueFrom"]["secretKeyRef"] == {**own, "key": "user"}
    assert env["TIDEMARK_ZK_JOB_PASSWORD"]["valueFrom"]["secretKeyRef"] == {**own, "key": "password"}
    operator = {"name": "tidemark-zk-operator"}
    assert env["TIDEMARK_ZK_OPERATOR_USER"]["valueFrom"]["secretKeyRef"] == {**operator, "key": "user"}
    assert "TIDEMARK_ZK_OPERATOR_PASSWORD" not in env  # a driver learns the operator's name, never its password
    gc = only(docs, "CronJob", f"{FULLNAME}-gc")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    init = only(docs, "Job", f"{FULLNAME}-init")
    assert init["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    (init_container,) = init["spec"]["template"]["spec"]["containers"]
    assert init_container["args"] == ["tidemark", "init"]
    for runs_as_operator in (gc, init_container):
        assert env_of(runs_as_operator)["TIDEMARK_ZK_OPERATOR_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            **operator, "key": "password"}
        assert "TIDEMARK_ZK_JOB_USER" not in env_of(runs_as_operator)
    zoo_cfg = only(docs, "ConfigMap", f"{FULLNAME}-zookeeper")["data"]["zoo.cfg"]
    assert "enforce.auth.enabled=true" in zoo_cfg and "enforce.auth.schemes=digest" in zoo_cfg

    # Without a writer identity the servers let anyone in (as before), and no job has an identity of its own.
    plain = render(chart, values_of("two-jobs-values.yaml"))
    assert "enforce.auth" not in only(plain, "ConfigMap", f"{FULLNAME}-zookeeper")["data"]["zoo.cfg"]
    assert not of_kind(plain, "Job")
    for values, message in [
        ({"jobs": {"word-counts": {"zkAuthSecret": "x"}}, "zookeeper": {"auth": {"operatorSecret": ""}}},
         r"jobs\.word-counts\.zkAuthSecret: .*zookeeper\.auth\.operatorSecret"),
        ({"zookeeper": {"auth": {"readerSecret": ""}}},
         r"zookeeper\.bundled\.requireAuth: .*set zookeeper\.auth\.readerSecret, or requireAuth=false"),
    ]:
        with pytest.raises(helm.HelmRenderError, match=message):
            render(chart, merged(values_of("bundled-zk-auth-values.yaml"), values))
    relaxed = merged(values_of("bundled-zk-auth-values.yaml"),
                     {"zookeeper": {"auth": {"readerSecret": ""}, "bundled": {"requireAuth": False}}})
    assert "enforce.auth" not in only(render(chart, relaxed), "ConfigMap", f"{FULLNAME}-zookeeper")["data"]["zoo.cfg"]


def test_gc_runs_as_cron_jobs_with_the_writer_identity_and_the_drivers_catalog(chart):
    values = values_of("bundled-zk-auth-values.yaml")
    values["gc"] = {"policy": "all:1h,daily:30d", "orphans": {"olderThan": "7d"}}
    docs = render(chart, values)
    gc, orphans = only(docs, "CronJob", f"{FULLNAME}-gc"), only(docs, "CronJob", f"{FULLNAME}-gc-orphans")
    assert gc["spec"]["schedule"] == "*/10 * * * *" and orphans["spec"]["schedule"] == "35 3 * * *"
    _, driver_container = driver(docs, "word-counts")
    for cron in (gc, orphans):
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        (container,) = pod["containers"]
        env = env_of(container)
        assert env["TIDEMARK_ZK_USER"]["valueFrom"]["secretKeyRef"] == {"name": "tidemark-zk-auth", "key": "user"}
        catalog = {k: v for k, v in env_of(driver_container).items()
                   if k.startswith(("TIDEMARK_CATALOG", "TIDEMARK_WAREHOUSE", "AWS_", "PYICEBERG_"))}
        assert catalog and {k: env[k] for k in catalog} == catalog, "GC opens the catalog as the drivers do"
    assert only(docs, "CronJob", f"{FULLNAME}-gc")["spec"]["jobTemplate"]["spec"]["template"]["spec"][
        "containers"][0]["args"] == ["tidemark", "gc", "--yes", "--skip-if-running", "--policy", "all:1h,daily:30d"]
    assert orphans["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "tidemark", "gc", "--yes", "--orphans", "--older-than", "7d", "--policy", "all:1h,daily:30d"]

    off = render(chart, {"gc": {"orphans": {"enabled": False}}})
    assert [d["metadata"]["name"] for d in of_kind(off, "CronJob")] == [f"{FULLNAME}-gc"]
    assert not of_kind(render(chart, {"gc": {"enabled": False}}), "CronJob")


def test_external_zookeeper_over_tls_with_s3_compatible_storage(chart):
    docs = render(chart, values_of("external-zk-tls-values.yaml"))
    assert not of_kind(docs, "StatefulSet")
    deployment, container = driver(docs, "orders")
    env = env_of(container)
    assert env["TIDEMARK_ZK"]["value"] == "zk-0.zk.data:2281,zk-1.zk.data:2281,zk-2.zk.data:2281/pipelines/sales"
    assert env["TIDEMARK_ZK_TLS"]["value"] == "1"
    assert env["TIDEMARK_ZK_TLS_CHECK_HOSTNAME"]["value"] == "1"
    assert env["TIDEMARK_ZK_TLS_CA"]["value"] == "/etc/tidemark/zookeeper-tls/ca.crt"
    assert env["TIDEMARK_ZK_TLS_CERT"]["value"] == "/etc/tidemark/zookeeper-tls/tls.crt"
    assert env["TIDEMARK_ZK_TLS_KEY"]["value"] == "/etc/tidemark/zookeeper-tls/tls.key"
    mount = {m["name"]: m for m in container["volumeMounts"]}["zookeeper-tls"]
    assert mount == {"name": "zookeeper-tls", "mountPath": "/etc/tidemark/zookeeper-tls", "readOnly": True}
    volume = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}["zookeeper-tls"]
    assert volume["secret"]["secretName"] == "sales-zk-tls"
    assert {i["path"] for i in volume["secret"]["items"]} == {"ca.crt", "tls.crt", "tls.key"}
    exporter = only(docs, "Deployment", f"{FULLNAME}-exporter")["spec"]["template"]["spec"]
    exporter_env = env_of(exporter["containers"][0])
    assert exporter_env["TIDEMARK_ZK_TLS_CA"] == env["TIDEMARK_ZK_TLS_CA"] and "TIDEMARK_ZK_USER" not in exporter_env
    assert {v["name"]: v for v in exporter["volumes"]}["zookeeper-tls"] == volume
    assert env["TIDEMARK_CATALOG_URI"]["valueFrom"]["secretKeyRef"] == {"name": "sales-catalog", "key": "jdbc-uri"}
    assert env["TIDEMARK_CATALOG_NAME"]["value"] == "sales"
    assert "AWS_ACCESS_KEY_ID" not in env  # the pods' own identity (IRSA)
    assert env["PYICEBERG_CATALOG__SALES__S3__ENDPOINT"]["value"] == "http://minio.storage:9000"
    assert env["PYICEBERG_CATALOG__SALES__S3__FORCE_VIRTUAL_ADDRESSING"]["value"] == "false"
    conf = spark_defaults(docs, "orders")
    assert conf["spark.sql.catalog.sales.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert conf["spark.sql.catalog.sales.s3.endpoint"] == "http://minio.storage:9000"
    assert conf["spark.sql.catalog.sales.s3.path-style-access"] == "true"
    assert conf["spark.sql.catalog.sales.client.region"] == "eu-west-1"
    assert not [k for k in conf if "secretKeyRef" in k]
    assert container["args"] == ["job", "/opt/jobs/orders.py", "--interval-ms", "10000"]
    account = only(docs, "ServiceAccount")
    role_arn = "arn:aws:iam::123456789012:role/sales-lake"
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role_arn}
    assert not only(docs, "ConfigMap", f"{FULLNAME}-orders")["data"].get("job.py")
    assert not [p for p in of_kind(docs, "PodDisruptionBudget")  # one replica: nothing to keep available
                if p["metadata"]["name"] == f"{FULLNAME}-orders"]


def test_a_rest_catalog_with_oauth2_credentials_and_s3_reaches_every_process_through_pyicebergs_settings(chart):
    docs = render(chart, values_of("rest-catalog-values.yaml"))
    assert not [s for s in of_kind(docs, "StatefulSet") if s["metadata"]["name"] == f"{FULLNAME}-postgres"]
    _, container = driver(docs, "orders")
    env = env_of(container)
    assert env["TIDEMARK_CATALOG_NAME"]["value"] == "lakehouse"
    assert env["TIDEMARK_CATALOG_URI"]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-catalog", "key": "uri"}
    assert env["TIDEMARK_WAREHOUSE"]["value"] == "analytics"  # a REST catalog's warehouse name passes validation
    assert env["PYICEBERG_CATALOG__LAKEHOUSE__CREDENTIAL"]["valueFrom"]["secretKeyRef"] == {"name": "polaris-client",
                                                                                           "key": "client"}
    assert env["PYICEBERG_CATALOG__LAKEHOUSE__SCOPE"]["value"] == "PRINCIPAL_ROLE:ALL"
    assert "PYICEBERG_CATALOG__LAKEHOUSE__OAUTH2_SERVER_URI" not in env
    assert env["PYICEBERG_CATALOG__LAKEHOUSE__S3__ENDPOINT"]["value"] == "http://minio.storage:9000"
    catalog_uri = only(docs, "Secret", f"{FULLNAME}-catalog")["stringData"]["uri"]
    assert catalog_uri == "https://polaris.data.svc:8181/api/catalog"
    # the user's own Secret holds the credential: the chart creates none
    assert f"{FULLNAME}-rest" not in {s["metadata"]["name"] for s in of_kind(docs, "Secret")}
    gc = [c for job in of_kind(docs, "CronJob")
          for c in job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]]
    assert gc and all(env_of(c)["PYICEBERG_CATALOG__LAKEHOUSE__CREDENTIAL"] ==
                      env["PYICEBERG_CATALOG__LAKEHOUSE__CREDENTIAL"] for c in gc)
    inline = render(chart, merged(values_of("rest-catalog-values.yaml"),
                                  {"catalog": {"rest": {"credential": {"existingSecret": "", "value": "id:secret"}}}}))
    assert only(inline, "Secret", f"{FULLNAME}-rest")["stringData"]["client"] == "id:secret"


def test_two_jobs_with_standby_replicas_spread_over_nodes(chart):
    docs = render(chart, values_of("two-jobs-values.yaml"))
    expected = {"word-counts": (3, "hard"), "count-histogram": (2, "soft")}
    for job, (replicas, spread) in expected.items():
        deployment, container = driver(docs, job)
        spec = deployment["spec"]["template"]["spec"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert deployment["spec"]["replicas"] == replicas
        assert selector["tidemark.io/job"] == job
        anti = spec["affinity"]["podAntiAffinity"]
        if spread == "hard":
            (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        else:
            (weighted,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
            term = weighted["podAffinityTerm"]
        assert term == {"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"}
        assert only(docs, "PodDisruptionBudget", f"{FULLNAME}-{job}")["spec"]["maxUnavailable"] == 1
        assert spec["terminationGracePeriodSeconds"] == 120
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert container["image"] == "registry.example.com/data/tidemark:0.1.0-build7"
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[kind]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert {"name": "metrics", "containerPort": 9465} in container["ports"]
        assert env_of(container)["TIDEMARK_METRICS_PORT"]["value"] == "9465"

        service = only(docs, "Service", f"{FULLNAME}-{job}")
        assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == selector
        assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
            "metrics": 9465, "spark-driver": 7078, "spark-blockmgr": 7079, "spark-ui": 4040}
        assert service["metadata"]["annotations"]["prometheus.io/port"] == "9465"


def test_drivers_run_spark_in_client_mode_against_the_kubernetes_api(chart):
    docs = render(chart, values_of("two-jobs-values.yaml"))
    for job, instances, cores, partitions in (("word-counts", "6", "2", "64"), ("count-histogram", None, "1", "8")):
        conf = spark_defaults(docs, job)
        assert conf["spark.master"] == SPARK_MASTER
        assert conf["spark.submit.deployMode"] == "client"
        assert conf["spark.kubernetes.namespace"] == NAMESPACE
        assert conf["spark.kubernetes.container.image"] == "registry.example.com/data/tidemark:0.1.0-build7"
        assert conf["spark.kubernetes.container.image.pullSecrets"] == "registry-credentials"
        assert conf.get("spark.executor.instances") == instances
        assert conf["spark.executor.cores"] == cores
        assert conf["spark.executor.memory"] == "4g"
        assert conf["spark.sql.shuffle.partitions"] == partitions
        assert conf["spark.driver.port"] == "7078" and conf["spark.driver.blockManager.port"] == "7079"
        assert conf["spark.kubernetes.executor.podTemplateFile"] == "/etc/tidemark/spark/executor-pod.yaml"
        secret = "tidemark-s3:AWS_SECRET_ACCESS_KEY"
        assert conf["spark.kubernetes.executor.secretKeyRef.AWS_SECRET_ACCESS_KEY"] == secret
        # One prefix for every replica would make two drivers' executor pod names collide.
        assert "spark.kubernetes.executor.podNamePrefix" not in conf
        deployment, container = driver(docs, job)
        names = [e["name"] for e in container["env"]]
        env = env_of(container)
        # Kubernetes expands $(VAR) only from variables defined earlier in the list.
        assert names.index("POD_IP") < names.index("PYSPARK_SUBMIT_ARGS")
        assert names.index("POD_NAME") < names.index("PYSPARK_SUBMIT_ARGS")
        assert env["PYSPARK_SUBMIT_ARGS"]["value"] == (
            "--conf spark.driver.host=$(POD_IP) --conf spark.kubernetes.driver.pod.name=$(POD_NAME) pyspark-shell")
        assert env["SPARK_CONF_DIR"]["value"] == "/etc/tidemark/spark"
        assert env["TIDEMARK_CATALOG_URI"]["valueFrom"]["secretKeyRef"] == {"name": "tidemark-catalog", "key": "uri"}
        spec = deployment["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == f"{FULLNAME}-driver"
        executor = pod_specs(docs)[f"executor-of/{FULLNAME}-{job}"]
        assert executor["automountServiceAccountToken"] is False
        assert executor["containers"][0]["name"] == conf["spark.kubernetes.executor.podTemplateContainerName"]


DRIVER_PROBE = """
import json
from coordinator import CatalogSettings
from spark_hooks import build_spark_session
spark = build_spark_session(CatalogSettings.embedded({home!r}), app_name="probe")
conf = dict(spark.sparkContext.getConf().getAll())
print(json.dumps(dict(conf, partitions=spark.conf.get("spark.sql.shuffle.partitions"))))
spark.stop()
"""


@pytest.mark.spark
def test_a_driver_session_takes_the_rendered_spark_settings(chart, tmp_path):
    """The pod's SPARK_CONF_DIR and PYSPARK_SUBMIT_ARGS reach a real SparkSession started by the
    image's entrypoint; only the master is local here, as no Kubernetes API is at hand."""
    import pyspark

    docs = render(chart, values_of("two-jobs-values.yaml"))
    _, container = driver(docs, "word-counts")
    conf_dir = tmp_path / "spark"
    conf_dir.mkdir()
    rendered = spark_defaults(docs, "word-counts")
    local = dict(rendered, **{"spark.master": "local[1]", "spark.local.dir": str(tmp_path / "local")})
    (conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in local.items()))
    pod = {"POD_IP": "127.0.0.1", "POD_NAME": "word-counts-7d9f-x2x"}
    submit_args = re.sub(r"\$\((\w+)\)", lambda m: pod[m.group(1)], env_of(container)["PYSPARK_SUBMIT_ARGS"]["value"])
    script = tmp_path / "probe.py"
    script.write_text(DRIVER_PROBE.format(home=str(tmp_path / "lake")))
    done = run_entrypoint("job", str(script), env={
        "SPARK_HOME": str(Path(pyspark.__file__).parent), "SPARK_CONF_DIR": str(conf_dir),
        "PYSPARK_SUBMIT_ARGS": submit_args}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    session = json.loads(done.stdout.strip().splitlines()[-1])
    assert session["spark.master"] == "local[1]"
    assert session["spark.driver.host"] == "127.0.0.1"
    assert session["spark.kubernetes.driver.pod.name"] == pod["POD_NAME"]
    assert session["partitions"] == "64"  # spark.conf from values, not the session's local default
    for key in ("spark.executor.instances", "spark.executor.cores", "spark.kubernetes.container.image",
                "spark.kubernetes.executor.podTemplateFile", "spark.sql.catalog.lake.io-impl", "spark.driver.port"):
        assert session[key] == rendered[key], key
    assert session["spark.sql.extensions"].endswith("IcebergSparkSessionExtensions")


def test_standbys_give_their_executors_back_with_dynamic_allocation(chart):
    docs = render(chart, values_of("two-jobs-values.yaml"))
    conf = spark_defaults(docs, "count-histogram")
    assert {k: v for k, v in conf.items() if k.startswith("spark.dynamicAllocation.")} == {
        "spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "0", "spark.dynamicAllocation.maxExecutors": "3",
        "spark.dynamicAllocation.executorIdleTimeout": "60s"}
    assert not [k for k in spark_defaults(docs, "word-counts") if k.startswith("spark.dynamicAllocation.")]


def test_a_job_value_replaces_the_default_even_when_false_or_zero(chart):
    values = {"spark": {"executor": {"dynamicAllocation": {"enabled": True}}},
              "jobDefaults": {"terminationGracePeriodSeconds": 300},
              "jobs": {"wc": {"scriptPath": "/j.py", "terminationGracePeriodSeconds": 0,
                              "resources": {"requests": {"cpu": "4"}, "limits": {"memory": "8Gi"}},
                              "executor": {"instances": 0, "dynamicAllocation": {"enabled": False}}}}}
    docs = render(chart, values)
    deployment, container = driver(docs, "wc")
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 0
    assert container["resources"] == {"requests": {"cpu": "4"}, "limits": {"memory": "8Gi"}}
    conf = spark_defaults(docs, "wc")
    assert conf["spark.executor.instances"] == "0" and "spark.dynamicAllocation.enabled" not in conf


def test_the_driver_role_lets_spark_manage_executors_and_nothing_else(chart):
    docs = render(chart, values_of("two-jobs-values.yaml"))
    role = only(docs, "Role", f"{FULLNAME}-driver")
    assert role["rules"] == [{
        "apiGroups": [""],
        "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
        "verbs": ["create", "get", "list", "watch", "delete", "deletecollection"],
    }]
    binding = only(docs, "RoleBinding", f"{FULLNAME}-driver")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{FULLNAME}-driver", "namespace": NAMESPACE}]
    assert not of_kind(docs, "ClusterRole") and not of_kind(docs, "ClusterRoleBinding")


def test_service_monitor_and_prometheus_rule(chart):
    docs = render(chart, values_of("monitoring-values.yaml"))
    monitor = only(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [{"port": port, "path": "/metrics", "interval": "15s",
                                             "scrapeTimeout": "10s"} for port in ("metrics", "http")]
    scraped = [s for s in of_kind(docs, "Service")
               if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert sorted(s["metadata"]["name"] for s in scraped) == [f"{FULLNAME}-exporter", f"{FULLNAME}-serve",
                                                               f"{FULLNAME}-word-counts"]
    for service in scraped:  # tidemark serve's REST catalog and /metrics share its port "http"
        assert {p["name"] for p in service["spec"]["ports"]} & {"metrics", "http"}
    rule = only(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule_file = (CHART / "alerts" / "tidemark-rules.yaml").read_text()
    assert rule["spec"] == {"groups": yaml.safe_load(rule_file)["groups"]}
    assert "{{ $labels." in rule_file  # Prometheus' templating, which Helm must leave alone
    assert only(docs, "ConfigMap", f"{FULLNAME}-rules")["data"]["tidemark-rules.yaml"].strip() == rule_file.strip()
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for alert in group["rules"]:
            assert set(alert) <= {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}
            assert alert["expr"] and ("alert" in alert) != ("record" in alert)


# -- the values schema and the cross-value rules refuse bad values with a message ------------

@pytest.mark.parametrize("values, message", [
    ({"jobs": {"wc": {"scriptPath": "/j.py", "replicas": 0}}}, "at '/jobs/wc/replicas': minimum: got 0, want 1"),
    ({"jobs": {"wc": {"scriptPath": "/j.py", "replica": 2}}}, "additional properties 'replica' not allowed"),
    ({"jobs": {"wc": {"scriptPath": "/j.py", "antiAffinity": "strict"}}}, "at '/jobs/wc/antiAffinity'"),
    ({"jobs": {"wc": {"scriptPath": "/j.py", "executor": {"memory": "4 GB"}}}}, "at '/jobs/wc/executor/memory'"),
    ({"jobs": {"wc": {"scriptPath": "/j.py", "sparkConf": {"shuffle.partitions": "8"}}}},
     "at '/jobs/wc/sparkConf': additional properties 'shuffle.partitions' not allowed"),
    ({"zookeeper": {"chroot": "tidemark"}}, "at '/zookeeper/chroot'"),
    ({"zookeeper": {"external": {"connect": "zk:2181/tidemark"}}}, "at '/zookeeper/external/connect'"),
    ({"catalog": {"uri": {"existingSecret": "Lake_Catalog"}}}, "at '/catalog/uri/existingSecret'"),
    ({"catalog": {"bundledPostgres": {"user": "Tide-Mark"}}}, "at '/catalog/bundledPostgres/user'"),
    ({"catalog": {"s3": {"credentials": {"podIdentity": "yes"}}}}, "at '/catalog/s3/credentials/podIdentity'"),
    ({"catalog": {"name": "my_lake"}}, "at '/catalog/name'"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "at '/podSecurityContext/runAsNonRoot'"),
    ({"driverMetricsPort": 80}, "at '/driverMetricsPort': minimum: got 80, want 1,024"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "at '/metrics/serviceMonitor/interval'"),
    ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
    ({"gc": {"schedule": "every ten minutes"}}, "at '/gc/schedule'"),
    ({"gc": {"orphans": {"olderThan": "12h"}}}, "at '/gc/orphans/olderThan'"),
    ({"gc": {"policy": "hourly"}}, "at '/gc/policy'"),
], ids=lambda v: None if isinstance(v, dict) else v[:40])
def test_the_schema_refuses_bad_values_naming_them(chart, values, message):
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(refused.value)


@pytest.mark.parametrize("values, message", [
    ({"zookeeper": {"bundled": {"enabled": False}}}, "zookeeper: no ensemble; set zookeeper.external.connect"),
    ({"zookeeper": {"external": {"connect": "zk:2181"}}},
     "both zookeeper.bundled.enabled and zookeeper.external.connect"),
    ({"zookeeper": {"tls": {"enabled": True, "existingSecret": "zk-tls"}}},
     "TLS is supported towards an external ensemble only"),
    ({"zookeeper": {"bundled": {"enabled": False}, "external": {"connect": "zk:2281"}, "tls": {"enabled": True}}},
     "zookeeper.tls.existingSecret: name the Secret"),
    ({"zookeeper": {"bundled": {"replicas": 2}}}, "2 servers tolerate no failure"),
    ({"catalog": {"warehouse": "hdfs://nn/warehouse"}}, "is not an s3:// location while catalog.s3.enabled=true"),
    ({"jobs": {"wc": {}}}, "jobs.wc: no driver script"),
    ({"jobs": {"wc": {"script": "print()", "scriptPath": "/j.py"}}},
     "jobs.wc: set either script (inline) or scriptPath"),
    ({"jobs": {"wc": {"scriptPath": "/j.py", "executor": {"dynamicAllocation": {"enabled": True, "minExecutors": 5}}}}},
     "jobs.wc: executor.dynamicAllocation.maxExecutors (4) is below minExecutors (5)"),
    # A job's key names Kubernetes objects: the rule, and why, in a sentence (the schema could only say "additional
    # properties not allowed").
    ({"jobs": {"Word_Counts": {"scriptPath": "/j.py"}}},
     "jobs.Word_Counts: a job's key names its Kubernetes objects (lake-tidemark-<key>), so it must be lower-case"),
    ({"jobs": {"counts_over_the_last_hour": {"scriptPath": "/j.py"}}}, "at most 20 characters"),
    ({"jobs": {"word_counts": {"scriptPath": "/j.py"}, "word-counts": {"scriptPath": "/j.py"}}},
     "jobs.word-counts and jobs.word_counts would both name their objects lake-tidemark-word-counts"),
    # Credentials: none given, or two ways at once.
    ({"catalog": {"s3": {"credentials": {"podIdentity": True}}}},
     "catalog.uri: the drivers and GC need the catalog's URI; set catalog.uri.value"),
    ({"catalog": {"uri": {"value": "postgresql://u:p@pg/lake", "existingSecret": "lake"},
                  "s3": {"credentials": {"podIdentity": True}}}}, "catalog: give the catalog one way only"),
    ({"catalog": {"uri": {"value": "https://rest/api"},
                  "rest": {"credential": {"value": "id:s", "existingSecret": "c"}},
                  "s3": {"credentials": {"podIdentity": True}}}}, "catalog.rest.credential: give value"),
    ({"catalog": {"uri": {"value": "https://rest/api"}, "warehouse": "gs://bucket/wh",
                  "s3": {"credentials": {"podIdentity": True}}}}, "is not an s3:// location"),
    ({"catalog": {"uri": {"value": "postgresql://u:p@pg/lake"}, "warehouse": "analytics",
                  "s3": {"credentials": {"podIdentity": True}}}}, "is not an s3:// location"),
    ({"catalog": {"uri": {"value": "postgresql://u:p@pg/lake"}, "bundledPostgres": {"enabled": True},
                  "s3": {"credentials": {"podIdentity": True}}}}, "catalog: give the catalog one way only"),
    ({"catalog": {"uri": {"existingSecret": "lake"}}},
     "catalog.s3.credentials: the drivers, their executors and GC need S3 credentials in exactly one way (0 given)"),
    ({"catalog": {"uri": {"existingSecret": "lake"}, "s3": {"credentials": {"existingSecret": "s3",
                                                                            "podIdentity": True}}}}, "(2 given)"),
    ({"catalog": {"uri": {"existingSecret": "lake"}, "s3": {"credentials": {"accessKeyId": "AKIA"}}}},
     "catalog.s3.credentials: set both accessKeyId and secretAccessKey, or neither"),
], ids=lambda v: None if isinstance(v, dict) else v[:40])
def test_contradicting_values_fail_with_a_sentence(chart, values, message):
    with pytest.raises(helm.HelmRenderError) as refused:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(refused.value)


def test_the_defaults_fail_saying_which_values_to_set(chart):
    """No catalog and no S3 credentials in the defaults: an install stops at once with a sentence, instead of pods
    waiting for Secrets that nothing creates."""
    with pytest.raises(helm.HelmRenderError) as refused:
        chart.render({}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    message = str(refused.value)
    assert "catalog.uri.value" in message and "catalog.bundledPostgres.enabled=true" in message
    assert "helm/tidemark/examples/" in message
    assert chart.values["catalog"]["uri"]["existingSecret"] == ""
    assert chart.values["catalog"]["s3"]["credentials"]["existingSecret"] == ""


def test_the_chart_creates_the_secrets_whose_content_values_give(chart):
    values = values_of("monitoring-values.yaml")
    docs = render(chart, values)
    catalog, s3 = only(docs, "Secret", f"{FULLNAME}-catalog"), only(docs, "Secret", f"{FULLNAME}-s3")
    assert catalog["stringData"] == {"uri": values["catalog"]["uri"]["value"]} and catalog["type"] == "Opaque"
    assert s3["stringData"] == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "example-secret-key"}
    _, container = driver(docs, "word-counts")
    env = env_of(container)
    assert env["TIDEMARK_CATALOG_URI"]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-catalog", "key": "uri"}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-s3",
                                                                         "key": "AWS_SECRET_ACCESS_KEY"}
    assert spark_defaults(docs, "word-counts")["spark.kubernetes.executor.secretKeyRef.AWS_ACCESS_KEY_ID"] == \
        f"{FULLNAME}-s3:AWS_ACCESS_KEY_ID"
    gc = env_of(only(docs, "CronJob", f"{FULLNAME}-gc")["spec"]["jobTemplate"]["spec"]["template"]["spec"][
        "containers"][0])
    assert gc["TIDEMARK_CATALOG_URI"] == env["TIDEMARK_CATALOG_URI"]
    assert gc["AWS_ACCESS_KEY_ID"] == env["AWS_ACCESS_KEY_ID"]
    # A Secret named in values is the operator's: the chart creates none of its own then (it makes up serve's token).
    assert [s["metadata"]["name"] for s in of_kind(render(chart, values_of("two-jobs-values.yaml")), "Secret")] == \
        [f"{FULLNAME}-serve-auth"]


def test_the_bundled_postgres_catalog_gets_a_password_and_the_uri_the_drivers_read(chart):
    docs = render(chart, values_of("bundled-zk-auth-values.yaml"))
    name = f"{FULLNAME}-postgres"
    secret = only(docs, "Secret", name)
    password = secret["stringData"]["password"]
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)
    assert secret["stringData"]["uri"] == f"postgresql://tidemark:{password}@{name}.{NAMESPACE}.svc:5432/lake"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # a reinstall finds the volume's
    server = only(docs, "StatefulSet", name)
    assert server["spec"]["replicas"] == 1
    (container,) = server["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "password"}
    assert only(docs, "Service", name)["spec"]["ports"][0]["port"] == 5432
    _, driver_container = driver(docs, "word-counts")
    assert env_of(driver_container)["TIDEMARK_CATALOG_URI"]["valueFrom"]["secretKeyRef"] == {"name": name,
                                                                                            "key": "uri"}


def test_a_job_key_with_an_underscore_names_its_objects_with_a_dash(chart):
    docs = render(chart, values_of(EXAMPLES[0]))
    deployment, container = driver(docs, "region_totals")
    assert deployment["metadata"]["name"] == f"{FULLNAME}-region-totals"
    assert deployment["spec"]["selector"]["matchLabels"]["tidemark.io/job"] == "region-totals"
    assert container["args"] == ["job", "/etc/tidemark/job/job.py", "region_totals"]
    only(docs, "Service", f"{FULLNAME}-region-totals")
    notes = chart.render(values_of(EXAMPLES[0]), name=RELEASE, namespace=NAMESPACE)["tidemark/templates/NOTES.txt"]
    assert f"deployment/{FULLNAME}-region-totals: 2 replicas" in notes


def example_script() -> str:
    jobs = yaml.safe_load((CHART / "examples" / "pipeline-values.yaml").read_text())["jobs"]
    assert jobs["events"]["script"] == jobs["region_totals"]["script"]  # one script, the job named by its argument
    return jobs["events"]["script"]


def test_the_example_installs_as_its_header_says(chart):
    """As it is, the example stops at the one thing it cannot know (the object store), naming the values; with the
    header's command-line values it renders a pipeline: ZooKeeper, PostgreSQL, both jobs, the exporter."""
    text = (CHART / "examples" / "pipeline-values.yaml").read_text()
    for flag in ("--set catalog.warehouse=", "--set catalog.s3.credentials.accessKeyId=",
                 "--set catalog.s3.credentials.secretAccessKey=", "--set image.repository="):
        assert flag in text, flag
    with pytest.raises(helm.HelmRenderError, match=r"catalog\.s3\.credentials: .* exactly one way"):
        chart.render(yaml.safe_load(text), name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = render(chart, values_of(EXAMPLES[0]))
    for kind, name in (("StatefulSet", "zookeeper"), ("StatefulSet", "postgres"), ("Deployment", "exporter"),
                       ("Deployment", "events"), ("Deployment", "region-totals"), ("Secret", "s3")):
        only(docs, kind, f"{FULLNAME}-{name}")
    assert only(docs, "ConfigMap", f"{FULLNAME}-events")["data"]["job.py"] == example_script()
    compile(example_script(), "pipeline-values.yaml:jobs.events.script", "exec")


def test_chart_version_follows_the_package_version(chart):
    version = present(re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)).group(1)
    assert chart.metadata["version"] == version
    assert chart.metadata["appVersion"] == version
    assert chart.metadata["kubeVersion"].startswith(">=1.25")
    assert not (ROOT / "helm" / "tidemark-job").exists()


# -- the image ------------------------------------------------------------------------------

DOCKER = ROOT / "docker"


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def test_the_image_runs_as_the_non_root_user_the_chart_expects(chart):
    users = [args for op, args in final_stage() if op == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric uid so that runAsNonRoot can check it"
    assert int(uid) == chart.values["podSecurityContext"]["runAsUser"]


def test_the_image_has_spark_iceberg_s3_and_an_entrypoint():
    stage = final_stage()
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-", text, re.M)
    assert "pip install --no-cache-dir '.[spark]' \"pyspark==${PYSPARK_VERSION}\"" in text
    # The jars come as make setup gets them (Maven Central, checked), into the cache build_spark_session reads.
    assert "TIDEMARK_CACHE=/opt/tidemark/cache python -m tools.jars install" in text
    assert "COPY --from=build /opt/tidemark/cache /opt/tidemark/cache" in text
    assert re.search(r"^\s*TIDEMARK_CACHE=/opt/tidemark/cache\b", text, re.M), "the drivers must read that cache"
    assert "jarjar" not in text and "snowpark" not in text
    (entrypoint,) = [args for op, args in stage if op == "ENTRYPOINT"]
    assert entrypoint.startswith("["), "exec form, so that SIGTERM reaches the driver"
    assert yaml.safe_load(entrypoint) == ["/usr/bin/tini", "--", "/usr/local/bin/tidemark-entrypoint"]
    assert "COPY --chmod=0755 docker/entrypoint.sh /usr/local/bin/tidemark-entrypoint" in text


def test_the_build_context_sends_what_the_dockerfile_copies():
    allowed = {line[1:].rstrip("/") for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")}
    copied: set[str] = set()
    for op, args in dockerfile_instructions():
        words = args.split()
        if op == "COPY" and not any(w.startswith("--from") for w in words):
            copied.update(w for w in words[:-1] if not w.startswith("--"))
    assert copied and copied <= allowed, f"{sorted(copied - allowed)} are left out of the build context"


def run_entrypoint(*args, env=None, timeout=60):
    # The image's python3 and tidemark come first on PATH; here, this interpreter's.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PATH": path, **(env or {})})


def test_the_entrypoint_runs_a_job_script(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import sys; print('job', sys.argv[1:]); sys.exit(3)\n")
    done = run_entrypoint("job", str(script), "--interval-ms", "500")
    assert done.returncode == 3 and "job ['--interval-ms', '500']" in done.stdout


def test_the_entrypoint_explains_its_usage_and_missing_inputs(tmp_path):
    done = run_entrypoint("job", str(tmp_path / "missing.py"))
    assert done.returncode == 2 and "no job script at" in done.stderr
    done = run_entrypoint("executor", env={"SPARK_DRIVER_URL": ""})
    assert done.returncode == 2 and "SPARK_DRIVER_URL" in done.stderr
    done = run_entrypoint()
    assert done.returncode == 2 and "usage:" in done.stderr


def test_the_example_pipeline_script_runs_both_jobs_consistently(zk_connect, tmp_path):
    """The example's script as the chart mounts it, run as the two drivers the chart starts (one per job), against
    a real ZooKeeper and a real catalog (the embedded SQLite one, where the chart gives PostgreSQL and S3): both
    jobs commit, region_totals' consistent version sums exactly the events of its epochs, and SIGTERM ends both
    drivers cleanly."""
    import signal

    from coordinator import CatalogSettings, Resolver, Tidemark, read_arrow
    from tests.helpers.wait import wait_for

    script = tmp_path / "job.py"
    script.write_text(example_script())
    home = tmp_path / "home"
    # The chart's catalog, PostgreSQL's database, is there before the drivers start; so is its stand-in here: the
    # drivers' CatalogSettings.from_env() never creates a catalog.
    settings = CatalogSettings.embedded(home)
    settings.load()
    env = {**os.environ, "TIDEMARK_ZK": zk_connect, "TIDEMARK_HOME": str(home)}
    for name in ("TIDEMARK_CATALOG_URI", "TIDEMARK_WAREHOUSE", "TIDEMARK_CATALOG_NAME"):
        env.pop(name, None)
    drivers = [subprocess.Popen([sys.executable, str(script), job], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for job in ("events", "region_totals")]
    try:
        with Tidemark.connect(zk_connect) as tm:
            def committed() -> bool:
                for process in drivers:
                    assert process.poll() is None, f"a driver exited: {present(process.stderr).read()}"
                jobs = tm.status().jobs
                return len(jobs) == 2 and all(job.committed_epoch is not None for job in jobs)
            wait_for(committed, "both example jobs to commit an epoch", timeout=120, every=0.5)
            resolver = Resolver(settings.load(), settings, tm)
            version = resolver.resolve(["demo.events", "demo.region_totals"], level="consistent")
            tables = read_arrow(resolver, version)
    finally:
        for process in drivers:
            process.send_signal(signal.SIGTERM)
        for process in drivers:
            process.wait(60)
    assert [p.returncode for p in drivers] == [0, 0], [present(p.stderr).read()[-2000:] for p in drivers]
    events, totals = tables["demo.events"], tables["demo.region_totals"]
    assert totals.num_rows > 0 and sum(totals["orders"].to_pylist()) == events.num_rows
    assert sum(totals["amount"].to_pylist()) == sum(events["amount"].to_pylist())
