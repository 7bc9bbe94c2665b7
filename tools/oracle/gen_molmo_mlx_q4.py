"""The MLX community 4-bit form of the tiny Molmo (v1): tests/fixtures/molmo_mlx_q4, made by mlx-vlm's own converter,
with mlx-vlm on mlx-cpu as the reference.

The checkpoint is what `mlx_vlm.convert('<base>', mlx_path=..., quantize=True, q_group_size=64, q_bits=4,
dtype='float32')` writes for tests/fixtures/molmo's checkpoint files (<base>: config.json, model.safetensors,
preprocessor_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja; no goldens, inputs or
provenance, which the converter would copy), run offline on the local directory, exactly as gen_molmo_mlx.py makes
the dense tests/fixtures/molmo_mlx but quantized: model.safetensors under mlx-vlm's key names
(model.transformer.* -> language_model.model.*, model.vision_backbone.* -> vision_tower.*), each quantized Linear as
a U32 `weight` of packed codes beside f32 `scales` and `biases`, config.json with mlx-vlm's `quantization` block
(and its `quantization_config` copy), the processor files and the model card. Group 64, which divides every decoder
Linear's input size (d_model 64, ff_out's 128).

mlx-vlm's default predicate (skip_multimodal_module) leaves everything under vision_tower dense; the decoder's block
Linears and the LM head (ff_out, weight_tying false) are quantized; Molmo's own `wte` embedding (raw arrays, not an
nn.Embedding, so no to_quantized) stays dense. The script checks this against the base tensor by tensor (every
quantized weight dequantizes within one step of its group's scale of the base's, every dense tensor equals the
base's, every base tensor is covered) and records the lists in the provenance notes. The goldens come from mlx-vlm
loading the written fixture, for molmo's variants long, text_only and image_jpeg, recorded exactly as gen_molmo.py
records them. molmo's `image` variant is left out (see LEFT_OUT): on the 4-bit weights its 16th greedy step's
top-1/top-2 gap is below common.MIN_GREEDY_MARGIN, and the base fixture's prompts are not changed for it."""

import json
import shutil
import tempfile
from pathlib import Path

import common
import gen_mlx_quant
import gen_molmo
import gen_molmo_mlx
import mlx.core as mx
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

NAME = "molmo_mlx_q4"
BITS = 4
GROUP = 64
MODE = "affine"
# What the default predicate is expected to quantize (module paths, layer index as N) and what must stay dense.
EXPECT_QUANTIZED = ["language_model.model.blocks.N.att_proj", "language_model.model.blocks.N.attn_out",
                    "language_model.model.blocks.N.ff_out", "language_model.model.blocks.N.ff_proj",
                    "language_model.model.ff_out"]

# The provenance notes: main() sets the fixed ones, build() (on the staged directory in --check too) inserts what
# its cross-check found after the first.
NOTES: list[str] = []
# molmo's variants this fixture leaves out, and why: its greedy path on the 4-bit weights has a top-1/top-2 gap below
# common.MIN_GREEDY_MARGIN (the base fixture's prompts are not changed for it). Each run re-runs it and requires the
# guard still to fail, so the variant comes back when it would pass.
LEFT_OUT = {"image": 15}  # variant -> the greedy step whose margin is below the guard


def pattern(path: str) -> str:
    return ".".join("N" if p.isdigit() else p for p in path.split("."))


def build(out: Path) -> None:
    from mlx_vlm import convert

    base = common.FIXTURES / gen_molmo_mlx.BASE
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "molmo"
        src.mkdir()
        for name in gen_molmo_mlx.BASE_FILES:
            shutil.copyfile(base / name, src / name)
        out.rmdir()  # mlx_vlm.convert writes into a fresh directory
        convert(str(src), mlx_path=str(out), quantize=True, q_group_size=GROUP, q_bits=BITS, dtype="float32")
    leftovers = [p.name for p in out.iterdir() if p.is_dir() or p.name == "provenance.json"]
    assert not leftovers, leftovers
    card = (out / "README.md").read_text()
    assert len(card) < 200 and "/" not in card.replace("image-text-to-text", ""), card
    NOTES[1:1] = cross_check(out, base)  # after the conversion note
    gen_molmo.write_inputs(out)


