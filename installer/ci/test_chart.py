"""Checks of installer/chart: lint, render every mode, validate every object offline against
Kubernetes 1.33 (our CRD's schema for Sandbox objects), and assert the pod contract.

Run through installer/ci/check-chart.sh, which puts helm on PATH and kubernetes-validate on
PYTHONPATH (installer/ci/setup-tools.sh installs both).
"""

import copy
import json
import os
import subprocess
import unittest
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "installer" / "chart"
EXAMPLE = REPO / "installer" / "examples" / "sandbox.yaml"
HELM = os.environ.get("HELM", "helm")
KUBE = "1.33"
NS = "openshell-runtime"
SANDBOX_NS = "openshell"
HOSTPATH = "/opt/openshell/bin"
API_VERSIONS = ["agents.x-k8s.io/v1alpha1", "agents.x-k8s.io/v1alpha1/Sandbox"]

EXTERNAL = [
    "runtime.sandbox.inCluster.enabled=false",
    "runtime.sandbox.external.enabled=true",
    "runtime.sandbox.external.endpoint=https://gateway.example.com:8443",
]
MODES = {
    "in-cluster": [],
    "external": EXTERNAL,
    "off": ["runtime.sandbox.enabled=false"],
    "host": ["runtime.sandbox.hostGatewayIP=172.17.0.1"],
    "host-external": EXTERNAL + ["runtime.sandbox.hostGatewayIP=fd00::1"],
    "operator-preinstalled": ["agentSandbox.enabled=false"],
    "init-container-delivery": [
        "openshell.supervisorDelivery=initContainer",
        "openshell.image.tag=0.0.111",
    ],
    "plaintext": ["openshell.tls.enabled=false"],
    "plaintext-token-issuing": [
        "openshell.supervisorDelivery=initContainer",
        "openshell.image.tag=0.0.111",
        "openshell.tls.enabled=false",
        "openshell.tls.sandboxImageAllowsPlaintextToken=true",
    ],
    "host-external-plaintext": EXTERNAL[:2] + [
        "runtime.sandbox.external.endpoint=http://host.docker.internal:8080",
        "runtime.sandbox.hostGatewayIP=172.17.0.1",
    ],
}


