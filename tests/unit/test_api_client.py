"""The raw-JSON client's pieces that need no server."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.watch.watch import iter_resp_lines

from headroom.cluster.api import object_path, split_lines


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
