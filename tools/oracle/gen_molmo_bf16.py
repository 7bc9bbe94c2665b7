"""The bf16 form of the tiny Molmo (v1): tests/fixtures/molmo_bf16, with mlx-vlm on mlx-cpu as the reference.

As gen_bf16.py does for the transformers families: tests/fixtures/molmo's checkpoint with every float tensor rounded
once to bf16 (round to nearest even) and stored so, under the same allenai names (model.transformer.*,
model.vision_backbone.*) and with the same safetensors metadata ({"format": "mlx"}); config.json is molmo's with
`torch_dtype: bfloat16` added at the top level (the key allenai's checkpoints and mlx_vlm.convert read); the
preprocessor config, tokenizer, chat template and images are molmo's byte for byte.

The reference is mlx-vlm's load_model on the written fixture (it keeps the stored bf16), with every parameter then
widened to f32 (exact) and everything computed in f32: bf16 storage with f32 compute. Every golden is recomputed
stage by stage, for molmo's variants (image, long, text_only, image_jpeg), exactly as gen_molmo.py records them."""

import json
import shutil

import common
import gen_molmo
import mlx.core as mx
import torch
from mlx.utils import tree_flatten
from safetensors.torch import load_file, save_file

BASE = "molmo"
# Checkpoint files copied from the base fixture byte for byte (config.json is rewritten with its dtype).
SAME_FILES = ["preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def build(out) -> None:
    base = common.FIXTURES / BASE
    weights = load_file(str(base / "model.safetensors"))
    rounded = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()}
    save_file(dict(sorted(rounded.items())), str(out / "model.safetensors"), metadata={"format": "mlx"})
    config = json.loads((base / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_bytes(common.json_bytes(config))
    for name in SAME_FILES:
        shutil.copyfile(base / name, out / name)
    gen_molmo.write_inputs(out)


_WIDENED: set[int] = set()


def run_variant(model, processor, fixture, v: common.Variant) -> common.Golden:
    """gen_molmo's stages, with the stored bf16 weights widened to f32 first (once)."""
    if id(model) not in _WIDENED:
        dtypes = {p.dtype for _, p in tree_flatten(model.parameters())}
        if dtypes != {mx.bfloat16}:
            raise RuntimeError(f"mlx-vlm loaded the bf16 checkpoint as {dtypes}, not as stored")
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        _WIDENED.add(id(model))
    return gen_molmo.run_variant(model, processor, fixture, v)


def main() -> None:
    args = common.parse_args(__doc__)
    common.mlx_fixture(
        "molmo_bf16", "gen_molmo_bf16.py", build, gen_molmo.load_processor, run_variant, gen_molmo.variants(),
        check=args.check,
        reference="mlx-vlm Molmo (models/molmo) on mlx-cpu, fp32 on bfloat16 weights; mlx-vlm MolmoProcessor",
        notes=["bf16 storage, f32 compute: tests/fixtures/molmo's weights rounded once to bf16 (round to nearest "
               "even) and stored so; mlx-vlm's load_model keeps them bf16 and the reference widens every parameter "
               "to f32 (exact) before running (model.set_dtype(mx.float32))",
               "made from tests/fixtures/molmo: the same allenai weight names and safetensors metadata; config.json "
               "is molmo's with torch_dtype: bfloat16 added; preprocessor config, tokenizer, chat template and "
               "images byte for byte molmo's",
               *gen_molmo.NOTES],
    )


if __name__ == "__main__":
    main()