def cross_check(out: Path, base: Path) -> list[str]:
    """The quantized checkpoint against the base by key: quantized modules within one quantization step, dense
    tensors equal, every base tensor covered, the config the base's plus the quantization block. Returns notes."""
    config = json.loads((out / "config.json").read_text())
    quant = config["quantization"]
    if quant != {"group_size": GROUP, "bits": BITS, "mode": MODE}:
        raise RuntimeError(f"quantization block {quant}")
    extra = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    if extra != json.loads((base / "config.json").read_text()):
        raise RuntimeError("mlx_vlm.convert changed config.json beyond adding the quantization block")
    qc = config.get("quantization_config")
    q = mx.load(str(out / "model.safetensors"))
    ref = {gen_molmo_mlx.mlx_key(k): v for k, v in load_file(str(base / "model.safetensors")).items()}
    covered: set[str] = set()
    quantized, worst, worst_ratio, hand_diff = [], (0.0, "-"), (0.0, "-"), 0.0
    for key in sorted(k for k in q if k.endswith(".scales")):
        path = key.removesuffix(".scales")
        p = gen_mlx_quant.module_params(quant, path)
        w, s, b = q[f"{path}.weight"], q[f"{path}.scales"], q[f"{path}.biases"]
        assert w.dtype == mx.uint32 and s.dtype == mx.float32 and b.dtype == mx.float32, path
        deq = np.array(mx.dequantize(w, s, b, group_size=p["group_size"], bits=p["bits"], mode=MODE))
        r = ref[f"{path}.weight"]
        covered.add(f"{path}.weight")
        assert deq.shape == r.shape and s.shape[-1] * p["group_size"] == r.shape[-1], path
        scales = np.repeat(np.array(s), p["group_size"], axis=-1)
        biases = np.repeat(np.array(b), p["group_size"], axis=-1)
        err = np.abs(deq - r)
        ratio = float((err / np.abs(scales)).max())
        if ratio > 1.0 + 1e-5:
            raise RuntimeError(f"{path}: dequantized weight {ratio:.3g} scales from the base's")
        worst = max(worst, (float(err.max()), path))
        worst_ratio = max(worst_ratio, (ratio, path))
        codes = gen_mlx_quant.unpack(np.array(w), p["bits"]).astype(np.float32)
        hand_diff = max(hand_diff, float(np.abs(codes * scales + biases - deq).max()))
        quantized.append(path)
    dense = []
    for key in sorted(q):
        if key.endswith((".scales", ".biases")) and key.rsplit(".", 1)[0] in quantized:
            continue
        if key.endswith(".weight") and key.removesuffix(".weight") in quantized:
            continue
        v = np.array(q[key])
        if q[key].dtype != mx.float32 or key not in ref or v.shape != ref[key].shape or not np.array_equal(v, ref[key]):
            raise RuntimeError(f"dense {key} is not the base's tensor")
        covered.add(key)
        dense.append(key)
    missing = sorted(set(ref) - covered)
    if missing:
        raise RuntimeError(f"base tensors with no counterpart: {missing}")
    mods = sorted({pattern(p) for p in quantized})
    if mods != EXPECT_QUANTIZED:
        raise RuntimeError(f"quantized modules {mods}, expected {EXPECT_QUANTIZED}")
    if any(p.startswith("vision_tower") for p in quantized) or "language_model.model.wte.embedding" not in dense:
        raise RuntimeError("vision tower quantized or wte not dense")
    with safe_open(str(out / "model.safetensors"), "np") as f:
        assert f.metadata() == {"format": "mlx"}, f.metadata()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(q) and set(index["weight_map"].values()) == {"model.safetensors"}
    dense_lm = [k for k in dense if k.startswith("language_model")]
    dense_vis = sorted({pattern(k) for k in dense if k.startswith("vision_tower")})
    return [
        f"quantization (config.json): {json.dumps(quant, sort_keys=True)}"
        + (f", and quantization_config {json.dumps(qc, sort_keys=True)}" if qc is not None else ", no quantization_config")
        + "; affine, 4 bits, group 64 for every quantized module, no per-module entries; otherwise config.json has "
        "tests/fixtures/molmo's content (checked)",
        f"quantized ({len(quantized)} modules, U32 weight of packed codes, 8 a word least significant bits first, "
        f"f32 scales and biases [out, in / {GROUP}]): " + ", ".join(quantized),
        f"dense (f32, equal to the base's): language model: {', '.join(dense_lm)} (att_proj.bias: the f32 bias of "
        "the quantized att_proj; wte is Molmo's own Embedding module of raw arrays, no to_quantized; norms are not "
        "Linears); vision tower (skip_multimodal_module: any path "
        f"containing 'vision_tower'), {sum(k.startswith('vision_tower') for k in dense)} tensors: " + ", ".join(dense_vis),
        f"weights cross-check against tests/fixtures/molmo by key (every base tensor covered, renames "
        "model.transformer.* -> language_model.model.*, model.vision_backbone.* -> vision_tower.*, no layout change): "
        f"the quantized weights dequantize (mx.dequantize) within one step of their group's scale of the base weight "
        f"(max {worst_ratio[0]:.4g} scales at {worst_ratio[1]}; max abs {worst[0]:.4g} at {worst[1]}); numpy by hand "
        "(q * scale + bias in f32) is "
        + ("bit-identical to mx.dequantize" if hand_diff == 0.0 else f"{hand_diff:.3g} from mx.dequantize")
        + f"; {len(dense)} dense tensors equal the base's exactly",
    ]