def helm(*args, check=True):
    p = subprocess.run([HELM, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def render(sets, api_versions=True, check=True):
    args = ["template", "rel", str(CHART), "--namespace", NS, "--kube-version", KUBE]
    if api_versions:
        for v in API_VERSIONS:
            args += ["--api-versions", v]
    for s in sets:
        args += ["--set", s]
    p = helm(*args, check=check)
    if not check:
        return p
    return [d for d in yaml.safe_load_all(p.stdout) if d]


_RENDERS = {}


def rendered(mode):
    if mode not in _RENDERS:
        _RENDERS[mode] = render(MODES[mode])
    return _RENDERS[mode]


def find(docs, kind, name=None, namespace=None):
    out = [
        d
        for d in docs
        if d["kind"] == kind
        and (name is None or d["metadata"]["name"] == name)
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]
    return out


def one(docs, kind, name=None, namespace=None):
    found = find(docs, kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {name or ''} in {namespace or 'any namespace'}, found {len(found)}"
    return found[0]


def crd_schema():
    return yaml.safe_load((CHART / "files" / "sandbox-openapi-schema.yaml").read_text())


def strict_json_schema(node):
    """The CRD's OpenAPI schema as JSON Schema that, like the API server's strict field
    validation, rejects fields the schema does not declare (unless it preserves them)."""
    node = copy.deepcopy(node)
    preserve = node.pop("x-kubernetes-preserve-unknown-fields", False)
    for k in [k for k in node if k.startswith("x-kubernetes-")]:
        node.pop(k)
    node.pop("default", None)
    if "properties" in node:
        node["properties"] = {k: strict_json_schema(v) for k, v in node["properties"].items()}
        if not preserve and "additionalProperties" not in node:
            node["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = strict_json_schema(node["additionalProperties"])
    if "items" in node:
        node["items"] = strict_json_schema(node["items"])
    return node


def validate_sandbox(obj):
    """A Sandbox against our CRD's schema, and its pod spec against Kubernetes' own PodSpec."""
    checker = jsonschema.Draft7Validator(
        strict_json_schema(crd_schema()), format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )
    errors = sorted(checker.iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        raise AssertionError(
            "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
        )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sandbox-pod-check", **obj["spec"]["podTemplate"].get("metadata", {})},
        "spec": obj["spec"]["podTemplate"]["spec"],
    }
    kubernetes_validate.validate(pod, KUBE, strict=True)


def validate_object(doc):
    if doc["apiVersion"].split("/")[0] == "agents.x-k8s.io":
        validate_sandbox(doc)
    else:
        kubernetes_validate.validate(doc, KUBE, strict=True)


class Lint(unittest.TestCase):
    def test_lint_strict_in_every_mode(self):
        for mode, sets in MODES.items():
            with self.subTest(mode=mode):
                args = ["lint", "--strict", str(CHART), "--namespace", NS, "--kube-version", KUBE]
                for s in sets:
                    args += ["--set", s]
                if mode == "operator-preinstalled":
                    # lint has no --api-versions; the capability check is tested below.
                    continue
                helm(*args)


class Validate(unittest.TestCase):
    def test_every_rendered_object_is_valid_for_kubernetes_1_33(self):
        for mode in MODES:
            for doc in rendered(mode):
                with self.subTest(mode=mode, kind=doc["kind"], name=doc["metadata"]["name"]):
                    validate_object(doc)

    def test_the_validator_catches_mistakes(self):
        # Guard against a validator that accepts anything.
        ds = copy.deepcopy(one(rendered("in-cluster"), "DaemonSet"))
        ds["spec"]["template"]["spec"]["toleration"] = ds["spec"]["template"]["spec"].pop("tolerations")
        with self.assertRaises(kubernetes_validate.ValidationError):
            validate_object(ds)
        sts = copy.deepcopy(one(rendered("in-cluster"), "StatefulSet"))
        sts["spec"]["replicas"] = "one"
        with self.assertRaises(kubernetes_validate.ValidationError):
            validate_object(sts)

    def test_every_object_has_an_explicit_namespace_unless_cluster_scoped(self):
        cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
        for mode in MODES:
            for doc in rendered(mode):
                with self.subTest(mode=mode, kind=doc["kind"], name=doc["metadata"]["name"]):
                    if doc["kind"] in cluster_scoped:
                        self.assertNotIn("namespace", doc["metadata"])
                    else:
                        self.assertTrue(doc["metadata"].get("namespace"))

    def test_the_example_sandbox_matches_our_crd_and_pod_spec(self):
        example = yaml.safe_load(EXAMPLE.read_text())
        validate_sandbox(example)

    def test_the_crd_schema_rejects_what_the_api_server_would(self):
        good = yaml.safe_load(EXAMPLE.read_text())
        bad_cases = {
            "unknown spec field": lambda s: s["spec"].__setitem__("replica", 1),
            "missing podTemplate": lambda s: s["spec"].pop("podTemplate"),
            "replicas above one": lambda s: s["spec"].__setitem__("replicas", 2),
            "bad shutdownPolicy": lambda s: s["spec"].__setitem__("shutdownPolicy", "Never"),
            "no containers": lambda s: s["spec"]["podTemplate"]["spec"].__setitem__("containers", []),
            "pod spec typo": lambda s: s["spec"]["podTemplate"]["spec"].__setitem__("volume", []),
        }
        for what, mutate in bad_cases.items():
            with self.subTest(what):
                bad = copy.deepcopy(good)
                mutate(bad)
                with self.assertRaises(Exception):
                    validate_sandbox(bad)

    def test_the_crd_schema_is_structural(self):
        def walk(node, path):
            if node.get("x-kubernetes-preserve-unknown-fields") and "type" not in node:
                return
            self.assertIn("type", node, f"{path} has no type")
            for k, v in node.get("properties", {}).items():
                walk(v, f"{path}.{k}")
            if isinstance(node.get("additionalProperties"), dict):
                walk(node["additionalProperties"], f"{path}[*]")
            if "items" in node:
                walk(node["items"], f"{path}[]")

        walk(crd_schema(), "")
        crd = one(rendered("in-cluster"), "CustomResourceDefinition")
        versions = {v["name"]: v for v in crd["spec"]["versions"]}
        self.assertEqual(sorted(versions), ["v1alpha1", "v1beta1"])
        self.assertEqual([n for n, v in versions.items() if v["storage"]], ["v1alpha1"])
        for v in versions.values():
            self.assertEqual(v["schema"]["openAPIV3Schema"], crd_schema())
        self.assertEqual(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep")


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


class Contract(unittest.TestCase):
    def test_node_installer_and_sandbox_pods_share_the_hostpath(self):
        docs = rendered("in-cluster")
        ds = one(docs, "DaemonSet", "openshell-node-installer", NS)
        spec = ds["spec"]["template"]["spec"]
        (vol,) = [v for v in spec["volumes"] if "hostPath" in v]
        self.assertEqual(vol["hostPath"], {"path": HOSTPATH, "type": "DirectoryOrCreate"})

        example = yaml.safe_load(EXAMPLE.read_text())
        pod = example["spec"]["podTemplate"]["spec"]
        (svol,) = [v for v in pod["volumes"] if "hostPath" in v]
        self.assertEqual(svol["hostPath"]["path"], vol["hostPath"]["path"])
        agent = pod["containers"][0]
        (mount,) = [m for m in agent["volumeMounts"] if m["name"] == svol["name"]]
        self.assertEqual((mount["mountPath"], mount["readOnly"]), (HOSTPATH, True))
        self.assertEqual(agent["command"], [f"{HOSTPATH}/openshell-sandbox"])

        # The installer writes where the pods read: DEST/openshell-sandbox.
        (init,) = spec["initContainers"]
        dest = init["args"][init["args"].index("--dest") + 1]
        (imount,) = [m for m in init["volumeMounts"] if m["name"] == vol["name"]]
        self.assertEqual(imount["mountPath"], dest)
        self.assertFalse(imount.get("readOnly", False))

    def test_node_installer_shape_and_least_privilege(self):
        ds = one(rendered("in-cluster"), "DaemonSet", "openshell-node-installer", NS)
        spec = ds["spec"]["template"]["spec"]
        self.assertEqual(ds["spec"]["updateStrategy"], {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})
        self.assertEqual(spec["priorityClassName"], "system-node-critical")
        self.assertEqual(spec["tolerations"], [{"operator": "Exists"}])
        self.assertIs(spec["automountServiceAccountToken"], False)
        for key in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"):
            self.assertNotIn(key, spec)
        (init,) = spec["initContainers"]
        (main,) = spec["containers"]
        self.assertEqual(init["args"][:1], ["install"])
        self.assertNotIn("--wait", init["args"])
        self.assertEqual(main["args"][:2], ["install", "--wait"])
        probe = main["readinessProbe"]["exec"]["command"]
        self.assertEqual(probe[:3], ["/openshell-sandbox", "install", "--verify"])
        self.assertEqual(probe[probe.index("--dest") + 1], init["args"][init["args"].index("--dest") + 1])
        for c in (init, main):
            sc = c["securityContext"]
            self.assertEqual(sc["capabilities"], {"drop": ["ALL"]})
            self.assertIs(sc["privileged"], False)
            self.assertIs(sc["allowPrivilegeEscalation"], False)
            self.assertIs(sc["readOnlyRootFilesystem"], True)
            self.assertEqual(c["image"], "ghcr.io/openshell-sandbox/openshell-sandbox:0.1.0")
        self.assertTrue(all(m.get("readOnly") for m in main["volumeMounts"]))

    def test_gateway_service_statefulset_and_env(self):
        docs = rendered("in-cluster")
        svc = one(docs, "Service", "openshell", NS)
        self.assertEqual([(p["name"], p["port"]) for p in svc["spec"]["ports"]], [("grpc", 8080)])
        sts = one(docs, "StatefulSet", "openshell", NS)
        labels = sts["spec"]["template"]["metadata"]["labels"]
        self.assertTrue(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()))
        pod = sts["spec"]["template"]["spec"]
        (gw,) = pod["containers"]
        self.assertEqual(gw["image"], "ghcr.io/nvidia/openshell/gateway:0.0.36")
        self.assertEqual({p["containerPort"] for p in gw["ports"]}, {8080, 8081})
        self.assertEqual(gw["args"], ["--port", "8080", "--health-port", "8081", "--log-level", "info",
                                      "--db-url", "sqlite:/var/openshell/openshell.db"])
        env = env_of(gw)
        self.assertEqual(env["OPENSHELL_SANDBOX_NAMESPACE"], SANDBOX_NS)
        self.assertEqual(env["OPENSHELL_GRPC_ENDPOINT"], f"https://openshell.{NS}.svc.cluster.local:8080")
        self.assertEqual(env["OPENSHELL_TLS_CERT"], "/etc/openshell-tls/server/tls.crt")
        self.assertEqual(env["OPENSHELL_TLS_KEY"], "/etc/openshell-tls/server/tls.key")
        self.assertEqual(env["OPENSHELL_TLS_CLIENT_CA"], "/etc/openshell-tls/client-ca/ca.crt")
        self.assertEqual(env["OPENSHELL_CLIENT_TLS_SECRET_NAME"], "openshell-client-tls")
        self.assertEqual(env["OPENSHELL_SSH_HANDSHAKE_SECRET"],
                         {"secretKeyRef": {"name": "openshell-ssh-handshake", "key": "secret"}})
        self.assertNotIn("OPENSHELL_SUPERVISOR_SIDELOAD_METHOD", env)
        self.assertNotIn("hostAliases", pod)
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        self.assertEqual(sorted(secrets.values()), ["openshell-server-client-ca", "openshell-server-tls"])
        self.assertEqual(pod["securityContext"]["runAsUser"], 1000)
        self.assertEqual(pod["securityContext"]["fsGroup"], 1000)
        self.assertEqual(gw["securityContext"]["capabilities"], {"drop": ["ALL"]})
        for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            self.assertEqual(gw[probe]["httpGet"], {"path": path, "port": "health"})

    def test_client_secret_reaches_both_namespaces(self):
        docs = rendered("in-cluster")
        job = one(docs, "Job", "openshell-certs", NS)
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        opt = lambda name: args[args.index(name) + 1]
        self.assertEqual(args[:3], ["certs", "generate", "--in-cluster"])
        self.assertEqual(opt("--namespace"), NS)
        self.assertEqual(opt("--sandbox-namespace"), SANDBOX_NS)
        self.assertEqual(opt("--client-secret"), "openshell-client-tls")
        self.assertEqual(opt("--client-ca-secret"), "openshell-server-client-ca")
        self.assertEqual(opt("--service-name"), "openshell")
        self.assertEqual(job["metadata"]["annotations"]["helm.sh/hook"], "pre-install,pre-upgrade")
        self.assertEqual(job["spec"]["template"]["spec"]["serviceAccountName"], "openshell-certs")
        # RBAC lets the Job create (and read, and roll back) the client Secret in each namespace.
        for ns in (NS, SANDBOX_NS):
            with self.subTest(namespace=ns):
                role = one(docs, "Role", "openshell-certs", ns)
                named = [r for r in role["rules"] if r.get("resourceNames")]
                self.assertIn("openshell-client-tls", named[0]["resourceNames"])
                self.assertIn("openshell-server-client-ca", named[0]["resourceNames"])
                self.assertEqual(sorted(named[0]["verbs"]), ["delete", "get"])
                self.assertTrue(any(r["verbs"] == ["create"] and r["resources"] == ["secrets"] for r in role["rules"]))
                rb = one(docs, "RoleBinding", "openshell-certs", ns)
                self.assertEqual(rb["subjects"], [{"kind": "ServiceAccount", "name": "openshell-certs", "namespace": NS}])
        # The runtime is told which Secret to mount.
        cm = one(docs, "ConfigMap", "openshell-runtime", NS)
        self.assertEqual(cm["data"]["OPENSHELL_CLIENT_TLS_SECRET"], "openshell-client-tls")

    def test_hooks_run_in_dependency_order(self):
        docs = rendered("in-cluster")
        weight = lambda d: int(d["metadata"]["annotations"]["helm.sh/hook-weight"])
        ns = one(docs, "Namespace", SANDBOX_NS)
        self.assertEqual(ns["metadata"]["annotations"]["helm.sh/hook"], "pre-install")
        self.assertNotIn("before-hook-creation", ns["metadata"]["annotations"]["helm.sh/hook-delete-policy"])
        self.assertEqual(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged")
        job = one(docs, "Job", "openshell-certs")
        for kind in ("ServiceAccount", "Role", "RoleBinding"):
            for d in find(docs, kind, "openshell-certs"):
                self.assertLess(weight(ns), weight(d))
                self.assertLess(weight(d), weight(job))

    def test_gateway_role_in_the_sandbox_namespace(self):
        docs = rendered("in-cluster")
        role = one(docs, "Role", "openshell-gateway", SANDBOX_NS)
        rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in role["rules"]}
        self.assertEqual(rules[(("agents.x-k8s.io",), ("sandboxes", "sandboxes/status"))],
                         ["create", "delete", "get", "list", "patch", "update", "watch"])
        self.assertEqual(rules[(("",), ("events",))], ["get", "list", "watch"])
        self.assertEqual(rules[(("",), ("pods",))], ["get"])
        rb = one(docs, "RoleBinding", "openshell-gateway", SANDBOX_NS)
        self.assertEqual(rb["subjects"], [{"kind": "ServiceAccount", "name": "openshell", "namespace": NS}])
        one(docs, "ServiceAccount", "openshell", NS)

    def test_agent_sandbox_operator(self):
        docs = rendered("in-cluster")
        dep = one(docs, "Deployment", "agent-sandbox-controller", "agent-sandbox-system")
        image = dep["spec"]["template"]["spec"]["containers"][0]["image"]
        self.assertTrue(image.startswith("registry.k8s.io/agent-sandbox/agent-sandbox-controller:v"), image)
        self.assertNotIn("latest", image)
        one(docs, "Namespace", "agent-sandbox-system")
        cr = one(docs, "ClusterRole", "agent-sandbox-controller")
        granted = {(g, r) for rule in cr["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
        for need in [("", "pods"), ("", "services"), ("", "persistentvolumeclaims"), ("", "events"),
                     ("agents.x-k8s.io", "sandboxes"), ("agents.x-k8s.io", "sandboxes/status"),
                     ("agents.x-k8s.io", "sandboxes/finalizers"), ("coordination.k8s.io", "leases")]:
            self.assertIn(need, granted)
        crb = one(docs, "ClusterRoleBinding", "agent-sandbox-controller")
        self.assertEqual(crb["subjects"][0]["namespace"], "agent-sandbox-system")

    def test_operator_can_be_left_to_the_cluster(self):
        docs = rendered("operator-preinstalled")
        self.assertEqual(find(docs, "CustomResourceDefinition"), [])
        self.assertEqual(find(docs, "Deployment"), [])
        one(docs, "StatefulSet", "openshell")
        # Without the API served, the chart refuses to install a gateway with no operator.
        p = render(MODES["operator-preinstalled"], api_versions=False, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("does not serve agents.x-k8s.io/v1alpha1 Sandbox", p.stderr)

    def test_external_mode_renders_no_gateway(self):
        docs = rendered("external")
        kinds = sorted(d["kind"] for d in docs)
        self.assertEqual(kinds, ["ConfigMap"], f"external mode rendered {kinds}")
        cm = one(docs, "ConfigMap", "openshell-runtime", NS)
        self.assertEqual(cm["data"]["OPENSHELL_GATEWAY_ENDPOINT"], "https://gateway.example.com:8443")

    def test_in_cluster_mode_points_the_runtime_at_the_service(self):
        cm = one(rendered("in-cluster"), "ConfigMap", "openshell-runtime", NS)
        self.assertEqual(cm["data"]["OPENSHELL_GATEWAY_ENDPOINT"], f"https://openshell.{NS}.svc.cluster.local:8080")
        self.assertEqual(cm["data"]["OPENSHELL_GATEWAY_MTLS_DIR"], ".config/openshell/gateways/openshell/mtls")

    def test_runs_in_every_pod_of_a_node_share_one_uid_lease_dir(self):
        # The default is the node-wide path the README's runtime Deployment mounts by hostPath.
        for mode in ("in-cluster", "external"):
            cm = one(rendered(mode), "ConfigMap", "openshell-runtime", NS)
            self.assertEqual(cm["data"]["OPENSHELL_SANDBOX_UID_LEASE_DIR"], "/run/openshell-sandbox-uids")
        docs = render(["runtime.sandbox.uidLeaseDir=/var/lib/openshell/uids"])
        cm = one(docs, "ConfigMap", "openshell-runtime", NS)
        self.assertEqual(cm["data"]["OPENSHELL_SANDBOX_UID_LEASE_DIR"], "/var/lib/openshell/uids")
        p = render(["runtime.sandbox.uidLeaseDir=relative/dir"], check=False)
        self.assertNotEqual(p.returncode, 0, "a relative lease directory was accepted")
        readme = (CHART / "README.md").read_text()
        self.assertIn("path: /run/openshell-sandbox-uids\n            type: DirectoryOrCreate", readme)

    def test_off_mode_renders_nothing(self):
        self.assertEqual(rendered("off"), [])
        p = render(MODES["off"], check=False)
        self.assertEqual(p.stdout.strip(), "")

    def test_host_mode_adds_host_aliases(self):
        docs = rendered("host")
        pod = one(docs, "StatefulSet", "openshell")["spec"]["template"]["spec"]
        self.assertEqual(pod["hostAliases"], [{"ip": "172.17.0.1", "hostnames": ["host.docker.internal", "host.openshell.internal"]}])
        self.assertEqual(env_of(pod["containers"][0])["OPENSHELL_HOST_GATEWAY_IP"], "172.17.0.1")
        self.assertEqual(one(docs, "ConfigMap")["data"]["OPENSHELL_HOST_GATEWAY_IP"], "172.17.0.1")
        ext = one(rendered("host-external"), "ConfigMap")
        self.assertEqual(ext["data"]["OPENSHELL_HOST_GATEWAY_IP"], "fd00::1")

    def test_newer_gateway_gets_the_supervisor_by_init_container(self):
        docs = rendered("init-container-delivery")
        gw = one(docs, "StatefulSet", "openshell")["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(gw["image"], "ghcr.io/nvidia/openshell/gateway:0.0.111")
        env = env_of(gw)
        self.assertEqual(env["OPENSHELL_SUPERVISOR_SIDELOAD_METHOD"], "init-container")
        self.assertEqual(env["OPENSHELL_SUPERVISOR_IMAGE"], "ghcr.io/openshell-sandbox/openshell-sandbox:0.1.0")
        p = render(MODES["init-container-delivery"] + ["openshell.supervisorDelivery=imageVolume"], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("supervisorDelivery", p.stderr)

    def test_plaintext_gateway_has_no_tls_and_sandboxes_dial_http(self):
        docs = rendered("plaintext")
        pod = one(docs, "StatefulSet", "openshell")["spec"]["template"]["spec"]
        env = env_of(pod["containers"][0])
        self.assertEqual(env["OPENSHELL_DISABLE_TLS"], "true")
        self.assertEqual(env["OPENSHELL_GRPC_ENDPOINT"], f"http://openshell.{NS}.svc.cluster.local:8080")
        for tls_var in ("OPENSHELL_TLS_CERT", "OPENSHELL_TLS_KEY", "OPENSHELL_TLS_CLIENT_CA",
                        "OPENSHELL_CLIENT_TLS_SECRET_NAME"):
            self.assertNotIn(tls_var, env)
        self.assertEqual([v for v in pod["volumes"] if "secret" in v], [])
        self.assertEqual([m["name"] for m in pod["containers"][0]["volumeMounts"]], ["data", "tmp"])
        cm = one(docs, "ConfigMap", "openshell-runtime", NS)["data"]
        self.assertEqual(cm["OPENSHELL_GATEWAY_ENDPOINT"], f"http://openshell.{NS}.svc.cluster.local:8080")
        # Nothing to mount for a plaintext endpoint.
        self.assertNotIn("OPENSHELL_GATEWAY_MTLS_DIR", cm)
        self.assertNotIn("OPENSHELL_CLIENT_TLS_SECRET", cm)
        self.assertNotIn("OPENSHELL_GATEWAY_MTLS_DIR", one(rendered("host-external-plaintext"), "ConfigMap")["data"])

    def test_plaintext_with_a_token_issuing_gateway_needs_the_image_opt_in(self):
        # Newer gateways give each sandbox a token that the supervisor will not send in clear
        # over the pod network without OPENSHELL_ALLOW_PLAINTEXT_TOKEN, which only the sandbox
        # image can carry: the chart refuses until the operator says the image has it.
        without = [s for s in MODES["plaintext-token-issuing"] if "sandboxImageAllowsPlaintextToken" not in s]
        p = render(without, check=False)
        self.assertNotEqual(p.returncode, 0)
        for want in ("OPENSHELL_ALLOW_PLAINTEXT_TOKEN=1", "openshell.tls.sandboxImageAllowsPlaintextToken=true",
                     "openshell.sandboxImage"):
            self.assertIn(want, p.stderr)
        env = env_of(one(rendered("plaintext-token-issuing"), "StatefulSet", "openshell")
                     ["spec"]["template"]["spec"]["containers"][0])
        self.assertEqual(env["OPENSHELL_DISABLE_TLS"], "true")
        self.assertEqual(env["OPENSHELL_SUPERVISOR_SIDELOAD_METHOD"], "init-container")


class Schema(unittest.TestCase):
    def rejects(self, sets, message):
        p = render(sets, check=False)
        self.assertNotEqual(p.returncode, 0, f"accepted {sets}")
        self.assertIn("values don't meet the specifications of the schema", p.stderr)
        self.assertIn(message, p.stderr)

    def test_external_without_endpoint(self):
        self.rejects(EXTERNAL[:2], "runtime.sandbox.external.endpoint is required when runtime.sandbox.external.enabled is true")

    def test_both_in_cluster_and_external(self):
        self.rejects(EXTERNAL[1:], "runtime.sandbox.inCluster.enabled and runtime.sandbox.external.enabled are both true; choose one mode")

    def test_enabled_without_a_mode(self):
        self.rejects(["runtime.sandbox.inCluster.enabled=false"], "neither inCluster.enabled nor external.enabled is")

    def test_malformed_endpoints(self):
        for bad in ["ftp://gw:8080", "gateway.example.com:8080", "https://gw:8080/path", "https://bad_host", "https://gw:0"]:
            with self.subTest(bad):
                self.rejects(EXTERNAL[:2] + [f"runtime.sandbox.external.endpoint={bad}"], "/runtime/sandbox/external/endpoint")

    def test_malformed_ips(self):
        for bad in ["300.1.1.1", "1.2.3", "host.docker.internal", "fd00:::1", "1.2.3.4/24"]:
            with self.subTest(bad):
                self.rejects([f"runtime.sandbox.hostGatewayIP={bad}"], "/runtime/sandbox/hostGatewayIP")

    def test_typos_are_rejected(self):
        self.rejects(["runtime.sandbox.inCluster.enable=true"], "additional properties 'enable' not allowed")
        self.rejects(["nodeInstaller.hostpath=/x"], "additional properties 'hostpath' not allowed")
        self.rejects(["openshell.tls.enable=false"], "additional properties 'enable' not allowed")
        self.rejects(["openshell.tls.enabled=no"], "/openshell/tls/enabled")

    def test_good_values_pass(self):
        for good in [["runtime.sandbox.hostGatewayIP=10.0.0.1"], ["runtime.sandbox.hostGatewayIP=::1"],
                     EXTERNAL[:2] + ["runtime.sandbox.external.endpoint=http://[fd00::1]:8080"],
                     EXTERNAL[:2] + ["runtime.sandbox.external.endpoint=https://10.1.2.3"]]:
            with self.subTest(good):
                render(good)


if __name__ == "__main__":
    unittest.main(verbosity=2)
