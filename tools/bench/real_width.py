#!/usr/bin/env python3
"""Goldens for a shape-real Qwen2-VL checkpoint, so `plugins verify` can hold a compute mode to transformers at real
widths: the tiny fixtures' sums are a few dozen terms long, a real model's thousands.

Makes OUT a fixture directory: symlinks to the checkpoint's files, the bench's 448x448 synthetic picture as
inputs/synthetic.png, and goldens/image.{safetensors,json} for "Describe this image." with that picture (311 prompt
rows), every stage recorded by tools/oracle's reference_goldens with transformers' eager attention in --dtype. The
checkpoint's weights are random, so its logits tie: the greedy tokens are recorded as transformers' cached
`generate` picks them (`stages_only`), and only the stages are the golden:

    $PY tools/bench/real_width.py --model ~/.cache/mlxcel/bench/qwen2vl-2b-bf16-L28-V32 --out /tmp/real-width
    mlxcel-host plugins verify target/plugins/qwen2_vl.toml --fixture /tmp/real-width --compute bf16 --allow-unqualified
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "oracle"))

import common  # noqa: E402
import gen_qwen2_vl  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForImageTextToText  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a Qwen2-VL checkpoint directory")
    ap.add_argument("--out", type=Path, required=True, help="the fixture directory to make (must not exist)")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16", help="what transformers computes in")
    args = ap.parse_args()

    out = args.out
    out.mkdir(parents=True)
    for f in sorted(args.model.iterdir()):
        if f.is_file() and f.name != "bench-checkpoint.json":
            (out / f.name).symlink_to(f.resolve())
    (out / "goldens").mkdir()
    picture = common.save_image(common.synthetic_image(448, 448), out, "synthetic")

    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    model = AutoModelForImageTextToText.from_pretrained(out, attn_implementation="eager", dtype=dtype).eval()
    processor, backend = common.load_processor(out)
    variant = common.Variant("image", "the bench's 448x448 synthetic picture",
                             [("image", "synthetic"), "Describe this image."])
    messages = variant.messages()
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    images = [common.load_image(out, picture)]
    inputs = dict(processor(text=[prompt], return_tensors="pt", images=images))
    keys = tuple(k for k in sorted(inputs) if k not in ("input_ids", "attention_mask"))
    g = common.reference_goldens(
        model, model.model.language_model, inputs,
        layer_types=getattr(model.config.get_text_config(), "layer_types", None),
        encoder=lambda x: gen_qwen2_vl.encoder(model, x), processor_keys=keys, position_rows=3, stages_only=True,
    )
    for k in keys:
        g.put(k, inputs[k])
    g.meta.update(messages=messages, prompt=prompt, processor_outputs=list(keys), images=[picture],
                  image_backend=backend, image_sizes=[list(im.size) for im in images])
    gen_qwen2_vl.record_rope_delta(model, inputs, g)
    common.write_golden(out, variant.name, g, False)
    common.write_provenance(out, "../bench/real_width.py",
                            f"transformers {type(model).__name__}, CPU torch, {args.dtype}, eager attention, "
                            f"on {args.model}", {variant.name: variant.description}, False,
                            dtype=str(dtype).removeprefix("torch."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
