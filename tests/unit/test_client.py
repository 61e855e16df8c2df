"""The raw-JSON client's pieces that need no server."""

from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.watch.watch import iter_resp_lines

from headroom.cluster.client import object_path, split_lines


class _Stream:
    def __init__(self, chunks):
        self.chunks = chunks

    def stream(self, amt=None, decode_content=False):
        yield from self.chunks


@given(st.lists(st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\r", b"")), max_size=30))
def test_split_lines_matches_the_clients_reference(chunks):
    ours = [line.decode("utf-8", errors="replace") for line in split_lines(chunks)]
    reference = [line for line in iter_resp_lines(_Stream(chunks)) if line.strip()]
    # the client drops an unterminated last line; a watch stream always ends its events with \n
    complete = b"".join(chunks)
    if complete and not complete.endswith(b"\n") and complete.rsplit(b"\n", 1)[-1].strip():
        ours = ours[:-1]
    assert [line for line in ours if line.strip()] == reference


@pytest.mark.parametrize(
    "obj,path",
    [
        (
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"}},
            "/api/v1/namespaces/a/pods/p",
        ),
        ({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}, "/api/v1/nodes/n"),
        (
            {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}},
            "/apis/kube-headroom.dev/v1alpha1/headroomconfigs/cluster",
        ),
    ],
)
def test_object_paths(obj, path):
    assert object_path(obj) == path


def test_credentials_are_read_once_per_window_and_again_after_a_401(tmp_path, monkeypatch):
    from headroom.cluster import client as client_module
    from headroom.cluster.client import Api, ApiError, connect

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n"
        "    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: first\n"
        "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
    )
    api = Api(connect(str(kubeconfig)))
    asked, sent, status = [], [], [200]

    class Resp:
        data = b"{}"
        headers: ClassVar[dict[str, str]] = {}
        reason = "Unauthorized"

        @property
        def status(self):
            return status[0]

    class Answer:
        response = Resp()

    real = api.client.configuration.auth_settings
    api.client.configuration.auth_settings = lambda: (asked.append(1), real())[1]
    api.client.call_api = lambda *a, **kw: (sent.append(kw["header_params"].get("authorization")), Answer())[1]
    clock = [1000.0]
    monkeypatch.setattr(client_module.time, "monotonic", lambda: clock[0])
    for _ in range(5):
        api.get("/x")
    assert len(asked) == 1 and sent == ["Bearer first"] * 5  # once, not per request
    clock[0] += client_module.AUTH_REFRESH + 1
    api.get("/x")
    assert len(asked) == 2  # the window passed: asked again (a rotated token is picked up)
    status[0] = 401
    with pytest.raises(ApiError):
        api.get("/x")
    status[0] = 200
    api.get("/x")
    assert len(asked) == 3  # a 401 makes the next request ask the client again
