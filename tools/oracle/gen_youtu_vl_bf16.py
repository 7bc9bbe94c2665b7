"""The bf16 form of the tiny Youtu-VL: tests/fixtures/youtu_vl_bf16, with mlx-vlm on mlx-cpu as the reference.

As gen_bf16.py does for the transformers families (and gen_molmo_bf16.py for Molmo): tests/fixtures/youtu_vl's
checkpoint with every float tensor rounded once to bf16 (round to nearest even) and stored so, under the same
Hugging Face names (siglip2.vision_model.*, merger.*, model.*, the fused kv_b_proj) and with the same safetensors
metadata ({"format": "pt"}); config.json is youtu_vl's with `torch_dtype: bfloat16` added at the top level
(transformers 4's spelling, which remote-code checkpoints and tools/bench/gen_ckpt.py's Youtu-VL write; mlx-vlm
ignores it); the tokenizer, chat template and images (the PNGs and the client-encoded JPEG, WebP and EXIF-rotated
JPEG) are youtu_vl's byte for byte.

The reference is mlx-vlm's load_model on the written fixture (it keeps the stored bf16, checked), with every
parameter then widened to f32 (exact; checked) and everything computed in f32: bf16 storage with f32 compute. Every
golden is recomputed stage by stage for youtu_vl's seven variants (image, two_images, text_only, long, image_jpeg,
image_webp, image_jpeg_exif), exactly as gen_youtu_vl.py records them, pixel_values from the same stand-in
preprocessing."""

import json
import shutil

import common
import gen_youtu_vl
import mlx.core as mx
import torch
from mlx.utils import tree_flatten
from safetensors.torch import load_file, save_file

BASE = "youtu_vl"
# Checkpoint files copied from the base fixture byte for byte (config.json is rewritten with its dtype).
SAME_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def build(out) -> None:
    base = common.FIXTURES / BASE
    weights = load_file(str(base / "model.safetensors"))
    rounded = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()}
    save_file(dict(sorted(rounded.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((base / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_bytes(common.json_bytes(config))
    for name in SAME_FILES:
        shutil.copyfile(base / name, out / name)
    gen_youtu_vl.write_inputs(out)
    for p in sorted((base / "inputs").iterdir()):
        if (out / "inputs" / p.name).read_bytes() != p.read_bytes():
            raise RuntimeError(f"inputs/{p.name} differs from tests/fixtures/{BASE}'s")


def dtypes(model) -> set:
    return {p.dtype for _, p in tree_flatten(model.parameters())}


_WIDENED: set[int] = set()


def run_variant(model, tok, fixture, v: common.Variant) -> common.Golden:
    """gen_youtu_vl's stages, with the stored bf16 weights widened to f32 first (once)."""
    if id(model) not in _WIDENED:
        if dtypes(model) != {mx.bfloat16}:
            raise RuntimeError(f"mlx-vlm loaded the bf16 checkpoint as {dtypes(model)}, not as stored")
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        if dtypes(model) != {mx.float32}:
            raise RuntimeError(f"widening left parameters in {dtypes(model)}")
        _WIDENED.add(id(model))
    return gen_youtu_vl.run_variant(model, tok, fixture, v)


def main() -> None:
    args = common.parse_args(__doc__)
    common.mlx_fixture(
        "youtu_vl_bf16", "gen_youtu_vl_bf16.py", build, gen_youtu_vl.load_tokenizer, run_variant,
        gen_youtu_vl.variants(), check=args.check,
        reference="mlx-vlm YoutuVL (models/youtu_vl) on mlx-cpu, fp32 on bfloat16 weights; stand-in preprocessing",
        notes=["bf16 storage, f32 compute: tests/fixtures/youtu_vl's weights rounded once to bf16 (round to nearest "
               "even) and stored so; mlx-vlm's load_model keeps them bf16 (checked) and the reference widens every "
               "parameter to f32 (exact) before running (model.set_dtype(mx.float32), checked)",
               "made from tests/fixtures/youtu_vl: the same Hugging Face weight names and safetensors metadata; "
               "config.json is youtu_vl's with torch_dtype: bfloat16 added; tokenizer, chat template and images byte "
               "for byte youtu_vl's",
               *gen_youtu_vl.NOTES],
    )


if __name__ == "__main__":
    main()
