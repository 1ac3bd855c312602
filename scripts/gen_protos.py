"""Regenerate the Python stubs of the wire contract.

    python scripts/gen_protos.py            # write client/_proto/
    python scripts/gen_protos.py --check    # exit 1 if the committed stubs differ

Needs grpcio-tools (the `dev` extra), pinned to the grpcio release the package depends on.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_PKG = Path("gradwire/_proto")
OUT = ROOT / "client" / "_proto"
GENERATED = ("worker_pb2.py", "worker_pb2.pyi", "worker_pb2_grpc.py")


def generate(dest: Path) -> None:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        protos = sorted(
            str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PROTO_PKG).glob("*.proto")
        )
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        dest.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(Path(tmp) / PROTO_PKG / name, dest / name)
    init = dest / "__init__.py"
    init.write_text('"""Generated stubs of protos/gradwire/_proto/worker.proto. Do not edit."""\n')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed stubs are stale")
    ns = parser.parse_args()
    if not ns.check:
        generate(OUT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        stale = [
            n
            for n in (*GENERATED, "__init__.py")
            if not (OUT / n).exists() or not filecmp.cmp(fresh / n, OUT / n, shallow=False)
        ]
    if stale:
        print(
            f"stale generated stubs in client/_proto: {', '.join(stale)}; run python scripts/gen_protos.py"
        )
        return 1
    print("generated stubs are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
