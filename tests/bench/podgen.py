"""Realistic pod JSON for benchmarks: the fields and sizes a Deployment's pod carries
(managedFields, env, probes, volumes, status), about 5 KB serialized."""

from __future__ import annotations

import random
from typing import Any


def make_pod(i: int, nodes: int, rng: random.Random) -> dict[str, Any]:
    ns = f"team-{i % 40}"
    app = f"svc-{i % 300}"
    name = f"{app}-{rng.getrandbits(40):010x}"
    node = f"node-{i % nodes:05d}"
    cpu = rng.choice(["50m", "100m", "250m", "500m", "1", "2"])

    def ctr(cname: str, req: str, lim: str | None) -> dict[str, Any]:
        res: dict[str, Any] = {"requests": {"cpu": req, "memory": "256Mi"}}
        if lim:
            res["limits"] = {"cpu": lim, "memory": "512Mi"}
        return {
            "name": cname,
            "image": f"registry.example.com/{app}/{cname}:v1.{i % 50}.0",
            "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
            "env": [{"name": f"ENV_{k}", "value": f"value-{k}-{i % 7}"} for k in range(8)],
            "resources": res,
            "volumeMounts": [
                {"mountPath": "/etc/config", "name": "config", "readOnly": True},
                {
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    "name": "kube-api-access",
                    "readOnly": True,
                },
            ],
            "livenessProbe": {
                "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
                "periodSeconds": 10,
                "timeoutSeconds": 1,
                "successThreshold": 1,
                "failureThreshold": 3,
            },
            "readinessProbe": {
                "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
                "periodSeconds": 5,
                "timeoutSeconds": 1,
                "successThreshold": 1,
                "failureThreshold": 3,
            },
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent",
        }

    ts = "2026-11-29T06:00:00Z"
    containers = [ctr("app", cpu, None if i % 3 else cpu), ctr("sidecar", "50m", "100m")]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"{rng.getrandbits(128):032x}",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": ts,
            "generateName": f"{app}-",
            "labels": {
                "app": app,
                "pod-template-hash": f"{rng.getrandbits(32):08x}",
                "team": ns,
                "app.kubernetes.io/part-of": "shop",
                "version": f"v1.{i % 50}",
            },
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": ts,
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-abc",
                    "uid": "u" * 36,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": ts,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:app": {}}, "f:ownerReferences": {".": {}}},
                        "f:spec": {
                            "f:containers": {
                                'k:{"name":"app"}': {
                                    ".": {},
                                    "f:image": {},
                                    "f:name": {},
                                    "f:resources": {
                                        ".": {},
                                        "f:limits": {".": {}, "f:cpu": {}, "f:memory": {}},
                                        "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}},
                                    },
                                }
                            }
                        },
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": ts,
                    "fieldsType": "FieldsV1",
                    "subresource": "status",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}}},
                },
            ],
        },
        "spec": {
            "containers": containers,
            "volumes": [
                {"name": "config", "configMap": {"name": f"{app}-config", "defaultMode": 420}},
                {
                    "name": "kube-api-access",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}],
                    },
                },
            ],
            "nodeName": node,
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "priority": 0,
            "tolerations": [
                {
                    "effect": "NoExecute",
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "tolerationSeconds": 300,
                }
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "Burstable",
            "hostIP": "10.0.0.1",
            "podIP": f"10.1.{i % 250}.{i % 200}",
            "startTime": ts,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": ts}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "image": f"registry.example.com/{app}/{c['name']}:v1",
                    "imageID": f"registry.example.com/{app}/{c['name']}@sha256:{'ab' * 32}",
                    "containerID": f"containerd://{'cd' * 32}",
                    "state": {"running": {"startedAt": ts}},
                    "allocatedResources": c["resources"]["requests"],
                    # what the kubelet reports applied: the spec's resources, limits included
                    "resources": c["resources"],
                }
                for c in containers
            ],
        },
    }