def run_variant(model, processor, fixture: Path, v: common.Variant) -> common.Golden:
    """gen_molmo.run_variant; before the first variant, each left-out variant is run again (guard off) to confirm
    its margin is still below the guard, and the margins go into the notes."""
    if not getattr(run_variant, "probed", False):
        run_variant.probed = True
        for skip in gen_molmo.variants():
            if skip.name not in LEFT_OUT:
                continue
            guard, common.MIN_GREEDY_MARGIN = common.MIN_GREEDY_MARGIN, -1.0
            try:
                g = gen_molmo.run_variant(model, processor, fixture, skip)
            finally:
                common.MIN_GREEDY_MARGIN = guard
            m = g.tensors["greedy_margins"].numpy()
            step = int(m.argmin())
            if m.min() >= guard or step != LEFT_OUT[skip.name]:
                raise RuntimeError(f"{skip.name}: min greedy margin {m.min():.3g} at step {step}: update LEFT_OUT")
            NOTES.append(
                f"variant {skip.name} ({skip.description}, molmo's prompt) left out: on the 4-bit weights its greedy "
                f"path's top-1/top-2 gap at step {step} of {len(m)} is {m.min():.3g}, below common.MIN_GREEDY_MARGIN "
                f"{guard:g} (next smallest {np.sort(m)[1]:.3g}); the base fixture's prompts are kept, and image_jpeg "
                "(the same wide picture through a JPEG) covers the image path; each run re-checks that the margin "
                "is still below the guard")
    return gen_molmo.run_variant(model, processor, fixture, v)


def main() -> None:
    args = common.parse_args(__doc__)
    NOTES[:] = [
        f"MLX community 4-bit form: what mlx_vlm.convert('<base>', mlx_path='tests/fixtures/{NAME}', quantize=True, "
        f"q_group_size={GROUP}, q_bits={BITS}, dtype='float32') writes (everything else mlx-vlm's default, "
        "quant_predicate None: skip_multimodal_module), run offline on a directory holding tests/fixtures/molmo's "
        + ", ".join(gen_molmo_mlx.BASE_FILES),
        "processor files as mlx-vlm's MolmoProcessor.save_pretrained writes them (as in tests/fixtures/molmo_mlx); "
        "README.md is mlx-vlm's model card (front matter only); the images in inputs/ are molmo's",
        "transformers has no Molmo v1; mlx-vlm is the reference and there is no second implementation",
        "mlx-vlm's Molmo processor takes one image per prompt: no two-image variant",
        gen_molmo.NOTES[-1],
    ]
    common.mlx_fixture(
        NAME, "gen_molmo_mlx_q4.py", build, gen_molmo.load_processor, run_variant,
        [v for v in gen_molmo.variants() if v.name not in LEFT_OUT],
        check=args.check, reference="mlx-vlm Molmo (models/molmo) on mlx-cpu, fp32 compute over the 4-bit weights; "
        "mlx-vlm MolmoProcessor",
        notes=NOTES,
    )


if __name__ == "__main__":
    main()
