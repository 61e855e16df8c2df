"""Every label, annotation and name the project puts on cluster objects, from one prefix."""

from typing import Final

GROUP: Final = "kube-headroom.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

MODE_KEY: Final = f"{GROUP}/mode"  # namespace label / pod label or annotation
MODE_MANAGED: Final = "managed"
MODE_UNMANAGED: Final = "unmanaged"
MAX_CPU_KEY: Final = f"{GROUP}/max-cpu"
STATUS_KEY: Final = f"{GROUP}/status"
# The CPU limits a pod had before Headroom first wrote one, for `spec.release: Restore`.
ORIGINAL_KEY: Final = f"{GROUP}/original-cpu-limits"
# On a pod: a new value hands back to Headroom a CPU limit it left to another writer.
RECLAIM_KEY: Final = f"{GROUP}/reclaim-limit"
# A node label saying the kubelet runs the static CPU manager policy (the default of
# HeadroomConfig spec.staticCPUManagerNodeSelector: `<this>=static`).
STATIC_CPU_LABEL: Final = f"{GROUP}/cpu-manager-policy"

FIELD_MANAGER: Final = "headroom"
POLICY_NAME: Final = "proportional-v1"
SINGLETON_NAME: Final = "cluster"

CONFIG_KIND: Final = "HeadroomConfig"
PROFILE_KIND: Final = "NodePoolProfile"
CONFIG_PLURAL: Final = "headroomconfigs"
PROFILE_PLURAL: Final = "nodepoolprofiles"
# Where the API server serves what the controller reads: one spelling for every caller.
CONFIG_PATH: Final = f"/apis/{API_VERSION}/{CONFIG_PLURAL}"
PROFILE_PATH: Final = f"/apis/{API_VERSION}/{PROFILE_PLURAL}"
PODS_PATH: Final = "/api/v1/pods"
NODES_PATH: Final = "/api/v1/nodes"
NAMESPACES_PATH: Final = "/api/v1/namespaces"
LIMIT_RANGE_PATH: Final = "/api/v1/limitranges"
QUOTA_PATH: Final = "/api/v1/resourcequotas"
VPA_PATH: Final = "/apis/autoscaling.k8s.io/v1/verticalpodautoscalers"

# The gate that makes pod-level `spec.resources` resizable in place (KEP-5419).
POD_LEVEL_RESIZE_FEATURE: Final = "InPlacePodLevelResourcesVerticalScaling"
